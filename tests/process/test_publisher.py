"""The Publisher against a real gateway process: bad calls raise and lose nothing, linger is a timer, gateway
kill -9 and restarts are survived with every record journaled exactly once, and the gateway's producer state
(deduplication of re-sent batches) lives in the journal: it survives restarts and expires when idle."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq
from support.servers import STREAM, GatewayProcess, journal_records, zeps_client
from support.servers import assert_exactly_once as journal_exactly_once

from gateway import AsyncPublisher
from gateway.client.publisher import Publisher
from gateway.errors import BadRecord, BufferFull
from gateway.journal import verify_root
from gateway.wire import batch as B
from gateway.wire import protocol as P

pytestmark = pytest.mark.timeout(180)


def assert_exactly_once(root: Path, bodies: list[bytes]) -> None:
    """The journal holds every body once, in publish order, at contiguous sequences, and verifies clean."""
    journal_exactly_once(root, bodies)
    assert verify_root(root).clean


def test_bad_publish_arguments_raise_there_and_lose_nothing(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--max-message-bytes", "1000")
    try:
        with Publisher(gw.ingest, STREAM, confirm=True, max_message_bytes=1000, linger_ms=60_000) as pub:
            pub.publish("k", b"one")
            bad = [
                ("k", "a str", None, "is a str: pass bytes"),
                (b"k", b"v", None, "is a bytes: pass a str"),
                ("k" * 256, b"v", None, "the limit is 255"),
                ("é" * 128, b"v", None, "256 bytes in UTF-8"),
                ("\ud800", b"v", None, "not valid UTF-8"),
                ("k", b"x" * 1001, None, "over the gateway's limit of 1000"),
                ("k", b"v", 0, "outside 0.001"),
                ("k", b"v", float("nan"), "must be a number"),
                ("k", b"v", "5", "must be a number"),
            ]
            for key, body, ttl, reason in bad:
                with pytest.raises(BadRecord, match=reason) as raised:
                    pub.publish(key, body, ttl=ttl)  # type: ignore[arg-type]
                wrong_type = isinstance(key, bytes) or isinstance(body, str) or isinstance(ttl, str)
                assert isinstance(raised.value, TypeError if wrong_type else ValueError), (key, body, ttl)
                assert isinstance(raised.value, TypeError) == wrong_type
            pub.publish("k", bytearray(b"two"))
            pub.publish("k", memoryview(b"three"), ttl=5)
            assert pub.flush() == 3
    finally:
        gw.stop()
    assert [body for _, _, body in journal_records(tmp_path)] == [b"one", b"two", b"three"]


def test_a_lone_record_leaves_without_another_call_with_or_without_a_linger(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    try:
        for n, linger_ms in enumerate((50, 0), 1):
            pub = Publisher(gw.ingest, STREAM, confirm=True, linger_ms=linger_ms)
            pub.publish("telemetry", b"lone")
            deadline = time.monotonic() + 5
            while pub.confirmed < 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # no call into the Publisher: its IO thread must send on its own
            assert pub.confirmed == 1 and pub.last_seq == n
            pub.close()
        assert journal_records(tmp_path) == [(1, "telemetry", b"lone"), (2, "telemetry", b"lone")]
    finally:
        gw.stop()


def test_full_buffer_blocks_until_the_deadline_then_raises_and_keeps_the_rest(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    try:
        pub = Publisher(gw.ingest, STREAM, confirm=True, timeout=0.5, buffer_bytes=10_000, max_message_bytes=1000)
        gw.proc.send_signal(19)  # SIGSTOP: connected, confirming nothing
        accepted, started = 0, 0.0
        try:
            with pytest.raises(BufferFull, match="raise buffer_bytes"):  # one record a batch (key + body: 1000)
                for i in range(20):
                    started = time.monotonic()
                    pub.publish("k", b"%03d" % i + b"x" * 996)
                    accepted += 1
            assert 9 <= accepted <= 11 and 0.4 < time.monotonic() - started < 1.5
        finally:
            gw.proc.send_signal(18)  # SIGCONT
        pub.timeout = 10
        assert pub.flush() == accepted  # the record refused was not queued; none of the others was lost
        pub.close()
    finally:
        gw.stop()


def test_one_publisher_survives_kill_9_restarts_exactly_once(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--fsync-ms", "20")  # confirms wait for the group commit: re-sends are many
    bodies = [b"r%06d" % i for i in range(60_000)]
    errors: list[BaseException] = []

    def load(pub: Publisher) -> None:
        try:
            for i, body in enumerate(bodies):
                pub.publish("k", body)
                if i % 500 == 0:
                    time.sleep(0.005)  # a few seconds of load, so the kills land mid-stream
            pub.flush(timeout=60)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        pub = Publisher(gw.ingest, STREAM, confirm=True, batch_records=200, timeout=30)
        worker = threading.Thread(target=load, args=(pub,))
        worker.start()
        for _ in range(3):
            time.sleep(0.8)
            gw.kill9()
            time.sleep(0.3)
            gw.restart()
        worker.join(90)
        assert not worker.is_alive() and not errors, errors
        assert pub.reconnects >= 3 and pub.confirmed == len(bodies)
        pub.close()
    finally:
        gw.stop()
    assert_exactly_once(tmp_path, bodies)


def test_zeps_publish_count_exits_0_through_gateway_restarts_exactly_once(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    n = 100_000
    argv = [sys.executable, "-m", "gateway.cli", "publish", "--ingest", gw.ingest, "--stream", STREAM]
    cli = subprocess.Popen(
        [*argv, "--count", str(n), "--rate", "25000", "--confirm"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(3):
            time.sleep(0.9)
            gw.kill9()
            time.sleep(0.2)
            gw.restart()
        _, err = cli.communicate(timeout=120)
        assert cli.returncode == 0, err
        assert f"published {n} records" in err
    finally:
        if cli.poll() is None:
            cli.kill()
        gw.stop()
    pad = b"x" * 100
    assert_exactly_once(tmp_path, [(b"%d:" % i + pad)[:100] for i in range(n)])


# --- the gateway's side of exactly-once, spoken raw ----------------------------------------------------------


def producer_session(ingest: str) -> zmq.Socket:
    sock = zeps_client(ingest)
    sock.send(P.encode(P.Attach("ZEPS", 1, STREAM)))
    assert isinstance(P.decode(sock.recv()), P.AttachOk)
    sock.send(P.encode(P.Extend((P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER))))
    granted = P.decode(sock.recv())
    assert isinstance(granted, P.ExtendOk) and P.FEATURE_PRODUCER in granted.features
    return sock


def send_batch(sock: zmq.Socket, pid: int, pseq: int, bodies: list[bytes]) -> P.Command:
    raw = B.encode(0, [(0, b"k", body) for body in bodies], producer=(pid, pseq))
    sock.send(P.encode(P.PublishBatch(raw)))
    return P.decode(sock.recv())


def test_resent_batches_are_dropped_and_confirmed_across_restarts(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--fsync", "always")
    pid = 0xFEEDFACE12345678
    try:
        sock = producer_session(gw.ingest)
        assert send_batch(sock, pid, 0, [b"a", b"b", b"c"]) == P.PublishOk(1, 3)
        assert send_batch(sock, pid, 0, [b"a", b"b", b"c"]) == P.PublishOk(1, 3)  # same session: dropped
        sock.close()
        gw.kill9()
        gw.restart()  # the state comes back from the journal alone
        sock = producer_session(gw.ingest)
        assert send_batch(sock, pid, 0, [b"a", b"b", b"c"]) == P.PublishOk(1, 3)
        assert send_batch(sock, 7, 0, [b"other"]) == P.PublishOk(4, 1)  # another producer, numbered alike
        # Partial overlap: 1..2 are journaled, 3..4 are new; confirmed whole, ending at the last new one.
        answer = send_batch(sock, pid, 1, [b"b", b"c", b"d", b"e"])
        assert isinstance(answer, P.PublishOk) and (answer.sequence + answer.count - 1, answer.count) == (6, 4)
        # A gap (5 is missing: refused while 6 was on its way) is refused too, retryably: taking 6 would make
        # 5 a "duplicate" when it comes again, confirmed and never journaled.
        refused = send_batch(sock, pid, 6, [b"g"])
        assert isinstance(refused, P.Invalid) and refused.reason.endswith(P.RETRY_LATER), refused
        assert "re-send from 5" in refused.reason
        assert send_batch(sock, pid, 5, [b"f", b"g"]) == P.PublishOk(7, 2)  # in order: both journaled
        sock.close()
        gw.stop()
        gw.restart()
        sock = producer_session(gw.ingest)
        assert send_batch(sock, pid, 3, [b"d", b"e"]) == P.PublishOk(7, 2)  # after a clean restart too
        sock.close()
    finally:
        gw.stop()
    assert [body for _, _, body in journal_records(tmp_path)] == [b"a", b"b", b"c", b"other", b"d", b"e", b"f", b"g"]


def test_idle_producers_expire_and_are_then_taken_as_new(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, "--producer-expiry-s", "1")
    try:
        sock = producer_session(gw.ingest)
        assert send_batch(sock, 1, 0, [b"a"]) == P.PublishOk(1, 1)
        assert send_batch(sock, 1, 0, [b"a"]) == P.PublishOk(1, 1)  # remembered
        time.sleep(1.5)
        assert send_batch(sock, 1, 0, [b"a"]) == P.PublishOk(2, 1)  # forgotten: journaled again
        sock.close()
        gw.stop()
        time.sleep(1.2)
        gw.restart()  # on restart, only the journal tail within the expiry is read back
        sock = producer_session(gw.ingest)
        assert send_batch(sock, 1, 0, [b"a"]) == P.PublishOk(3, 1)
        sock.close()
    finally:
        gw.stop()


def test_a_producer_header_needs_the_extension(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    try:
        sock = zeps_client(gw.ingest)
        sock.send(P.encode(P.Attach("ZEPS", 1, STREAM)))
        assert isinstance(P.decode(sock.recv()), P.AttachOk)
        sock.send(P.encode(P.Extend((P.FEATURE_BATCH, P.FEATURE_CONFIRM))))  # an old client: no producer
        assert P.decode(sock.recv()) == P.ExtendOk((P.FEATURE_BATCH, P.FEATURE_CONFIRM))
        answer = send_batch(sock, 1, 0, [b"a"])
        assert isinstance(answer, P.Invalid) and "'producer' extension" in answer.reason
        sock.send(P.encode(P.PublishBatch(B.encode(0, [(0, b"k", b"old")]))))
        assert P.decode(sock.recv()) == P.PublishOk(1, 1)  # old clients keep working
        sock.close()
    finally:
        gw.stop()


def test_async_publisher_never_stalls_the_loop(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)

    async def main() -> tuple[int | None, float]:
        ticks = 0
        longest = 0.0

        async def ticker() -> None:
            nonlocal ticks, longest
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                longest, last, ticks = max(longest, now - last), now, ticks + 1

        tick = asyncio.create_task(ticker())
        async with await AsyncPublisher.attach(gw.ingest, STREAM, confirm=True, linger_ms=20) as pub:
            for i in range(2000):
                await pub.publish("k", b"a%d" % i)
            gw.proc.send_signal(19)  # SIGSTOP: flush waits, the loop must not
            waiting = asyncio.create_task(pub.flush(timeout=10))
            await asyncio.sleep(0.5)
            gw.proc.send_signal(18)
            last = await waiting
        tick.cancel()
        return last, longest

    try:
        last, longest = asyncio.run(main())
    finally:
        gw.stop()
    assert last == 2000
    assert longest < 0.45, f"the event loop stalled {longest:.3f} s (a blocking flush would stall it 0.5 s)"
    assert [body for _, _, body in journal_records(tmp_path)] == [b"a%d" % i for i in range(2000)]


def test_a_slow_publisher_is_held_to_the_buffer_too(tmp_path: Path) -> None:
    """Records slower than the linger time leave one by one, so the linger timer must respect the budget too."""
    gw = GatewayProcess(tmp_path)
    try:
        pub = Publisher(gw.ingest, STREAM, confirm=True, timeout=0.3, buffer_bytes=5_000, max_message_bytes=1000)
        gw.proc.send_signal(19)  # SIGSTOP: nothing is confirmed
        accepted = 0
        try:
            with pytest.raises(BufferFull):
                for i in range(100):
                    pub.publish("k", b"%03d" % i + b"x" * 96)  # key and body: 100 bytes
                    accepted += 1
                    time.sleep(0.02)  # four times the linger: each record leaves alone
            assert 40 <= accepted <= 5_000 // 100 + 1_000 // 100  # the budget, and one batch filling behind it
            cpu = time.process_time()
            time.sleep(0.5)  # over the budget, lingering records must not make the IO thread spin
            assert time.process_time() - cpu < 0.2
        finally:
            gw.proc.send_signal(18)
        pub.timeout = 10
        assert pub.flush() == accepted
        pub.close()
    finally:
        gw.stop()
    assert len(journal_records(tmp_path)) == accepted


def test_publish_many_and_publish_interleave_in_order_exactly_once(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    bodies = [b"m%05d" % i for i in range(20_000)]
    try:
        with Publisher(gw.ingest, STREAM, confirm=True) as pub:
            pub.publish("k", b"first")
            for at in range(0, len(bodies), 5_000):
                pub.publish_many(["k"] * 5_000, bodies[at : at + 5_000])
            pub.publish_many([], [])
            with pytest.raises(TypeError, match="record 1: body"):
                pub.publish_many(["k", "k"], [b"ok", "not bytes"])  # type: ignore[list-item]
            pub.publish("k", b"last")
            assert pub.flush() == len(bodies) + 2
    finally:
        gw.stop()
    assert_exactly_once(tmp_path, [b"first", *bodies, b"last"])


def _script(gw: GatewayProcess, body: str) -> subprocess.CompletedProcess[str]:
    code = f"from gateway import Publisher\npub = Publisher({gw.ingest!r}, {STREAM!r}, confirm=True, timeout=2)\n{body}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_publisher_not_closed_is_flushed_at_exit(tmp_path: Path) -> None:
    """Records queued by a script that ends without close() are journaled (atexit), with no word on stderr."""
    gw = GatewayProcess(tmp_path, "--fsync-ms", "50")  # confirms wait a while: the exit must wait for them
    try:
        done = _script(gw, "for i in range(1000):\n    pub.publish('k', b'%04d' % i)\n")
    finally:
        gw.stop()
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert_exactly_once(tmp_path, [b"%04d" % i for i in range(1000)])


def test_records_that_cannot_be_delivered_at_exit_are_counted_on_stderr(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    try:
        started = time.monotonic()
        stop = f"import os\nos.kill({gw.proc.pid}, 19)\n"  # SIGSTOP once attached: nothing is confirmed
        done = _script(gw, stop + "for i in range(7):\n    pub.publish('k', b'x')\n")
        took = time.monotonic() - started
    finally:
        gw.proc.send_signal(18)
        gw.stop()
    assert done.returncode == 0  # the script itself did not fail; stderr says what was not delivered
    assert "7 records could not be confirmed before exit" in done.stderr, done.stderr
    assert "call flush() or close() before exiting" in done.stderr
    assert took < 2 + 10, "the flush at exit waits the Publisher's timeout (2 s), not for ever"


def test_a_publisher_collected_open_warns_and_still_delivers(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    try:
        pub = Publisher(gw.ingest, STREAM, confirm=True)
        pub.publish("k", b"kept")
        with pytest.warns(ResourceWarning, match="was not closed: call close"):
            del pub
            gc.collect()
        deadline = time.monotonic() + 10
        while not journal_records(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        gw.stop()
    assert journal_records(tmp_path) == [(1, "k", b"kept")]


def test_an_endpoint_without_transport_is_one_clear_error_at_construction() -> None:
    code = "from gateway import Publisher\nPublisher('127.0.0.1:5570', 'o')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "ConfigError: '127.0.0.1:5570' has no transport: write tcp://127.0.0.1:5570" in done.stderr
    assert "Exception in thread" not in done.stderr and "ZMQError" not in done.stderr


OUT_OF_FDS = """
import os, sys, threading, time
from gateway.client.publisher import Publisher
pub = Publisher(sys.argv[1], sys.argv[2], confirm=True, timeout=30)
pub.publish("k", b"before")
pub.flush()
held, release = [], threading.Event()
def take():  # every descriptor this process may have, and each one freed again at once
    while not release.is_set():
        try:
            held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            time.sleep(0.0005)
