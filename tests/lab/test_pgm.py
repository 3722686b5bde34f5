"""PGM through libpgm (gateway.transport.pgm) between lab hosts: every message, in order, with its content.

Senders and receivers run in different namespaces (libzmq's PGM, and ours by default, do not loop multicast
back). Each receiver checks every message against the one it expects next (frames and bytes), so loss,
reordering, duplication or corruption all fail the test. A warm-up handshake makes sure receivers are joined
before the checked messages start, except where joining late is the point: a receiver reports once it has
seen the sender's warm-up messages for JOINED_S. Its first one is not enough: an OpenPGM receiver can NAK only
once an SPM told it the sender's address, and until then it counts every loss as unrecoverable at once
(OpenPGM receiver.c, nak_rb_state: "have not learned this peers NLA"). SPMs come in answer to the receiver's SPMR
and as heartbeats, but a heartbeat follows only a pause of the sender's (1 ms): while it is rate limited back
to back (the checked messages) they thin out to the ambient SPM, once a second (tshark saw gaps of 0.2-0.36 s).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import pytest
import zmq
from support.numbered import number, numbered

from gateway.mcast import Endpoint, Tuning, open_pub, open_sub
from gateway.transport import pgm
from gateway.transport.pgm import PgmReceiver, PgmSender, PgmSettings
from netlab import MP, Lab
from netlab.impair import Impairment, clear, impair
from netlab.packets import inject


def openpgm(**settings: Any) -> Tuning:
    """Tuning for gateway.transport.pgm, this file's subject (the default engine; explicit here)."""
    return Tuning(libzmq_pgm=False, **settings)


pytestmark = pytest.mark.lab

STREAM = b"t.pgm"
PORT = 5555
WAIT_S = 40.0
# Around the v1 encoder's short/long size (254/255 with the flags byte) and one, two and many TPDUs.
SIZES = (0, 1, 100, 253, 254, 255, 1400, 1500, 4096, 9000, 65536)
WARM_UP = b"warm-up"
JOINED_S = 0.2  # warm-up traffic (about 10 warm-ups, each followed by heartbeat SPMs) before a receiver reports
ROGUE = b"rogue"


def message(i: int, sizes: tuple[int, ...] = SIZES) -> list[bytes]:
    return numbered(STREAM, i, sizes)


def receive(endpoint: str, count: int, ready: Any, progress: Any = None, sizes: tuple[int, ...] = SIZES,
            stall: tuple[int, float] | None = None, sub_tuning: Tuning | None = None,
            gaps_ok: bool = False) -> dict[str, Any]:  # fmt: skip
    """Check messages until the last one (count - 1); report the first, the number received, the gaps (with
    `stall`, stop reading for stall[1] s at message stall[0]; gaps are a problem unless stalling or `gaps_ok`)
    or the problem, and the receiver's counters."""
    gaps_ok = gaps_ok or stall is not None
    with open_sub(zmq.Context.instance(), Endpoint.parse(endpoint), sub_tuning or openpgm(), [STREAM.decode()]) as sub:
        phases: dict[bytes, float | None] = {}  # each warm-up phase's first arrival; None once reported
        first = expect = None
        received, gaps, problem, rogue = 0, [], None, 0
        deadline = time.monotonic() + WAIT_S
        while expect != count and problem is None:
            if time.monotonic() > deadline:
                problem = f"timeout after {received} messages, next expected {expect}"
                break
            if not sub.poll(100):
                continue
            frames = sub.recv_multipart()
            if frames[1] == WARM_UP:
                since = phases.setdefault(frames[2], time.monotonic())
                if since is not None and time.monotonic() - since >= JOINED_S:
                    phases[frames[2]] = None
                    ready.put(frames[2])
                continue
            if frames[1].startswith(ROGUE):
                rogue += is_rogue(frames)
                continue
            i = number(frames)
            if first is None:
                first = expect = i
            assert expect is not None
            if frames != message(i, sizes) or i < expect or (i > expect and not gaps_ok):
                problem = f"message {i} (expected {expect}): {[f[:12] for f in frames]} {[len(f) for f in frames]}"
                break
            if i > expect:
                gaps.append((expect, i - 1))
            received += 1
            expect = i + 1
            if progress is not None and i % 100 == 0:
                progress.put(i)
            if stall is not None and i == stall[0]:
                time.sleep(stall[1])
        quiet_until = time.monotonic() + 0.3
        while problem is None and sub.poll(max(1, int(1000 * (quiet_until - time.monotonic())))):
            frames = sub.recv_multipart()
            if frames[1].startswith(ROGUE):  # the rogue's session may outlast the feed's on a loaded machine
                rogue += is_rogue(frames)
                quiet_until = time.monotonic() + 0.3
            elif frames[1] != WARM_UP:  # a sender's keep-alive may follow the last message
                problem = f"a message after the last one: {[f[:12] for f in frames]}"
            if time.monotonic() >= quiet_until:
                break
        stats = sub.stats if isinstance(sub, PgmReceiver) else None
        return {"first": first, "received": received, "problem": problem, "gaps": gaps, "stats": stats,
                "rogue": rogue}  # fmt: skip


