"""The gateway as a real process on loopback: confirms, crash recovery, bad input, plain PUB ingest."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from support.servers import STREAM, GatewayProcess, free_port, journal_records, zeps_client

from gateway.client.publisher import Publisher
from gateway.errors import PublishError
from gateway.journal import verify_root
from gateway.wire import protocol as P


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(tmp_path)
    yield gw
    gw.stop()


def test_confirmed_records_are_journaled_in_order(gateway: GatewayProcess, tmp_path: Path) -> None:
    with Publisher(gateway.ingest, STREAM, confirm=True) as pub:
        for i in range(5000):
            pub.publish(f"k{i % 7}", b"body-%d" % i)
        assert pub.flush() == 5000
        pub.publish("late", b"one more")
        assert pub.flush() == 5001
    assert journal_records(tmp_path) == [(i + 1, f"k{i % 7}", b"body-%d" % i) for i in range(5000)] + [
        (5001, "late", b"one more")
    ]


def test_kill_9_mid_load_then_restart_continues_sequences(tmp_path: Path) -> None:
    confirmed: dict[int, bytes] = {}
    kills = 0
    n = 0
    for _ in range(3):
        gw = GatewayProcess(tmp_path, "--fsync", "always")
        try:
            pub = Publisher(gw.ingest, STREAM, confirm=True, batch_records=50, timeout=10)
            for chunk in range(20):
                bodies = [b"r%d" % (n + i) for i in range(200)]
                for body in bodies:
                    pub.publish("k", body)
                n += len(bodies)
                if chunk == 12:
                    for body in bodies:  # unconfirmed: the kill may cut this chunk anywhere
                        pub.publish("k", body)
                    gw.kill9()
                    kills += 1
                    break
                last = pub.flush()
                assert last is not None
                confirmed.update(zip(range(last - len(bodies) + 1, last + 1), bodies, strict=True))
            pub.abort()
        finally:
            gw.stop()
    records = journal_records(tmp_path)
    seqs = [seq for seq, _, _ in records]
    assert seqs == list(range(1, len(seqs) + 1)), "sequences must be contiguous, never reused"
    by_seq = {seq: body for seq, _, body in records}
    assert all(by_seq[seq] == body for seq, body in confirmed.items()), "a confirmed record was lost or altered"
    assert kills == 3 and len(confirmed) == 3 * 12 * 200
    assert verify_root(tmp_path).clean


def ask(sock: zmq.Socket, frame: bytes) -> P.Command:
    sock.send(frame)
    return P.decode(sock.recv())


@pytest.mark.parametrize(
    ("attached", "frame", "reason"),
    [
        (False, b"\xaa\xa5\x63", "unknown command 99"),
        (False, b"\xaa\xa5\x06\x01", "truncated PUBLISH"),
        (False, P.encode(P.Publish("k", b"v")), "PUBLISH before ATTACH"),
        (False, P.encode(P.Attach("ZEPS", 1, "nosuch")), "unknown stream 'nosuch'; this gateway serves: orders, other"),
        (False, P.encode(P.Attach("ZEPS", 2, STREAM)), "ZEPS version 2 is not served; this server speaks 1"),
        (True, P.encode(P.Subscribe("", 0)), "SUBSCRIBE is served by the replay sidecar"),
        (True, P.encode(P.PublishBatch(b"ZB junk")), "not allowed here"),
    ],
)
def test_bad_input_gets_invalid_with_a_reason(gateway: GatewayProcess, attached: bool, frame: bytes, reason: str):
    sock = zeps_client(gateway.ingest)
    if attached:
        assert isinstance(ask(sock, P.encode(P.Attach("ZEPS", 1, STREAM))), P.AttachOk)
    answer = ask(sock, frame)
    assert isinstance(answer, P.Invalid)
    assert reason in answer.reason


def test_the_gateway_keeps_serving_after_junk(gateway: GatewayProcess, tmp_path: Path) -> None:
    rogue = zeps_client(gateway.ingest)
    rogue.send(b"no signature at all")  # dropped silently
    rogue.send_multipart([b"two", b"frames"])
    assert isinstance(P.decode(rogue.recv()), P.Invalid)
    for i in range(200):
        rogue.send(b"\xaa\xa5" + os.urandom(i % 40))
    rogue.send(P.encode(P.Ping()))
    answers = [P.decode(rogue.recv()) for _ in range(201)]  # one answer per junk frame, then PING-OK
    assert all(isinstance(a, P.Invalid | P.PingOk) for a in answers[:200])  # junk may spell PING
    assert isinstance(answers[200], P.PingOk)
    with Publisher(gateway.ingest, STREAM, confirm=True) as pub:
        pub.publish("k", b"v")
        assert pub.flush() == 1
    assert journal_records(tmp_path) == [(1, "k", b"v")]


def test_a_lone_publish_leaves_at_once_whatever_the_linger(tmp_path: Path) -> None:
    """Smart batching: a single PUBLISH with nothing queued behind it is journaled in the pass that read it, not
    after --linger-ms (an hour here); under load a batch grows, bounded by the linger and the batch limits."""
    gw = GatewayProcess(tmp_path, "--linger-ms", "3600000")
    try:
        sock = zeps_client(gw.ingest)
        assert isinstance(ask(sock, P.encode(P.Attach("ZEPS", 1, STREAM))), P.AttachOk)
        for i in range(3):
            sock.send(P.encode(P.Publish("k", b"v%d" % i)))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(journal_records(tmp_path)) <= i:
                time.sleep(0.02)
        assert journal_records(tmp_path) == [(i + 1, "k", b"v%d" % i) for i in range(3)]
    finally:
        gw.stop()


def test_oversized_message_is_refused_and_the_publisher_sees_it(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--max-message-bytes", "1000")
    try:
        with pytest.raises(PublishError, match="over the limit"), Publisher(gw.ingest, STREAM, confirm=True) as pub:
            pub.publish("k", b"x" * 5000)
            pub.flush()
        with Publisher(gw.ingest, STREAM, confirm=True) as pub:
            pub.publish("k", b"small")
            assert pub.flush() == 1
    finally:
        gw.stop()


def test_plain_pub_publishers_through_xsub(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(subprocess.CalledProcessError) as refused:  # plain PUB frames name no stream
        subprocess.run([sys.executable, "-m", "gateway.cli", "gateway", "--journal", str(tmp_path), "--stream", "a",
                        "--stream", "b", "--ingest", "tcp://127.0.0.1:1", "--ingest-pub", "tcp://127.0.0.1:2"],
                       check=True, capture_output=True, text=True)  # fmt: skip
    assert "use it with exactly one --stream" in refused.value.stderr
    gw = GatewayProcess(tmp_path, "--ingest-pub", f"tcp://127.0.0.1:{port}", streams=(STREAM,))
    try:
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 2000)
        pub.connect(f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + 20
        sent = 0
        # A PUB sends nothing until the gateway's subscribe-all has arrived: publish until records show up.
        while time.monotonic() < deadline and not journal_records(tmp_path):
            pub.send_multipart([b"probe", b"%d" % sent])
            sent += 1
            time.sleep(0.05)
        pub.send_multipart([b"bad", b"three", b"frames"])
        for i in range(100):
            pub.send_multipart([b"tick", b"%d" % i])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(k == "tick" for _, k, _ in journal_records(tmp_path)) < 100:
            time.sleep(0.05)
        pub.close()
    finally:
        gw.stop()
    records = journal_records(tmp_path)
    ticks = [(key, body) for _, key, body in records if key == "tick"]
    assert ticks == [("tick", b"%d" % i) for i in range(100)]
    assert not any(key == "bad" for _, key, _ in records)


def test_metrics_endpoint_counts_published_and_rejected(tmp_path: Path) -> None:
    import urllib.request

    port = free_port()
    gw = GatewayProcess(tmp_path, "--metrics", f"127.0.0.1:{port}")
    try:
        with Publisher(gw.ingest, STREAM, confirm=True) as pub:
            for i in range(300):
                pub.publish("k", b"%d" % i)
            pub.flush()
        ask(zeps_client(gw.ingest), b"\xaa\xa5\x63")  # one INVALID
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        gw.stop()
    values = {
        line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")
    }
    assert values[f'zeps_gateway_published_records_total{{stream="{STREAM}"}}'] == 300
    assert values[f'zeps_gateway_journaled_records_total{{stream="{STREAM}"}}'] == 300
    assert values['zeps_gateway_rejected_messages_total{kind="invalid"}'] == 1
    assert values[f'zeps_gateway_fsync_seconds_count{{stream="{STREAM}"}}'] >= 1