taker = threading.Thread(target=take)
taker.start()
time.sleep(0.5)
print("exhausted", flush=True)
sys.stdin.readline()  # the gateway was killed and started again meanwhile: the publisher's reconnects fail
pub.publish("k", b"after")
time.sleep(1.0)
release.set()
taker.join()
for fd in held:
    os.close(fd)
pub.flush(timeout=30)
pub.close()
print("flushed", flush=True)
"""


def test_a_publisher_out_of_descriptors_retries_its_connection_and_loses_nothing(tmp_path: Path) -> None:
    """EMFILE while reconnecting (a storm of reconnects, a low open-files limit) is a connection to retry once
    descriptors are free again, said once: not a dead IO thread whose records wait for ever."""
    root = tmp_path / "journal"
    gw = GatewayProcess(root, streams=(STREAM,))
    child = subprocess.Popen([sys.executable, "-c", OUT_OF_FDS, gw.ingest, STREAM], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "exhausted", child.communicate(timeout=30)
        gw.kill9()
        gw.restart()  # the publisher sees the drop and opens a new socket: no descriptor for it
        time.sleep(1.0)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        gw.stop()
    assert child.returncode == 0 and out.strip() == "flushed", err
    assert err.count("cannot open a ZeroMQ socket") <= 1 and "Traceback" not in err, err
    assert_exactly_once(root, [b"before", b"after"])
