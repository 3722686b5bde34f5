"""NORM through libnorm (gateway.transport.norm) between lab hosts: every message, in order, with its content.

Senders and receivers run in different namespaces. Each receiver checks every message against the one it
expects next (frames and bytes), so loss, reordering, duplication or corruption all fail the test. A warm-up
handshake (the receiver reports its first warm-up message) makes sure receivers are joined before the
checked messages start, except where joining late is the point.
"""

from __future__ import annotations

import itertools
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from support.feedlab import STREAM as FEED
from support.feedlab import WAIT_S as FEED_WAIT_S
from support.feedlab import expected, publish, subscribe
from support.numbered import number, numbered

from gateway.mcast import Endpoint, Tuning, open_pub, open_sub
from gateway.tools.deployment import Deployment
from gateway.transport.norm import NormSender
from netlab import MP, Lab, WallClock
from netlab.packets import inject

pytestmark = pytest.mark.lab

STREAM = b"t.norm"
PORT = 5555
WAIT_S = 40.0
# Around libzmq's limits (255/256: short/long frame header; 2038/2039: its sender's 2,048-byte buffer) and
# well past NORM's segment (1,400) and FEC block (64 segments) sizes.
SIZES = (0, 1, 100, 255, 256, 2038, 2039, 4096, 9000, 65536, 262144)
WARM_UP = b"warm-up"


def message(i: int, sizes: tuple[int, ...] = SIZES) -> list[bytes]:
    return numbered(STREAM, i, sizes)


def receive(
    endpoint: str, count: int, ready: Any, progress: Any = None, loss: float = 0.0, sizes: tuple[int, ...] = SIZES
) -> dict[str, Any]:
    """Check messages until the last one (count - 1); report the first and the number received, or the problem.

    Warm-ups are skipped; the first of each sender phase (its third frame) is reported on `ready`. With
    `progress`, the number of each 100th message is reported there.
    """
    with open_sub(zmq.Context.instance(), Endpoint.parse(endpoint), Tuning(), [STREAM.decode()]) as sub:
        if loss:
            sub.set_rx_loss(loss)
        phases: set[bytes] = set()
        first = expect = None
        received = 0
        problem = None
        deadline = time.monotonic() + WAIT_S
        while expect != count and problem is None:
            if time.monotonic() > deadline:
                problem = f"timeout after {received} messages, next expected {expect}"
                break
            if not sub.poll(100):
                continue
            frames = sub.recv_multipart()
            if frames[1] == WARM_UP:
                if frames[2] not in phases:
                    phases.add(frames[2])
                    ready.put(frames[2])
                continue
            i = number(frames)
            if first is None:
                first = expect = i
            if frames != message(i, sizes) or i != expect:
                problem = f"message {i} (expected {expect}): {[f[:12] for f in frames]} {[len(f) for f in frames]}"
                break
            received += 1
            expect = i + 1
            if progress is not None and i % 100 == 0:
                progress.put(i)
        if problem is None and sub.poll(300):
            problem = f"a message after the last one: {[f[:12] for f in sub.recv_multipart()]}"
        return {"first": first, "received": received, "problem": problem, "breaks": sub.breaks}


def send(
    endpoint: str,
    tuning: Tuning,
    lo: int,
    hi: int,
    go: Any,
    done: Any,
    per_s: float = 0.0,
    sizes: tuple[int, ...] = SIZES,
) -> dict[str, Any]:
    """Warm up until `go`, then send messages lo..hi-1 (paced at per_s, or as fast as the stream takes them).

    Sends with NOBLOCK and counts zmq.Again: backpressure, never loss. Stays until `done` (NORM repairs need
    the sender), then closes, which lets NORM finish its flush.
    """
    sender = open_pub(zmq.Context.instance(), Endpoint.parse(endpoint), tuning)
    assert isinstance(sender, NormSender)
    phase = b"%d" % lo
    deadline = time.monotonic() + WAIT_S
    while not go.wait(0.02):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no receiver joined within {WAIT_S} s")
        sender.send_multipart([STREAM, WARM_UP, phase], zmq.NOBLOCK)
    started = time.monotonic()
    again = 0
    for i in range(lo, hi):
        while True:
            try:
                sender.send_multipart(message(i, sizes), zmq.NOBLOCK)
                break
            except zmq.Again:
                again += 1
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the NORM stream took no message for {WAIT_S} s (message {i})") from None
                time.sleep(0.001)
        if per_s:
            time.sleep(max(0.0, started + (i - lo + 1) / per_s - time.monotonic()))
    while not sender.push():
        time.sleep(0.001)
    elapsed = time.monotonic() - started
    done.wait(WAIT_S)
    sender.close()
    return {"again": again, "elapsed": elapsed}


