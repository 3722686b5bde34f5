"""The Subscriber against a replay sidecar that is dead, frozen, refusing, half-answering, killed and
restarted, or started before its journal exists: real `zeps replay` processes on loopback.

What must hold whatever the sidecar does: `next(timeout=t)` returns within t + 50 ms, final refusals raise
within seconds, transient failures cost almost no CPU, and every record arrives once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from support.deadlines import SLACK_S, States, Stopwatch, exercise_deadlines
from support.servers import Side, Stream, free_port, side

from gateway import reconcile as R
from gateway.client.async_subscriber import AsyncSubscriber
from gateway.client.link_state import LinkState
from gateway.client.replay_link import ReplayLink
from gateway.client.subscriber import Subscriber
from gateway.client.subscriber_stats import SubscriberStats
from gateway.errors import Closed, ReplayRefused
from gateway.tools.deployment import Keys
from gateway.wire import batch as B
from gateway.wire import protocol as P

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def half_server() -> Iterator[str]:
    """A ZEPS server that answers ATTACH and then nothing: a client stuck in the middle of its handshake."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if router.poll(50):
                identity, frame = router.recv_multipart()
                if isinstance(P.decode(frame), P.Attach):
                    router.send_multipart([identity, P.encode(P.AttachOk())])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(5)
        router.close()


def new_subscriber(endpoint: str, **options) -> Subscriber:
    watch = Stopwatch()
    sub = Subscriber("orders", replay=endpoint, start="earliest", replay_timeout=1.0, **options)
    assert watch.own() < SLACK_S, "the constructor waited on the network"
    return sub