def send(endpoint: str, tuning: Tuning, lo: int, hi: int, go: Any, done: Any, per_s: float = 0.0,
         sizes: tuple[int, ...] = SIZES, keep_alive: bool = False) -> dict[str, Any]:  # fmt: skip
    """Warm up until `go`, then send messages lo..hi-1 (paced at per_s, or as fast as the sender takes them).

    Sends with NOBLOCK and counts zmq.Again: backpressure, never loss. Stays until `done` (repairs need the
    sender), then closes; with `keep_alive`, sends a warm-up message every 10 ms meanwhile (see
    test_a_burst_of_losses_is_repaired).
    """
    sender = open_pub(zmq.Context.instance(), Endpoint.parse(endpoint), tuning)
    assert isinstance(sender, PgmSender)
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
                    raise TimeoutError(f"the PGM sender took no message for {WAIT_S} s (message {i})") from None
                time.sleep(0.001)
        if per_s:
            time.sleep(max(0.0, started + (i - lo + 1) / per_s - time.monotonic()))
    elapsed = time.monotonic() - started
    stop = time.monotonic() + WAIT_S
    while keep_alive and not done.wait(0.01) and time.monotonic() < stop:
        with contextlib.suppress(zmq.Again):
            sender.send_multipart([STREAM, WARM_UP, phase], zmq.NOBLOCK)
    done.wait(max(0.0, stop - time.monotonic()))
    sender.close()
    return {"again": again, "elapsed": elapsed, "stats": sender.stats}


def endpoint(lab: Lab, host: str, group: int = 1, transport: str = "epgm") -> str:
    return f"{transport}://{lab.host(host).ip};{lab.group(group)}:{PORT}"