def endpoint(lab: Lab, host: str, group: int = 1) -> str:
    return f"norm://{lab.host(host).ip};{lab.group(group)}:{PORT}"


def test_every_message_arrives_in_order_with_content_and_backpressure_holds_the_rate(make_lab) -> None:
    lab = make_lab(["pub", "sub1", "sub2"])
    count = 4 * len(SIZES) * 25  # 1,100 messages, 34 MB
    total_bytes = sum(sum(map(len, message(i))) for i in range(count))
    tuning = Tuning(rate_kbps=100_000, norm_buffer_bytes=4 * 1024 * 1024)
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    subs = [lab.start(h, receive, endpoint(lab, h), count, ready) for h in ("sub1", "sub2")]
    sender = lab.start("pub", send, endpoint(lab, "pub"), tuning, 0, count, go, done)
    for _ in subs:
        ready.get(timeout=WAIT_S)
    go.set()
    results = [sub.result(timeout=2 * WAIT_S) for sub in subs]
    done.set()
    sent = sender.result(timeout=WAIT_S)
    for got in results:
        assert got == {"first": 0, "received": count, "problem": None, "breaks": 0}
    # The burst is 8x the stream buffer: the stream pushed back, and the data left at the set rate, not faster.
    assert sent["again"] > 0
    assert sent["elapsed"] >= 0.9 * (total_bytes - tuning.norm_buffer_bytes) * 8 / (tuning.rate_kbps * 1000)


