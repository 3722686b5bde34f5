"""The directory beyond one subnet, on a real etcd: gateways and sidecars register with --etcd, clients that
name a stream resolve it there (or in a static file), follow a sidecar or ingest that moves, refuse forged
entries, and say clearly when etcd is not there. Real processes on loopback (etcd and ZEPS are TCP)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.etcd import EtcdProcess
from support.servers import STREAM, GatewayProcess, free_port, journal_records, start_sidecar

from gateway.client.async_subscriber import AsyncSubscriber
from gateway.client.etcd_directory import EtcdDirectory
from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.discovery.registrar import DEFAULT_TTL_S, Registrar
from gateway.errors import DiscoveryError
from gateway.transport.etcd import Etcd
from gateway.wire import announce as A
from gateway.wire.streamkey import StreamKey

pytestmark = pytest.mark.timeout(120)

COUNT = 500
WAIT_S = 20.0


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    server = EtcdProcess(tmp_path).start()
    yield server
    server.kill()


@pytest.fixture
def key(tmp_path: Path) -> tuple[StreamKey, Path]:
    stream_key = StreamKey.generate()
    stream_key.save(tmp_path / "stream.key")
    return stream_key, tmp_path / "stream.key"


def wait_for(what: Callable[[], object], timeout_s: float = WAIT_S) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := what():
            return result
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s")


def entries(etcd: EtcdProcess, stream: str = STREAM) -> dict[str, bytes]:
    return {e.key: e.value for e in Etcd(etcd.url).get_prefix(f"{A.ETCD_PREFIX}{stream}/")}


def zeps(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def killable_sidecar(journal: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """`zeps replay` on a free port, for a test that kills it; (process, endpoint) once it serves."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "replay", "--journal", str(journal), "--bind",
                             endpoint, *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    assert proc.stdout is not None and endpoint in proc.stdout.readline().decode()
    return proc, endpoint


def publish(pub: Publisher, first: int, last: int) -> None:
    for i in range(first, last + 1):
        pub.publish(f"k{i}", f"r{i:06d}".encode())
    pub.flush()