def run(lab: Lab, count: int, tuning: Tuning, subs: tuple[str, ...] = ("sub",), per_s: float = 0.0,
        sizes: tuple[int, ...] = SIZES, stall: tuple[int, float] | None = None, sub_tuning: Tuning | None = None,
        keep_alive: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Send `count` messages from "pub" to receivers on `subs`, once all are joined; their results and the sender's."""
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    receivers = [lab.start(h, receive, endpoint(lab, h), count, ready, None, sizes, stall, sub_tuning) for h in subs]
    sender = lab.start("pub", send, endpoint(lab, "pub"), tuning, 0, count, go, done, per_s, sizes, keep_alive)
    for _ in subs:
        ready.get(timeout=WAIT_S)
    go.set()
    results = [r.result(timeout=2 * WAIT_S) for r in receivers]
    done.set()
    return results, sender.result(timeout=WAIT_S)


def test_every_message_arrives_in_order_with_content_and_backpressure_holds_the_rate(make_lab) -> None:
    lab = make_lab(["pub", "sub1", "sub2"])
    count = 4 * len(SIZES) * 25  # 1,100 messages, about 8 MB
    total_bytes = sum(sum(map(len, message(i))) for i in range(count))
    tuning = openpgm(rate_kbps=50_000, sndhwm=16)
    results, sent = run(lab, count, tuning, ("sub1", "sub2"))
    for got in results:
        assert (got["first"], got["received"], got["problem"], got["gaps"]) == (0, count, None, [])
        assert got["stats"].lost == 0
    # The burst is far larger than the queue: the sender pushed back, and the data left at the set rate.
    assert sent["again"] > 0
    assert sent["elapsed"] >= 0.8 * total_bytes * 8 / (tuning.rate_kbps * 1000)


def test_lost_packets_are_repaired(make_lab) -> None:
    """5% random loss on the receiver's link: every lost packet is repaired, nothing is given up on.

    A receiver here is a bare PgmReceiver, with no replay behind it: a sequence OpenPGM gives up on is a
    reset and a hole (in the product the subscriber fetches it from the replay sidecar). OpenPGM gives up on
    a sequence when the sender no longer holds it (its transmit window: recovery_ivl at the rate, 3,333
    sequences at 2 s and 20 Mbit/s, about 1.65 s of this traffic), or when the receiver's NAK retries run out
    first: 255 rounds of nak_rpt_ivl or nak_rdata_ivl, counted once per turn of the receiver's loop, 0.5 to
    0.64 s with the LAN defaults of 2 ms. The messages cycle SIZES (about 7.5 MB, 6,050 TPDUs, 3 s at the
    rate). On a CI host at load 8 the receiver once got 0..9 and then 212 (issue #34): messages 10..211 are
    0.62 s of this traffic, the retry budget, not the window. So this test, which is about repair and not
    about the default timers' margin on a starved host, gives the receiver 10 ms NAK rounds (a budget of
    about 2.6 s) and the sender a 5 s window (8,333 sequences, about 4.1 s of this traffic) that outlasts it.
    (A receiver that lacks the sender's SPM loses at once; the warm-up handshake, JOINED_S, rules that out.)
    """
    lab = make_lab(["pub", "sub"])
    count = 1_000
    timers = PgmSettings(nak_rpt_ivl_us=10_000, nak_rdata_ivl_us=10_000)  # rate and window come from the Tuning
    tuning = openpgm(rate_kbps=20_000, recovery_ivl_ms=5_000, pgm=timers)
    impair(lab, "sub", Impairment(loss_pct=5.0))
    try:
        results, sent = run(lab, count, tuning, per_s=500.0, sub_tuning=tuning)
    finally:
        clear(lab, "sub")
    got = results[0]
    report = f"receiver {got['stats']}, sender {sent['stats']}"  # a reset (lost > 0), an overrun or junk
    assert (got["first"], got["received"], got["problem"], got["gaps"]) == (0, count, None, []), report
    assert got["stats"].repairs > 0, report
    assert got["stats"].lost == 0, report


def test_a_burst_of_losses_is_repaired(make_lab) -> None:
    lab = make_lab(["pub", "sub"])
    count = 1_000
    # About 6,000 packets reach the receiver: at 2% in bursts of 50 that is 2.4 bursts on average, none at all in
    # about one run in eleven (CI saw it: repairs == 0). At 3% in bursts of 20: 9 on average, none 1 in 10,000.
    impair(lab, "sub", Impairment(loss_pct=3.0, loss_burst=20))
    # netem's Gilbert model counts packets, not time: a burst that takes the last data also takes the sparse
    # SPMs after it (about one a second once the heartbeats end), and would last ~50 s on those alone. The
    # sender's keep-alive traffic ends the burst as live traffic would.
    try:
        results, _ = run(lab, count, openpgm(rate_kbps=20_000), per_s=500.0, keep_alive=True)
    finally:
        clear(lab, "sub")
    got = results[0]
    assert (got["first"], got["received"], got["problem"], got["gaps"]) == (0, count, None, [])
    assert got["stats"].repairs > 0


def test_a_late_joiner_receives_a_contiguous_tail(make_lab) -> None:
    lab = make_lab(["pub", "early", "late"])
    count = 1_000
    ready, late_ready, progress, go, done = MP.Queue(), MP.Queue(), MP.Queue(), MP.Event(), MP.Event()
    early = lab.start("early", receive, endpoint(lab, "early"), count, ready, progress)
    sender = lab.start("pub", send, endpoint(lab, "pub"), openpgm(rate_kbps=50_000), 0, count, go, done, 250.0)
    ready.get(timeout=WAIT_S)
    go.set()
    while progress.get(timeout=WAIT_S) < 300:  # join well into the stream
        pass
    late = lab.start("late", receive, endpoint(lab, "late"), count, late_ready)
    got_late = late.result(timeout=2 * WAIT_S)
    got_early = early.result(timeout=WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert (got_early["first"], got_early["received"], got_early["problem"]) == (0, count, None)
    assert got_late["problem"] is None
    assert got_late["first"] > 300
    assert got_late["received"] == count - got_late["first"]  # every message from its first to the last


def test_a_consumer_that_stops_reading_loses_a_range_then_gets_whole_messages(make_lab) -> None:
    """The receiver stops reading for 2 s while the sender goes on: no crash (libzmq 4.3.4 aborts the process
    here), bounded memory (hwm messages); after the stall, whole and correct messages again up to the last."""
    lab = make_lab(["pub", "sub"])
    count, sizes = 4_000, (100, 4096, 9000)
    tuning = openpgm(rate_kbps=100_000, recovery_ivl_ms=200)
    results, _ = run(lab, count, tuning, per_s=1000.0, sizes=sizes, stall=(300, 2.0))
    got = results[0]
    assert got["problem"] is None
    assert got["first"] == 0
    assert got["gaps"] and got["gaps"][0][0] > 300
    dropped = sum(hi - lo + 1 for lo, hi in got["gaps"])
    assert got["stats"].overruns == dropped or (got["stats"].resets and got["stats"].overruns < dropped)


def test_after_an_unrecoverable_loss_the_receiver_goes_on(make_lab) -> None:
    """The link to the receiver is cut for 1 s while the sender, which keeps only 0.1 s for repairs, goes on:
    OpenPGM reports the loss (a reset), the receiver starts a new session and delivers whole messages again,
    the gap and everything after it up to the last."""
    lab = make_lab(["pub", "sub"])
    count = 3_000
    ready, progress, go, done = MP.Queue(), MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", receive, endpoint(lab, "sub"), count, ready, progress, SIZES, None, None, True)
    tuning = openpgm(rate_kbps=50_000, recovery_ivl_ms=100)
    sender = lab.start("pub", send, endpoint(lab, "pub"), tuning, 0, count, go, done, 500.0)
    ready.get(timeout=WAIT_S)
    go.set()
    while progress.get(timeout=WAIT_S) < 500:
        pass
    impair(lab, "sub", Impairment(loss_pct=100.0))
    time.sleep(1.0)
    clear(lab, "sub")
    got = sub.result(timeout=2 * WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert got["problem"] is None
    assert got["first"] == 0
    assert got["gaps"] and got["gaps"][0][0] > 500
    assert got["received"] == count - sum(hi - lo + 1 for lo, hi in got["gaps"])  # the last one came
    assert got["stats"].resets >= 1


ZMQ_SIZES = (0, 1, 254, 255, 1000, 4096, 9000)


def zmq_sub(endpoint: str, count: int, ready: Any) -> dict[str, Any]:
    """libzmq's own epgm:// engine (a plain SUB, through `Tuning.libzmq_pgm`), checking messages like `receive`."""
    with zmq.Context() as ctx:
        sub = open_sub(ctx, Endpoint.parse(endpoint), Tuning(libzmq_pgm=True, linger_ms=0), [STREAM.decode()])
        assert isinstance(sub, zmq.Socket)
        try:
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
                if frames != message(expect, ZMQ_SIZES):
                    problem = f"message {number(frames)} (expected {expect})"
                expect += 1
        finally:
            sub.close()
        return {"received": expect, "problem": problem}


def zmq_pub(endpoint: str, count: int, go: Any, done: Any) -> None:
    """A plain libzmq epgm:// PUB: messages sent back to back, so that libzmq packs several in one APDU."""
    with zmq.Context() as ctx, ctx.socket(zmq.PUB) as pub:
        pub.setsockopt(zmq.SNDHWM, 0)
        Tuning().apply(pub, Endpoint.parse(endpoint))
        pub.connect(endpoint)
        deadline = time.monotonic() + WAIT_S
        while not go.wait(0.02):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no receiver joined within {WAIT_S} s")
            pub.send_multipart([STREAM, WARM_UP, b"0"])
        for i in range(count):
            pub.send_multipart(message(i, ZMQ_SIZES))
            if i % 50 == 49:
                time.sleep(0.005)
        done.wait(WAIT_S)


@pytest.mark.parametrize("transport", ["epgm", "pgm"])
def test_the_wire_is_libzmq_pgm_both_ways(make_lab, transport: str) -> None:
    lab = make_lab(["pub", "sub"])
    count = 1_000
    # gateway.transport.pgm sender -> libzmq SUB.
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", zmq_sub, endpoint(lab, "sub", 1, transport), count, ready)
    sender = lab.start("pub", send, endpoint(lab, "pub", 1, transport), openpgm(rate_kbps=20_000), 0, count, go,
                       done, 0.0, ZMQ_SIZES)  # fmt: skip
    ready.get(timeout=WAIT_S)
    go.set()
    assert sub.result(timeout=2 * WAIT_S) == {"received": count, "problem": None}
    done.set()
    sender.result(timeout=WAIT_S)
    # libzmq PUB -> PgmReceiver (on another group).
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", receive, endpoint(lab, "sub", 2, transport), count, ready, None, ZMQ_SIZES)
    sender = lab.start("pub", zmq_pub, endpoint(lab, "pub", 2, transport), count, go, done)
    ready.get(timeout=WAIT_S)
    go.set()
    got = sub.result(timeout=2 * WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert (got["first"], got["received"], got["problem"], got["gaps"]) == (0, count, None, [])


def rogue_message(i: int) -> list[bytes]:
    return [STREAM, ROGUE + b"%d" % i, bytes(SIZES[i % len(SIZES)])]


def is_rogue(frames: list[bytes]) -> bool:
    """A well-framed message of the rogue sender's, whole."""
    return frames == rogue_message(int(frames[1][len(ROGUE) :]))


def rogue(endpoint: str, count: int) -> int:
    """A second PGM session on the group: `count` well-framed messages of the feed's stream, each followed by
    an APDU of random bytes (a sender that is not libzmq's framing); returns the messages sent. It sends with
    the Python send loop, whose queue takes APDUs as they are (the native one cuts every message itself)."""
    pgm._native = None  # this process's senders only (a lab host's own interpreter)
    sender = open_pub(zmq.Context.instance(), Endpoint.parse(endpoint), openpgm(rate_kbps=20_000))
    assert isinstance(sender, PgmSender) and isinstance(sender._loop, pgm._PythonSendLoop)
    for i in range(count):
        sender.send_multipart(rogue_message(i))
        assert sender._loop.queue([os.urandom(1 + i % 1400)], WAIT_S)
        time.sleep(0.005)
    sender.close()
    return count


def test_junk_and_a_rogue_sender_on_the_group_do_not_disturb_the_feed(make_lab) -> None:
    """Random datagrams on the port, and a second PGM session sending other streams' messages and messages that
    are not libzmq's framing: the feed's receiver still gets every message of its sender, nothing else."""
    lab = make_lab(["pub", "sub", "rogue"])
    count = 1_500
    ready, go, done = MP.Queue(), MP.Event(), MP.Event()
    sub = lab.start("sub", receive, endpoint(lab, "sub"), count, ready)
    sender = lab.start("pub", send, endpoint(lab, "pub"), openpgm(rate_kbps=20_000), 0, count, go, done, 300.0)
    ready.get(timeout=WAIT_S)
    go.set()
    forger = lab.start("rogue", rogue, endpoint(lab, "rogue"), 200)  # while the junk goes: within the feed's 5 s
    junk = inject(lab, "rogue", lab.group(1), PORT, count=300, size=200, pps=200.0)
    forged = forger.result(timeout=WAIT_S)
    got = sub.result(timeout=2 * WAIT_S)
    done.set()
    sender.result(timeout=WAIT_S)
    assert junk == 300
    assert (got["first"], got["received"], got["problem"], got["gaps"]) == (0, count, None, [])
    assert got["rogue"] == forged  # each sender's stream is parsed apart: the rogue's framed messages are whole
    assert got["stats"].junk > 0