def test_next_keeps_its_deadline_whatever_the_sidecar_does(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(50)

    # Dead: nothing listens. With one sidecar, a refused TCP connect is retried until the handshake deadline
    # (replay_timeout): "retrying" at 1 s and 2.1 s, each for one backoff (0.05-0.2 s), which may begin and end
    # inside one next() call: every state reported is recorded (`States`), not sampled between calls.
    states = States()
    with new_subscriber(f"tcp://127.0.0.1:{free_port()}", on_replay_state=states) as sub:
        assert exercise_deadlines(sub, 3.0) <= {"connecting", "retrying"}
        assert sub.summary()["replay_retries"] >= 2
    assert set(states) == {"connecting", "retrying"}, states

    # Mid-handshake: ATTACH-OK, then silence (EXTEND is never answered).
    states = States()
    with half_server() as endpoint, new_subscriber(endpoint, on_replay_state=states) as sub:
        exercise_deadlines(sub, 3.0)
        assert "retrying" in states, states

    with side(root) as sidecar:
        # Frozen before we come (SIGSTOP): TCP connects (the kernel completes it into the listen backlog), and
        # ZeroMQ's greeting never comes: "retrying" at the handshake deadline, as above.
        sidecar.signal(signal.SIGSTOP)
        states = States()
        with new_subscriber(sidecar.endpoint, on_replay_state=states) as sub:
            exercise_deadlines(sub, 2.5)
            assert "retrying" in states, states
            # Thawed: the records come, each once, in order.
            sidecar.signal(signal.SIGCONT)
            got = drain(sub, len(s.records))
            assert got == s.expected()
            # Frozen mid-stream (slow): the records so far are in; next() still keeps its deadline.
            sidecar.signal(signal.SIGSTOP)
            exercise_deadlines(sub, 2.0)
            sidecar.signal(signal.SIGCONT)
            s.write(10)
            assert drain(sub, 100) == s.expected(after=500)

    # Refusing: CURVE on the server, none here. Final: raised, and at every call after.
    keys = Keys.create(tmp_path / "keys")
    with side(root, *keys.server_args()) as sidecar, new_subscriber(sidecar.endpoint) as sub:
        began = time.monotonic()
        with pytest.raises(ReplayRefused, match="give --curve-key and --curve-server"):
            while time.monotonic() - began < 10:
                sub.next(timeout=0.1)
        assert time.monotonic() - began < 5
        assert sub.replay_state == "failed"
        for t in (0.0, 0.1):
            watch = Stopwatch()
            with pytest.raises(ReplayRefused):
                sub.next(timeout=t)
            assert watch.own() <= t + SLACK_S
    s.writer.close()


def drain(sub: Subscriber, count: int, within: float = 30.0) -> list[tuple]:
    got: list[tuple] = []
    deadline = time.monotonic() + within
    while len(got) < count and time.monotonic() < deadline:
        rec = sub.next(timeout=0.2)
        if rec is not None:
            got.append((rec.seq, rec.key, rec.body))
    return got


def cpu_seconds_while(action: Callable[[], None]) -> float:
    began = time.process_time()
    action()
    return time.process_time() - began


def keep_calling(sub: Subscriber, seconds: float, timeout: float = 0.5) -> Callable[[], None]:
    def call() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert sub.next(timeout=timeout) is None

    return call


def test_a_restarted_sidecar_costs_little_cpu_while_down_and_loses_nothing(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(20)
    states: list[tuple[str, str | None]] = []
    port = free_port()
    sidecar = Side(root, port)
    try:
        with Subscriber(
            "orders",
            replay=sidecar.endpoint,
            start="earliest",
            replay_timeout=1.0,
            on_replay_state=lambda state, error: states.append((state, error and str(error))),
        ) as sub:
            assert drain(sub, 200) == s.expected()
            sidecar.kill9()
            s.write(20)  # journaled while the sidecar is down
            # Replay only: nothing to poll between tries. The loop must sleep, not spin.
            cpu = cpu_seconds_while(keep_calling(sub, 3.0))
            assert cpu < 0.3, f"{cpu:.2f} s of CPU in 3 s while the sidecar was down"
            assert sub.replay_state in ("connecting", "retrying")
            sidecar.start()
            s.write(10)
            assert drain(sub, 300) == s.expected(after=200)
            assert sub.replay_state == "ready"
            assert sub.next(timeout=0.3) is None  # nothing twice
    finally:
        sidecar.stop()
        s.writer.close()
    assert ("retrying", None) not in states and any(state == "retrying" and error for state, error in states)
    assert states[-1] == ("ready", None)


def test_a_dead_endpoint_costs_little_cpu(tmp_path: Path) -> None:
    with Subscriber("orders", replay=f"tcp://127.0.0.1:{free_port()}", start="earliest", replay_timeout=1.0) as sub:
        cpu = cpu_seconds_while(keep_calling(sub, 3.0))
    assert cpu < 0.3, f"{cpu:.2f} s of CPU in 3 s against a dead endpoint"


def test_final_refusals_raise_within_seconds(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(40)
    s.writer.close()
    # A corrupt journal: a batch in the middle of the segment overwritten.
    bad = Stream(root, "broken")
    bad.write(40)
    bad.writer.close()
    (segment,) = sorted((root / "broken").glob("*.seg"))
    with open(segment, "r+b") as f:
        f.seek(segment.stat().st_size // 2)
        f.write(b"\xff" * 64)
    with side(root) as sidecar:
        cases = {
            ("nosuch", "earliest"): "unknown stream 'nosuch'",
            ("broken", "earliest"): "corrupt",
            ("orders", "snapshot"): None,  # works: the control
        }
        for (stream, start), reason in cases.items():
            began = time.monotonic()
            with Subscriber(stream, replay=sidecar.endpoint, start=start, replay_timeout=1.0) as sub:
                if reason is None:
                    assert sub.next(timeout=10) is not None
                    continue
                with pytest.raises(ReplayRefused, match=reason):
                    drain(sub, 10**6, within=10)
            assert time.monotonic() - began < 5, f"{stream}: {reason} took {time.monotonic() - began:.1f} s"
        # The command line: exit 1 and the reason, not 0 and nothing.
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "subscribe", "--replay", sidecar.endpoint, "--stream", "nosuch",
             "--from", "earliest", "--timeout", "20"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1 and "unknown stream 'nosuch'" in done.stderr, done.stderr
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "subscribe", "--replay", sidecar.endpoint, "--stream", "orders",
             "--from", "sometime"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and "sometime" in done.stderr, done.stderr


def test_without_multicast_latest_is_the_journal_head_then_the_live_tail(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(30)
    with side(root) as sidecar, Subscriber("orders", replay=sidecar.endpoint) as sub:
        assert sub.state == "STARTING"
        deadline = time.monotonic() + 10
        while sub.state == "STARTING" and time.monotonic() < deadline:
            assert sub.next(timeout=0.05) is None
        assert sub.state != "STARTING"
        s.write(5)
        assert drain(sub, 50) == s.expected(after=300)
        assert sub.next(timeout=0.3) is None
        # Caught up with the head the sidecar reports (#33 item 7): MERGED, as a subscriber with multicast.
        deadline = time.monotonic() + 10
        while sub.state != "MERGED" and time.monotonic() < deadline:
            assert sub.next(timeout=0.05) is None
        assert (sub.state, sub.head, sub.lag) == ("MERGED", s.head, 0)
    s.writer.close()


def test_a_sidecar_started_before_its_journal_waits_for_it(tmp_path: Path) -> None:
    root = tmp_path / "not-yet"
    with side(root) as sidecar:
        with Subscriber("orders", replay=sidecar.endpoint, start="earliest", replay_timeout=1.0) as sub:
            exercise_deadlines(sub, 1.5)
            assert sub.replay_state == "retrying"
            s = Stream(root, "orders")  # the gateway comes up
            s.write(20)
            assert drain(sub, 200) == s.expected()
            s.writer.close()
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "history", "--replay", sidecar.endpoint, "--stream", "orders"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0 and len(done.stdout.splitlines()) == 200
    log = sidecar.stderr()
    assert log.count("does not exist yet") == 1 and log.count("has appeared") == 1, log


def test_a_journal_without_streams_yet_is_waited_for_and_a_wrong_name_beside_one_is_final(tmp_path: Path) -> None:
    """The sidecar came up before its gateway opened the stream: the subscriber retries, then gets it all.
    Once the journal holds a stream, a name it does not hold is a mistake, refused for good."""
    root = tmp_path / "journal"
    root.mkdir()
    with side(root) as sidecar:
        with Subscriber("orders", replay=sidecar.endpoint, start="earliest", replay_timeout=1.0) as sub:
            exercise_deadlines(sub, 1.5)
            assert sub.replay_state == "retrying" and sub.failed is None
            s = Stream(root, "orders")  # the gateway has opened it
            s.write(20)
            assert drain(sub, 200) == s.expected()
            s.writer.close()
        wrong = Subscriber("ordres", replay=sidecar.endpoint, start="earliest", replay_timeout=1.0)
        with wrong, pytest.raises(ReplayRefused, match="unknown stream 'ordres'; streams here: orders"):
            drain(wrong, 1, within=10)


def test_the_async_subscriber_never_stalls_the_event_loop(tmp_path: Path) -> None:
    """A ticker on the same loop keeps ticking while the AsyncSubscriber waits on a dead, a frozen and a
    half-answering server, and while it is handed records."""
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(100)

    async def watch(endpoint: str, seconds: float, want: int = 0) -> tuple[float, int]:
        """The longest gap between 10 ms ticks (less the loop's waits for a CPU: support.deadlines), and the
        records received."""
        gaps: list[float] = []
        got = 0
        done = asyncio.Event()

        async def tick() -> None:
            gap = Stopwatch()
            while not done.is_set():
                await asyncio.sleep(0.01)
                gaps.append(gap.own())
                gap.restart()

        ticker = asyncio.create_task(tick())
        async with AsyncSubscriber("orders", replay=endpoint, start="earliest", replay_timeout=1.0) as sub:
            end = time.monotonic() + seconds
            while time.monotonic() < end and (not want or got < want):
                if await sub.next(timeout=0.3) is not None:
                    got += 1
        done.set()
        await ticker
        return max(gaps), got

    dead = asyncio.run(watch(f"tcp://127.0.0.1:{free_port()}", 3.0))
    with half_server() as endpoint:
        half = asyncio.run(watch(endpoint, 3.0))
    with side(root) as sidecar:
        flowing = asyncio.run(watch(sidecar.endpoint, 30.0, want=1000))
        sidecar.signal(signal.SIGSTOP)
        frozen = asyncio.run(watch(sidecar.endpoint, 3.0))
        sidecar.signal(signal.SIGCONT)
    s.writer.close()
    assert flowing[1] == 1000
    for name, (gap, _) in {"dead": dead, "half": half, "flowing": flowing, "frozen": frozen}.items():
        assert gap < 0.01 + SLACK_S, f"{name}: the event loop stalled for {gap:.3f} s"


def test_start_minus_n_is_the_last_n_and_topics_may_be_one_prefix(tmp_path: Path) -> None:
    """start=-N means the last N records, as `--from -N` does; topics="k1." is one prefix, not three letters."""
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(5)
    with side(root) as sidecar:
        with Subscriber("orders", replay=sidecar.endpoint, start=-3) as sub:
            assert drain(sub, 3) == s.expected(after=s.head - 3)
            assert sub.next(timeout=0.3) is None
        with Subscriber("orders", replay=sidecar.endpoint, start="earliest", topics="k1.") as sub:
            want = s.expected(prefix="k1.")
            assert 0 < len(want) < s.head and drain(sub, len(want)) == want
    s.writer.close()


def test_next_after_close_raises_at_once(tmp_path: Path) -> None:
    sub = Subscriber("orders", replay=f"tcp://127.0.0.1:{free_port()}", start="earliest")
    sub.close()
    watch = Stopwatch()
    for take in (sub.next, sub.next_batch):
        with pytest.raises(Closed, match="closed"):
            take(5.0)
    assert watch.own() < SLACK_S


def test_waiting_for_an_unreachable_sidecar_is_said_at_once_and_again(caplog: pytest.LogCaptureFixture) -> None:
    """A typo'd endpoint must not look like a quiet stream: a warning naming it within a second, then again
    with the time waited."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    caplog.set_level(logging.WARNING, logger="gateway.client.subscriber")
    with Subscriber("orders", replay=endpoint, start="earliest") as sub:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            sub.next(timeout=0.1)
        waited = sub.waiting_for_replay
    notices = [r.getMessage() for r in caplog.records if "waiting for the replay sidecar" in r.getMessage()]
    assert len(notices) >= 2 and all(endpoint in n for n in notices), notices
    assert "no answer for 0.5 s" in notices[0] and waited is not None and waited > 2.0, (notices, waited)


# --- the replay link alone ------------------------------------------------------------------------------------


def new_link(
    endpoint: str | list[str],
    events: list | deque,
    states: list,
    starts: list,
    head_every: float | None = None,
    timeout: float = 1.0,
) -> ReplayLink:
    return ReplayLink("orders", endpoint, topics=(), timeout=timeout, curve=None, ctx=zmq.Context.instance(),
                      directory=None, fill_udp=0, keys=(), stats=SubscriberStats(), emit=events.append,
                      next_seq=lambda: 1, on_start=starts.append,
                      on_state=lambda state, error: states.append(state), head_every=head_every)  # fmt: skip


def run_link(link: ReplayLink, until: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        poller = zmq.Poller()
        for pollable in link.pollables():
            poller.register(pollable, zmq.POLLIN)
        ready = dict(poller.poll(20)) if link.pollables() else {}
        link.turn(ready, time.monotonic())


def test_the_replay_link_alone_probes_requests_and_attributes_answers(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(10)
    events: list = []
    states: list = []
    starts: list = []
    with side(root) as sidecar:
        link = new_link(sidecar.endpoint, events, states, starts)
        try:
            link.probe(None)  # "latest" without multicast: the journal's head + 1
            run_link(link, lambda: bool(starts))
            assert starts == [s.head + 1] and link.state is LinkState.READY
            link.request(R.Request(7, 1, None))  # the catch-up: history, then the live tail
            link.request(R.Request(8, 3, 4))  # a fill, answered on its own connection

            def covered() -> int:
                return max((e.batch.last_seq for e in events if isinstance(e, R.Replay) and e.request_id == 7),
                           default=0)  # fmt: skip

            run_link(link, lambda: covered() >= s.head and any(isinstance(e, R.ReplayEnd) for e in events))
            assert covered() == s.head and R.ReplayEnd(8) in events
            fill = [e.batch for e in events if isinstance(e, R.Replay) and e.request_id == 8]
            assert fill and fill[0].first_seq <= 3 and fill[-1].last_seq >= 4
        finally:
            link.close()
    s.writer.close()
    assert states == ["ready"]


def test_the_replay_link_alone_reports_the_sidecars_head_without_multicast(tmp_path: Path) -> None:
    """A subscriber without multicast has no heartbeat: the link asks the sidecar's head, as HeadSeen events."""
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(10)
    events: list = []
    with side(root) as sidecar:
        link = new_link(sidecar.endpoint, events, [], [], head_every=0.05)
        try:
            link.request(R.Request(1, 1, None))
            run_link(link, lambda: R.HeadSeen(s.head, "replay") in events)
            s.write(2)
            run_link(link, lambda: R.HeadSeen(s.head, "replay") in events)
        finally:
            link.close()
    s.writer.close()
    heads = [e.head for e in events if isinstance(e, R.HeadSeen)]
    assert heads[0] == 100 and heads[-1] == s.head == 120 and heads == sorted(heads), heads


def test_the_replay_link_alone_retries_a_dead_sidecar() -> None:
    events: list = []
    states: list = []
    link = new_link(f"tcp://127.0.0.1:{free_port()}", events, states, [])
    try:
        link.request(R.Request(1, 1, None))
        run_link(link, lambda: link.state is LinkState.RETRYING, seconds=5)
        assert link.state is LinkState.RETRYING and events == [R.ReplayLost()] and link.waiting is not None
        run_link(link, lambda: link.state is LinkState.CONNECTING, seconds=5)
        assert events == [R.ReplayLost(), R.ReplayRestored()] and states == ["retrying", "connecting"]
    finally:
        link.close()


def glued(
    link: ReplayLink, events: deque, no_progress: list[float]
) -> tuple[R.Reconciler, Callable[[R.Event], None], Callable[[int], None]]:
    """A reconciler glued to `link` as the Subscriber glues them (its events queued in `events`, the times of its
    NoProgress in `no_progress`): it, `feed(event)`, and `filled_to(seq)`, which turns the link with a live
    heartbeat a turn until N passes `seq`."""
    rec = R.Reconciler(R.Start.latest(), progress_timeout=FILL_PROGRESS_S)

    def feed(event: R.Event) -> None:
        events.append(event)
        while events:
            for action in rec.handle(events.popleft(), time.monotonic()):
                match action:
                    case R.Request():
                        link.request(action)
                    case R.Cancel(request_id=rid):
                        link.cancel(rid)
                    case R.NoProgress(short=short):
                        no_progress.append(time.monotonic())
                        link.no_progress(time.monotonic(), short=short)

    def filled_to(seq: int) -> None:
        def done() -> bool:
            feed(R.HeadSeen(seq, "A"))  # a heartbeat a turn: live is alive
            return (rec.next_seq or 0) > seq

        run_link(link, done, seconds=15)
        assert (rec.next_seq or 0) > seq, rec.stats

    return rec, feed, filled_to


def fill_seconds(
    s: Stream, first: Side, second: Side, servers: int, *, new_epoch: bool = False, handshaking: bool = False
) -> tuple[float, int]:
    """The reconciler and the replay link (`glued`), with live batches made from the journal (multicast needs a
    namespace lab): a fill answered by `first`, then `first` frozen (SIGSTOP) and a gap; the seconds until the
    gap is filled (from `second`), with the reconciler told `servers` sidecars, and the reconciler's NoProgress
    since the freeze. `new_epoch`: `first` led epoch 1, and a heartbeat of epoch 2 naming `second` comes between
    the freeze and the gap (a failover, as the multicast shows it). `handshaking`: `first` is frozen before the link
    ever connected, and the gap is its first fill: the link is still handshaking with `first` (CONNECTING) when the
    heartbeat comes."""
    events: deque = deque()
    no_progress: list[float] = []
    link = new_link([first.endpoint, second.endpoint], events, [], [])
    _, feed, filled_to = glued(link, events, no_progress)
    live = [B.Batch.parse(sealed) for sealed in s.batches]
    try:
        feed(R.ReplayServers(servers))
        link.heard(first.endpoint, 1)
        feed(R.Live(live[0], "A"))
        if not handshaking:
            feed(R.Live(live[2], "A"))  # a gap (batch 1): filled by `first`, whose link is then READY
            filled_to(live[2].last_seq)
        first.signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            if handshaking:
                feed(R.Live(live[2], "A"))  # the gap (batch 1) asked of the frozen sidecar: its handshake hangs
                run_link(link, lambda: False, seconds=0.1)
                assert (link.state, link.endpoint) == (LinkState.CONNECTING, first.endpoint)
            if new_epoch:
                link.heard(second.endpoint, 2)
            gap = live[2] if handshaking else live[4]
            if not handshaking:
                feed(R.Live(gap, "A"))  # a gap (batch 3), asked of the frozen sidecar unless the link moved
            filled_to(gap.last_seq)
            return time.monotonic() - began, sum(at >= began for at in no_progress)
        finally:
            first.signal(signal.SIGCONT)
    finally:
        link.close()


FILL_PROGRESS_S = 2.0


def test_a_fill_at_a_frozen_sidecar_moves_to_the_next_within_the_first_answer_deadline(tmp_path: Path) -> None:
    """With two sidecars a fill that hears nothing moves on after FIRST_ANSWER_S (0.3 s); told of one, the
    reconciler waits out progress_timeout before NoProgress moves it (as before the first-answer deadline)."""
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(6)
    with side(root) as first, side(root) as second:
        waited, _ = fill_seconds(s, first, second, servers=1)
        moved, _ = fill_seconds(s, first, second, servers=2)
    s.writer.close()
    load = os.getloadavg()[0]
    print(f"\ngap fill with the sidecar frozen: {waited:.2f} s told of one sidecar, {moved:.2f} s told of two "
          f"(progress_timeout {FILL_PROGRESS_S} s, first answer {R.FIRST_ANSWER_S} s; load {load:.2f})")  # fmt: skip
    assert waited >= FILL_PROGRESS_S
    assert moved < FILL_PROGRESS_S / 2  # about FIRST_ANSWER_S + the reconnect backoff (0.1 s); generous for load


def test_a_fill_after_a_newer_epochs_heartbeat_goes_to_its_leaders_sidecar(tmp_path: Path) -> None:
    """The leader's sidecar frozen (SIGSTOP, as its node) and a heartbeat of a newer epoch naming the other one:
    the failover's gap is asked there first, with no failed attempt at the frozen one (before, the fill went to
    the frozen sidecar and moved on only at the first-answer deadline, 0.3 s, plus a backoff)."""
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(6)
    with side(root) as first, side(root) as second:
        stayed, failed_there = fill_seconds(s, first, second, servers=2)
        moved, failed_after_move = fill_seconds(s, first, second, servers=2, new_epoch=True)
    s.writer.close()
    print(
        f"\ngap fill with the old leader's sidecar frozen: {stayed:.2f} s without a newer epoch heard "
        f"({failed_there} failed attempts), {moved:.2f} s after one (load {os.getloadavg()[0]:.2f})"
    )
    assert failed_there >= 1  # the frozen sidecar was asked: the case the move is for
    assert failed_after_move == 0, "the fill went to the deposed leader's sidecar"


def test_a_newer_epochs_heartbeat_during_a_handshake_moves_the_link_to_its_leaders_sidecar(tmp_path: Path) -> None:
    """The link still handshaking with the old leader's sidecar (frozen, as its node: the kernel takes the
    connection, nothing answers) when a heartbeat of a newer epoch names the other one: the handshake is
    dropped and the fill asked at the leader's sidecar at once (ReplayLink._to_leader from CONNECTING: the
    reconciler told ReplayLost, then ReplayRestored), with no failed attempt (a NoProgress at the first-answer
    deadline, then a backoff)."""
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(6)
    with side(root) as first, side(root) as second:
        stayed, failed_there = fill_seconds(s, first, second, servers=2, handshaking=True)
        moved, failed_after_move = fill_seconds(s, first, second, servers=2, new_epoch=True, handshaking=True)
    s.writer.close()
    print(
        f"\nfirst fill with the old leader's sidecar frozen in the handshake: {stayed:.2f} s without a newer epoch "
        f"heard ({failed_there} failed attempts), {moved:.2f} s after one (load {os.getloadavg()[0]:.2f})"
    )
    assert failed_there >= 1  # the frozen sidecar was waited for: the case the move is for
    assert failed_after_move == 0, "the fill waited for the deposed leader's sidecar"


def test_a_fill_the_new_leaders_sidecar_answers_short_is_asked_there_again(tmp_path: Path) -> None:
    """The newest epoch's leader's sidecar holds less than the gap (before its first commit: the deposed leader
    multicast more than the new one has committed) and answers short; a follower's sidecar holds no more. The
    link stays at the leader's (no ReplayLost, no move) and the fill is asked there again, which answers in full
    once it has committed the rest; before, the short answer moved the link to the follower's sidecar, which
    answered short too, at a backoff and a handshake each."""
    live = Stream(tmp_path / "multicast", "orders")
    live.write(6)
    leader, follower = Stream(tmp_path / "leader", "orders"), Stream(tmp_path / "follower", "orders")
    leader.write(4)  # batches 0..3: the gap below (batches 3 and 4) is half there
    follower.write(3)
    events: deque = deque()
    no_progress: list[float] = []
    states: list[str] = []
    with side(tmp_path / "leader") as at_leader, side(tmp_path / "follower") as at_follower:
        link = new_link([at_follower.endpoint, at_leader.endpoint], events, states, [])
        rec, feed, filled_to = glued(link, events, no_progress)
        batches = [B.Batch.parse(sealed) for sealed in live.batches]
        try:
            feed(R.ReplayServers(2))
            link.heard(at_leader.endpoint, 5)  # the new leader's heartbeat: the link moves to its sidecar
            feed(R.Live(batches[0], "A"))
            feed(R.Live(batches[2], "A"))  # a gap (batch 1), filled at the leader's sidecar: READY there
            filled_to(batches[2].last_seq)
            assert states == ["ready"], states
            feed(R.Live(batches[5], "A"))  # a gap (batches 3 and 4): the leader's sidecar holds batch 3 only
            run_link(link, lambda: feed(R.Tick()) or bool(no_progress), seconds=10)  # the timers run on a Tick
            assert no_progress, "the leader's sidecar did not answer the fill short"
            leader.write(2)  # its first commit: it holds the gap now
            filled_to(batches[5].last_seq)
            assert states == ["ready"], f"the link left the leader's sidecar: {states}"
            assert link.endpoint == at_leader.endpoint and rec.stats.retries >= 1
        finally:
            link.close()
    for s in (live, leader, follower):
        s.writer.close()


def test_a_fill_at_a_sidecar_still_handshaking_moves_on_at_the_first_answer_deadline(tmp_path: Path) -> None:
    """The leader's sidecar frozen before the link ever reached it (its kernel takes the connection, nothing
    answers the handshake): the fill moves to the next sidecar at the reconciler's first-answer deadline, not
    at the handshake's (the Subscriber's replay_timeout, 5 s), which NoProgress did not cut while CONNECTING."""
    root = tmp_path / "journal"
    s = Stream(root, "orders")
    s.write(4)
    batches = [B.Batch.parse(sealed) for sealed in s.batches]
    events: deque = deque()
    no_progress: list[float] = []
    with side(root) as first, side(root) as second:
        link = new_link([second.endpoint, first.endpoint], events, [], [], timeout=5.0)
        _, feed, filled_to = glued(link, events, no_progress)
        first.signal(signal.SIGSTOP)
        try:
            feed(R.ReplayServers(2))
            link.heard(first.endpoint, 3)  # the leader's sidecar, frozen: the link connects there
            feed(R.Live(batches[0], "A"))
            began = time.monotonic()
            feed(R.Live(batches[2], "A"))  # a gap (batch 1), asked while the handshake hangs
            filled_to(batches[2].last_seq)
            took = time.monotonic() - began
        finally:
            first.signal(signal.SIGCONT)
            link.close()
    s.writer.close()
    print(f"\ngap fill with the sidecar frozen mid-handshake: {took:.2f} s (load {os.getloadavg()[0]:.2f})")
    assert no_progress and link.endpoint == second.endpoint
    assert took < 2.5, "the fill waited for the handshake deadline (5 s)"