def test_a_late_joiner_receives_a_contiguous_tail(make_lab) -> None:
    lab = make_lab(["pub", "early", "late"])
    count = 1_000
    ready, late_ready, progress, go, done = MP.Queue(), MP.Queue(), MP.Queue(), MP.Event(), MP.Event()
    early = lab.start("early", receive, endpoint(lab, "early"), count, ready, progress)
    sender = lab.start("pub", send, endpoint(lab, "pub"), Tuning(rate_kbps=50_000), 0, count, go, done, 250.0)
    ready.get(timeout=WAIT_S)
    go.set()
    while progress.get(timeout=WAIT_S) < 300:  # join well into the stream
        pass
    late = lab.start("late", receive, endpoint(lab, "late"), count, late_ready)
    got_late = late.result(timeout=2 * WAIT_S)
    got_early = early.result(timeout=WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert got_early == {"first": 0, "received": count, "problem": None, "breaks": 0}
    assert got_late["problem"] is None
    assert got_late["first"] > 300
    assert got_late["received"] == count - got_late["first"]  # every message from its first to the last
    assert got_late["breaks"] == 0


def test_lost_packets_are_repaired(make_lab) -> None:
    lab = make_lab(["pub", "sub"])
    count = 600
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", receive, endpoint(lab, "sub"), count, ready, None, 10.0)  # NORM drops 10%
    sender = lab.start("pub", send, endpoint(lab, "pub"), Tuning(rate_kbps=50_000), 0, count, go, done)
    ready.get(timeout=WAIT_S)
    go.set()
    got = sub.result(timeout=2 * WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert got == {"first": 0, "received": count, "problem": None, "breaks": 0}


def forged(msg_type: int, fec_id: int, source_id: int) -> bytes:
    """A NORM_INFO (1) or NORM_DATA (2) from a new sender whose one header extension (type 1) says 0 bytes:
    libnorm 1.5.9's walk over the extensions (for the sender's FEC information) never ends on it."""
    base = 16 if msg_type == 1 else 16 + (8 if fec_id == 129 else 4)
    common = struct.pack("!BBHIHBBBBH", 0x10 | msg_type, (base + 4) // 4, 1, source_id, 7, 0, 0, 0, fec_id, 1)
    return common + bytes(base - len(common)) + bytes([1, 0, 0, 0]) + b"payload"


def test_a_malformed_header_extension_does_not_hang_receivers(make_lab) -> None:
    """One datagram with a zero-length header extension hung libnorm's protocol thread for good, holding its
    lock (issue #34: junk #4995 of chaos --seed=328782784 was one). The receiver's socket filter
    (gateway.transport.norm_filter) drops it; the feed goes on."""
    lab, count, ready, go, done = make_lab(["pub", "sub", "rogue"]), 200, MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", receive, endpoint(lab, "sub"), count, ready)
    sender = lab.start("pub", send, endpoint(lab, "pub"), Tuning(rate_kbps=20_000), 0, count, go, done, 200.0)
    ready.get(timeout=WAIT_S)
    forgeries = [forged(1, 2, 0x0BAD0001), forged(2, 5, 0x0BAD0002), forged(2, 129, 0x0BAD0003)]
    assert inject(lab, "rogue", lab.group(1), PORT, payloads=forgeries) == len(forgeries)  # any host could
    go.set()
    got = sub.result(timeout=WAIT_S + 10)
    done.set()
    sender.result(timeout=WAIT_S)
    assert got == {"first": 0, "received": count, "problem": None, "breaks": 0}


# A subscriber's loop (every poll calls libnorm: NormGetNextEvent) with gateway.transport.norm_filter switched
# off, so that libnorm meets the datagram that really hangs it, and a 1 s watchdog deadline.
UNGUARDED_RECEIVER = """import logging, sys, zmq
from gateway.mcast import Endpoint, Tuning, open_sub
from gateway.transport import norm_filter, norm_watchdog
logging.basicConfig(stream=sys.stderr)
norm_filter.guarded = lambda start, ports, what: start()
norm_watchdog.DEADLINE_S = 1.0
sub = open_sub(zmq.Context.instance(), Endpoint.parse(sys.argv[1]), Tuning(), ["t.norm"])
print("joined", flush=True)
while True:
    sub.poll(100)
"""


def test_a_libnorm_call_that_does_not_return_ends_the_process(make_lab) -> None:
    """Should libnorm's protocol thread spin again with its lock held (as it did on the datagram the filter
    now drops), every NORM call would wait for good: the watchdog (gateway.transport.norm_watchdog) logs the
    stuck call and ends the process with status 1 instead, for a supervisor to restart and HA to fail over."""
    lab = make_lab(["sub", "rogue"])
    sub = lab.popen("sub", [sys.executable, "-c", UNGUARDED_RECEIVER, endpoint(lab, "sub")], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert sub.stdout is not None and sub.stdout.readline() == "joined\n"
    started = time.monotonic()
    assert inject(lab, "rogue", lab.group(1), PORT, payloads=[forged(1, 2, 0x0BAD0001)]) == 1
    _, err = sub.communicate(timeout=WAIT_S)
    assert sub.returncode == 1, err
    assert time.monotonic() - started < 1.0 + 10.0  # the deadline, and slack for a loaded host
    [line] = [line for line in err.splitlines() if "norm_call_stuck" in line]
    assert f"norm_call_stuck call=NormGetNextEvent session={lab.host('sub').ip};{lab.group(1)}:{PORT}" in line


def receive_with_stall(endpoint: str, count: int, ready: Any, stall_at: int, stall_s: float) -> dict[str, Any]:
    """Like `receive`, but stop reading for `stall_s` at message `stall_at`; record the gaps instead of failing."""
    with open_sub(zmq.Context.instance(), Endpoint.parse(endpoint), Tuning(), [STREAM.decode()]) as sub:
        expect, gaps, problem, joined = 0, [], None, False
        deadline = time.monotonic() + WAIT_S
        while expect < count and problem is None and time.monotonic() < deadline:
            if not sub.poll(100):
                continue
            frames = sub.recv_multipart()
            if frames[1] == WARM_UP:
                if not joined:
                    joined = True
                    ready.put(frames[2])
                continue
            i = number(frames)
            if frames != message(i, STALL_SIZES) or i < expect:
                problem = f"message {i} (expected {expect}): {[len(f) for f in frames]}"
            if i > expect:
                gaps.append((expect, i - 1))
            expect = i + 1
            if i == stall_at:
                time.sleep(stall_s)  # the slow consumer under test
        return {"last": expect - 1, "gaps": gaps, "problem": problem, "breaks": sub.breaks}


STALL_SIZES = (100, 4096, 9000)


def test_a_consumer_that_falls_behind_loses_a_range_then_gets_whole_messages(make_lab) -> None:
    """NORM has no receiver flow control: a stalled reader overruns its buffer. It must see a gap (which the
    gateway's subscribers fill from replay), then whole, correct messages again up to the last."""
    lab = make_lab(["pub", "sub"])
    count = 4_000  # 18 MB: far more than NORM buffers for the reader while it stalls
    tuning = Tuning(rate_kbps=100_000, norm_buffer_bytes=1024 * 1024)
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", receive_with_stall, endpoint(lab, "sub"), count, ready, 300, 1.5)
    sender = lab.start("pub", send, endpoint(lab, "pub"), tuning, 0, count, go, done, 0.0, STALL_SIZES)
    ready.get(timeout=WAIT_S)
    go.set()
    got = sub.result(timeout=2 * WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert got["problem"] is None
    assert got["last"] == count - 1
    assert got["gaps"] and got["gaps"][0][0] > 300
    assert got["breaks"] >= 1


def test_a_restarted_sender_is_followed(make_lab) -> None:
    """A gateway restart: a new sender (new NORM instance id) on the same host and group."""
    lab = make_lab(["pub", "sub"])
    count = 400
    ready = MP.Queue()
    sub = lab.start("sub", receive, endpoint(lab, "sub"), count, ready)
    for lo, hi in ((0, count // 2), (count // 2, count)):
        go, done = MP.Event(), MP.Event()
        sender = lab.start("pub", send, endpoint(lab, "pub"), Tuning(rate_kbps=50_000), lo, hi, go, done)
        assert ready.get(timeout=WAIT_S) == b"%d" % lo
        go.set()
        done.set()  # close right after the last message: NORM's flush on close must deliver the tail
        sender.result(timeout=WAIT_S)
    assert sub.result(timeout=WAIT_S) == {"first": 0, "received": count, "problem": None, "breaks": 0}


ZMQ_SIZES = (0, 1, 255, 256, 1000, 2029)  # with the 8-byte number: frames of at most 2,037 bytes


def zmq_sub(endpoint: str, count: int, ready: Any) -> dict[str, Any]:
    """A plain libzmq norm:// SUB, checking messages like `receive`."""
    with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, STREAM)
        sub.connect(endpoint)
        expect, problem, joined = 0, None, False
        deadline = time.monotonic() + WAIT_S
        while expect < count and problem is None and time.monotonic() < deadline:
            if not sub.poll(100):
                continue
            frames = sub.recv_multipart()
            if frames[1] == WARM_UP:
                if not joined:
                    joined = True
                    ready.put(frames[2])
                continue
            if frames != message(expect, SIZES):
                problem = f"message {number(frames)} (expected {expect})"
            expect += 1
        return {"received": expect, "problem": problem}


def zmq_pub(endpoint: str, count: int, go: Any, done: Any) -> None:
    """A plain libzmq norm:// PUB: paced (its NORM sender stalls on bursts), frames of at most 2,038 bytes."""
    with zmq.Context() as ctx, ctx.socket(zmq.PUB) as pub:
        pub.setsockopt(zmq.SNDHWM, 0)
        pub.setsockopt(zmq.LINGER, 0)  # closing its NORM engine would wait out any linger
        pub.connect(endpoint)
        deadline = time.monotonic() + WAIT_S
        while not go.wait(0.02):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no receiver joined within {WAIT_S} s")
            pub.send_multipart([STREAM, WARM_UP, b"0"])
        for i in range(count):
            pub.send_multipart(message(i, ZMQ_SIZES))
            time.sleep(0.002)
        done.wait(WAIT_S)


def test_the_wire_is_libzmq_norm_both_ways(make_lab) -> None:
    lab = make_lab(["pub", "sub"])
    count = 300
    # gateway.transport.norm sender -> libzmq SUB: any frame size (libzmq's receiver has no 2,038-byte limit).
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", zmq_sub, endpoint(lab, "sub"), count, ready)
    sender = lab.start("pub", send, endpoint(lab, "pub"), Tuning(rate_kbps=20_000), 0, count, go, done, 500.0)
    ready.get(timeout=WAIT_S)
    go.set()
    assert sub.result(timeout=2 * WAIT_S) == {"received": count, "problem": None}
    done.set()
    sender.result(timeout=WAIT_S)
    # libzmq PUB -> NormReceiver (on another group: the first sender may still be flushing).
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", receive, endpoint(lab, "sub", 2), count, ready, None, 0.0, ZMQ_SIZES)
    sender = lab.start("pub", zmq_pub, endpoint(lab, "pub", 2), count, go, done)
    ready.get(timeout=WAIT_S)
    go.set()
    got = sub.result(timeout=2 * WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert got == {"first": 0, "received": count, "problem": None, "breaks": 0}


def test_the_reconciling_subscriber_merges_two_norm_feeds(make_lab, tmp_path) -> None:
    """gateway -> A and B NORM feeds -> Subscriber, which polls NormReceivers in a zmq.Poller."""
    lab = make_lab(["pub", "gw", "sub"])
    deployment = Deployment(lab, tmp_path, FEED, feeds=2, transport="norm")
    try:
        ready = MP.Queue()
        sub = lab.start("sub", subscribe, deployment.for_host("sub"), deployment.replay, "latest", 20_000, ready)
        ready.get(timeout=FEED_WAIT_S)
        assert lab.run("pub", publish, deployment.ingest, 0, 20_000, 20_000.0, timeout=FEED_WAIT_S) == 20_000
        result = sub.result(timeout=FEED_WAIT_S)
    finally:
        problems = deployment.close()
    assert not problems
    assert not result["losses"]
    first = result["records"][0][0]
    assert result["records"] == expected(first, 20_000)
    assert result["sources"].get("live:A", 0) + result["sources"].get("live:B", 0) > 0.9 * (20_001 - first)
    assert result["summary"]["duplicates_dropped"] > 0  # both feeds delivered; the first copy won


CLOCK_SENDER = """import sys, time, zmq
from gateway.mcast import Endpoint, Tuning, open_pub
sender = open_pub(zmq.Context.instance(), Endpoint.parse(sys.argv[1]), Tuning(rate_kbps=2_000))
end, i = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:  # as fast as the stream takes them: its transmit timer never rests
    try:
        sender.send_multipart([b"t.norm", b"%d" % i, bytes(1000)], zmq.NOBLOCK)
        i += 1
    except zmq.Again:
        time.sleep(0.001)
sender.close(500)
"""


def arrivals(endpoint: str, seconds: float, receiving: Path) -> list[tuple[int, float]]:
    """(number, time.monotonic()) of each message received within `seconds`; `receiving` is created at the first."""
    got = []
    with open_sub(zmq.Context.instance(), Endpoint.parse(endpoint), Tuning(), [STREAM.decode()]) as sub:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if sub.poll(100):
                got.append((int(sub.recv_multipart()[1]), time.monotonic()))
                if len(got) == 1:
                    receiving.touch()
    return got


def test_a_sender_whose_wall_clock_steps_back_keeps_sending(make_lab, tmp_path) -> None:
    """libnorm times its sending with gettimeofday(): a wall clock stepped back 30 s stopped the sender for 30 s
    (its stream full, a gateway's publishers waiting: issue #34). The sender restarts on the new clock."""
    lab = make_lab(["pub", "sub"])
    clock = WallClock(tmp_path / "clock")
    receiving = tmp_path / "receiving"
    sub = lab.start("sub", arrivals, endpoint(lab, "sub"), 12.0, receiving)
    time.sleep(1.0)
    start = time.monotonic()
    sender = lab.popen("pub", [sys.executable, "-c", CLOCK_SENDER, endpoint(lab, "pub"), "6"], env=clock.env(),
                       stderr=subprocess.PIPE, text=True)  # fmt: skip
    while not receiving.exists() and time.monotonic() < start + 5.0:  # a loaded host starts the two slowly
        time.sleep(0.05)
    time.sleep(1.0)
    clock.step(-30.0)
    stepped = time.monotonic()
    _, err = sender.communicate(timeout=WAIT_S)
    got = sub.result(timeout=WAIT_S)
    assert sender.returncode == 0, err
    assert got and got[0][1] < stepped, got[:3]
    late = [t for _, t in got if t > stepped + 1.0]
    assert late and late[-1] > start + 5.0, f"nothing after the step: {len(got)} messages, the last at {got[-1]}"
    silences = [b - a for (_, a), (_, b) in itertools.pairwise(got)]
    assert max(silences) < 1.0
    assert "the wall clock went back 30.0 s" in err


# A failover's shape on norm://: the old leader's gateway multicasts until killed -9 or stopped; the new
# leader's gateway has had its sender open (idle, as a follower's is) on the same group with its own NORM node
# id, and starts sending. Messages carry their send time (time.monotonic(): one clock for every namespace).
OLD_SENDER = """import sys, time, zmq
from gateway.mcast import Endpoint, Tuning, open_pub
sender = open_pub(zmq.Context.instance(), Endpoint.parse(sys.argv[1]), Tuning(rate_kbps=20_000))
i = 0
while True:  # until killed or stopped: a leader multicasting
    try:
        sender.send_multipart([b"t.norm", b"old", b"%d" % i, repr(time.monotonic()).encode()], zmq.NOBLOCK)
        i += 1
    except zmq.Again:
        pass
    time.sleep(0.005)
"""
SUCCESSOR_MESSAGES = 50
NEW_SENDER_BOUND_S = 0.7  # generous for a loaded 2-core machine; issue #30's whole budget is 1 s


def successor(endpoint: str, go: Any, done: Any) -> None:
    """A sender opened at once and left idle until `go` (a follower's gateway), then SUCCESSOR_MESSAGES at 200/s."""
    sender = open_pub(zmq.Context.instance(), Endpoint.parse(endpoint), Tuning(rate_kbps=20_000))
    assert isinstance(sender, NormSender)
    deadline = time.monotonic() + WAIT_S
    while not go.wait(0.01):
        sender.push()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go within {WAIT_S} s")
    for i in range(SUCCESSOR_MESSAGES):
        sender.send_multipart([STREAM, b"new", b"%d" % i, repr(time.monotonic()).encode()])
        time.sleep(0.005)
    done.wait(WAIT_S)
    sender.close()


def stamped(endpoint: str, heard: Any) -> list[tuple[bytes, int, float, float]]:
    """(sender, number, sent, arrived) of each message until the successor's last; `heard` gets the first."""
    got: list[tuple[bytes, int, float, float]] = []
    with open_sub(zmq.Context.instance(), Endpoint.parse(endpoint), Tuning(), [STREAM.decode()]) as sub:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if not sub.poll(100):
                continue
            frames = sub.recv_multipart()
            got.append((frames[1], int(frames[2]), float(frames[3]), time.monotonic()))
            if len(got) == 1:
                heard.put(frames[1])
            if frames[1] == b"new" and int(frames[2]) == SUCCESSOR_MESSAGES - 1:
                break
    return got


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_new_sender_after_a_failover_is_delivered_at_once(make_lab, fault: str) -> None:
    """Issue #30: after a failover the subscriber seemed to take 2 s to receive the new leader's NORM sender.
    The old sender is killed -9 (or SIGSTOPped, its repairs pending, then continued) mid-stream; the new one,
    idle on the group until then, starts sending: its first message is delivered within NEW_SENDER_BOUND_S,
    and all of them in order (measured here: 15-120 ms at load 5-17; the 2 s were the new leader's first
    commit, which on norm:// came late for other reasons, not NORM)."""
    lab = make_lab(["old", "new", "sub"])
    heard, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", stamped, endpoint(lab, "sub"), heard)
    new = lab.start("new", successor, endpoint(lab, "new"), go, done)
    old = lab.popen("old", [sys.executable, "-c", OLD_SENDER, endpoint(lab, "old")])
    try:
        assert heard.get(timeout=WAIT_S) == b"old"
        time.sleep(0.5)  # mid-stream
        old.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        time.sleep(0.3)  # the failover
        go.set()
        got = sub.result(timeout=WAIT_S)
    finally:
        old.send_signal(signal.SIGCONT)
        old.kill()
        old.wait(10)
        done.set()
    new.result(timeout=WAIT_S)
    from_new = [(i, arrived - sent) for who, i, sent, arrived in got if who == b"new"]
    assert [i for i, _ in from_new] == list(range(SUCCESSOR_MESSAGES))
    assert len(got) > len(from_new)  # the old sender was heard too
    first, median = from_new[0][1], sorted(h for _, h in from_new)[len(from_new) // 2]
    print(f"norm:// {fault}: the new sender's first message came {first * 1000:.1f} ms after its send (median "
          f"{median * 1000:.1f} ms)")  # fmt: skip
    assert first < NEW_SENDER_BOUND_S