def receive(sub: Subscriber, n: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < n and time.monotonic() < deadline:
        rec = sub.next(timeout=0.2)
        if rec is not None:
            got.append(rec.body)
    return got


def bodies(first: int, last: int) -> list[bytes]:
    return [f"r{i:06d}".encode() for i in range(first, last + 1)]


def test_registered_gateway_and_sidecar_serve_clients_that_name_the_stream(
    etcd: EtcdProcess, key: tuple[StreamKey, Path], tmp_path: Path
) -> None:
    stream_key, key_file = key
    journal = tmp_path / "journal"
    gateway = GatewayProcess(journal, "--etcd", etcd.url, "--stream-key", str(key_file))  # --node too: an HA node
    try:
        with start_sidecar(journal, "--etcd", etcd.url, "--stream-key", str(key_file), "--node", "sc1") as sidecar:
            found = wait_for(lambda: len(entries(etcd)) == 2 and entries(etcd))
            assert isinstance(found, dict)
            by_role = {k.rsplit("/", 1)[1].split(".")[0]: A.decode(v, [stream_key]) for k, v in found.items()}
            assert by_role["gateway"].ingest == gateway.ingest and by_role["gateway"].node == socket.gethostname()
            assert by_role["sidecar"].sidecar == sidecar.endpoint

            with (
                EtcdDirectory([etcd.url], keys=[stream_key]) as directory,
                Publisher(None, STREAM, directory=directory, confirm=True) as pub,
            ):
                assert pub.endpoint == gateway.ingest
                publish(pub, 1, COUNT)
            dead = f"http://127.0.0.1:{free_port()}"  # a cluster member that is down: the next one answers
            with (
                EtcdDirectory([dead, etcd.url], keys=[stream_key]) as directory,
                Subscriber(STREAM, directory=directory, start="earliest", stream_key=stream_key) as sub,
            ):
                assert receive(sub, COUNT) == bodies(1, COUNT)
                assert sub.replay_endpoint == sidecar.endpoint
            cli = zeps("subscribe", "--etcd", etcd.url, "--stream", STREAM, "--from", "earliest", "--count",
                       str(COUNT), "--stream-key", str(key_file), "--timeout", "15")  # fmt: skip
            assert cli.returncode == 0, cli.stderr
            printed = [json.loads(line) for line in cli.stdout.splitlines()]
            assert [row["seq"] for row in printed] == list(range(1, COUNT + 1))
            assert [base64.b64decode(row["body_b64"]) for row in printed] == bodies(1, COUNT)
            more = zeps("publish", "--etcd", f"{dead},{etcd.url}", "--stream", STREAM, "--count", "10",
                        "--stream-key", str(key_file))  # fmt: skip
            assert more.returncode == 0, more.stderr
            assert len(journal_records(journal)) == COUNT + 10
            listing = zeps("streams", "--etcd", etcd.url, "--json", "--stream-key", str(key_file))
            assert listing.returncode == 0, listing.stderr
            rows = {row["stream"]: row for row in map(json.loads, listing.stdout.splitlines())}
            assert set(rows) == {STREAM, "other"}
            assert rows[STREAM]["ingest"] == gateway.ingest and rows[STREAM]["sidecar"] == sidecar.endpoint
    finally:
        gateway.stop()
    assert entries(etcd) == {}, "a gateway and sidecar that stop cleanly revoke their lease: entries go at once"


def test_forged_unsigned_and_misplaced_entries_are_ignored_with_a_stream_key(
    etcd: EtcdProcess, key: tuple[StreamKey, Path]
) -> None:
    stream_key, _ = key
    client = Etcd(etcd.url)

    def put(stream: str, sidecar: str, signer: StreamKey | None, named: str | None = None) -> None:
        ann = A.Announcement(A.SIDECAR, hash(sidecar) & 0xFFFFFFFF, "n", (A.StreamAd(named or stream),),
                             sidecar=sidecar, sent_ns=time.time_ns())  # fmt: skip
        client.put(A.etcd_key(stream, A.SIDECAR, ann.node_id), ann.encode(signer), 0)

    put(STREAM, "tcp://10.0.0.1:5580", stream_key)  # the genuine one, written first
    put(STREAM, "tcp://10.6.6.6:5580", None)  # unsigned, newer: it would be preferred if it were taken
    put(STREAM, "tcp://10.6.6.7:5580", StreamKey.generate())  # signed with another key
    put(STREAM, "tcp://10.6.6.8:5580", stream_key, named="other")  # a genuine entry copied under another stream
    client.put(f"{A.ETCD_PREFIX}{STREAM}/junk", b"not an announcement", 0)
    with EtcdDirectory([etcd.url], keys=[stream_key]) as directory:
        info = directory.wait(STREAM, time.monotonic() + 5, lambda i: bool(i.sidecars))
        assert info.sidecars == ("tcp://10.0.0.1:5580",)
        assert directory.dropped == {"unsigned": 1, "unknown-key": 1, "misplaced": 1, "malformed": 1}
    with EtcdDirectory([etcd.url]) as directory:  # without a key, every well-formed entry counts
        info = directory.wait(STREAM, time.monotonic() + 5, lambda i: len(i.sidecars) == 3)
        assert info.sidecar == "tcp://10.6.6.7:5580"  # the newest


def test_a_killed_gateway_leaves_the_directory_when_its_lease_ends(etcd: EtcdProcess, tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "journal", "--etcd", etcd.url)
    wait_for(lambda: entries(etcd))
    gateway.kill9()
    killed = time.monotonic()
    assert entries(etcd), "nothing revoked the lease: the entry stays until it ends"
    wait_for(lambda: not entries(etcd) and not entries(etcd, "other"), DEFAULT_TTL_S + 5)
    gone_s = time.monotonic() - killed
    assert gone_s <= DEFAULT_TTL_S + 2, gone_s


def test_a_subscriber_follows_a_sidecar_restarted_elsewhere(etcd: EtcdProcess, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    gateway = GatewayProcess(journal, "--etcd", etcd.url)
    directory = EtcdDirectory([etcd.url])
    try:
        with Publisher(gateway.ingest, STREAM, confirm=True) as pub:
            first, first_endpoint = killable_sidecar(journal, "--etcd", etcd.url)
            try:
                sub = Subscriber(STREAM, directory=directory, start="earliest")
                publish(pub, 1, COUNT)
                assert receive(sub, COUNT) == bodies(1, COUNT)
                assert sub.replay_endpoint == first_endpoint
            finally:
                first.kill()  # kill -9: its entry stays until its lease ends
                first.wait(10)
            with start_sidecar(journal, "--etcd", etcd.url) as second:
                assert second.endpoint != first_endpoint
                publish(pub, COUNT + 1, 2 * COUNT)
                assert receive(sub, COUNT) == bodies(COUNT + 1, 2 * COUNT)
                assert sub.replay_endpoint == second.endpoint
                sub.close()
    finally:
        directory.close()
        gateway.stop()


def test_a_publisher_follows_its_gateway_restarted_elsewhere(etcd: EtcdProcess, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    first = GatewayProcess(journal, "--etcd", etcd.url)
    with EtcdDirectory([etcd.url]) as directory:
        pub = Publisher(None, STREAM, directory=directory, confirm=True)
        try:
            publish(pub, 1, COUNT)
            first.stop()  # clean: its entries go at once
            second = GatewayProcess(journal, "--etcd", etcd.url)
            assert second.ingest != first.ingest
            try:
                publish(pub, COUNT + 1, 2 * COUNT)
                assert pub.endpoint == second.ingest
            finally:
                pub.close()
                second.stop()
        finally:
            pub.abort()
    assert [body for _, _, body in journal_records(journal)] == bodies(1, 2 * COUNT)


def test_etcd_down_at_client_start_is_one_clear_line_within_the_deadline(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    cli = zeps("subscribe", "--etcd", url, "--stream", STREAM, "--discovery-timeout", "1")
    took = time.monotonic() - started
    assert cli.returncode == 1, cli.stderr
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "is etcd running there" in lines[0], cli.stderr
    assert took < 10, took  # the deadline (1 s) plus the interpreter's start
    for command in (["publish", "--stream", STREAM, "--count", "1"], ["streams", "--wait", "1"]):
        cli = zeps(*command, "--etcd", url, *(["--discovery-timeout", "1"] if command[0] == "publish" else []))
        assert cli.returncode == 1 and url in cli.stderr, cli.stderr
    bad = zeps("streams", "--etcd", "etcd.example:2379")
    assert bad.returncode == 2 and "http://HOST:PORT" in bad.stderr, bad.stderr


def test_async_subscriber_resolves_without_blocking_the_event_loop(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def main() -> tuple[int, BaseException | None]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.ensure_future(ticker())
        directory = EtcdDirectory([url])
        sub = AsyncSubscriber(STREAM, directory=directory, discovery_timeout=1.0)
        assert sub.state == "resolving"
        failed: BaseException | None = None
        try:
            await sub.next(timeout=5)
        except DiscoveryError as exc:
            failed = exc
        task.cancel()
        directory.close()
        return ticks, failed

    ticks, failed = asyncio.run(main())
    assert isinstance(failed, DiscoveryError) and url in str(failed)
    assert ticks >= 20, f"the loop ran {ticks} times in the 1 s the resolution took: it was blocked"


def test_a_static_directory_file(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    gateway = GatewayProcess(journal)
    try:
        with start_sidecar(journal) as sidecar:
            listing = tmp_path / "streams.toml"
            listing.write_text(
                f'[streams.{STREAM}]\ningest = "{gateway.ingest}"\nsidecar = "{sidecar.endpoint}"\n'
                '[streams.other]\nchannels = ["udp://239.192.1.11:5011"]\n'
            )
            pub = zeps("publish", "--directory", str(listing), "--stream", STREAM, "--count", str(COUNT))
            assert pub.returncode == 0, pub.stderr
            sub = zeps("subscribe", "--directory", str(listing), "--stream", STREAM, "--from", "earliest",
                       "--count", str(COUNT), "--timeout", "15", "--summary-only")  # fmt: skip
            assert sub.returncode == 0, sub.stderr
            assert len(journal_records(journal)) == COUNT
            as_json = tmp_path / "streams.json"
            mirror = {"sidecar": sidecar.endpoint, "copy": "mirror", "source": "tcp://10.1.0.5:5571"}
            as_json.write_text(json.dumps({"streams": {STREAM: mirror}}))
            shown = zeps("streams", "--directory", str(as_json), "--json")
            assert shown.returncode == 0, shown.stderr
            row = json.loads(shown.stdout)
            assert (row["sidecar"], row["copy"], row["source"]) == (sidecar.endpoint, ["mirror"], [mirror["source"]])
    finally:
        gateway.stop()
    for text in (
        '[streams.px]\ningest = "udp://x"\n',
        "[streams.px]\ncolor = 1\n",
        "not toml [",
        '[streams.px]\ncopy = "replica"\n',
    ):
        (tmp_path / "bad.toml").write_text(text)
        bad = zeps("subscribe", "--directory", str(tmp_path / "bad.toml"), "--stream", "px")
        assert bad.returncode == 2 and "bad.toml" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    missing = zeps("subscribe", "--directory", str(tmp_path / "streams.toml"), "--stream", "nope")
    assert missing.returncode == 1 and "not in" in missing.stderr, missing.stderr


def test_a_registrar_whose_lease_was_lost_registers_again(etcd: EtcdProcess) -> None:
    client = Etcd(etcd.url)
    registrar = Registrar([etcd.url], A.GATEWAY, "n1", ingest="tcp://10.0.0.1:5570")
    try:
        registrar.register(time.monotonic(), [A.StreamAd(STREAM), A.StreamAd("other")])
        both = sorted(A.etcd_key(name, A.GATEWAY, registrar.node_id) for name in (STREAM, "other"))
        wait_for(lambda: [e.key for e in client.get_prefix(A.ETCD_PREFIX)] == both)
        client.revoke(registrar._lease)  # as if it had lapsed while etcd was out of reach
        assert client.get_prefix(A.ETCD_PREFIX) == []
        wait_for(lambda: [e.key for e in client.get_prefix(A.ETCD_PREFIX)] == both, DEFAULT_TTL_S + 5)
        registrar.register(time.monotonic(), [A.StreamAd(STREAM)])  # no longer serves "other": its key goes
        wait_for(lambda: [e.key for e in client.get_prefix(A.ETCD_PREFIX)] == [k for k in both if "/other/" not in k])
    finally:
        registrar.close()
    assert client.get_prefix(A.ETCD_PREFIX) == []
