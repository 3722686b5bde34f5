"""Tests for gateway.reconcile: a simulated world for the end-to-end guarantee, unit tests per transition.

The property tests drive the reconciler with a publisher (history journaled before the client starts,
then live batches), adversarial multicast feeds (loss, bursts, tail loss, A/B, duplicates, reordering,
heartbeats) and a simulated replay server that answers from the journal (split, delayed, lost, stalled,
trimmed, disconnected). Whatever happens, the stream handed to the application must be exactly the
expected range, in order, once, with Loss for exactly what the journal no longer has.

Every record has a key, and some records delete theirs (docs/snapshots.md); the server also answers
snapshots. A client starting from a snapshot must end with the last-value map of the whole retained
stream, having had the snapshot first and then every record after it, exactly once.
"""

from __future__ import annotations

import doctest
import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import reconcile
from gateway.reconcile import (
    EVENT_KINDS,
    HELD_OVERHEAD_BYTES,
    TRANSITIONS,
    Action,
    Cancel,
    Close,
    Emit,
    Event,
    HeadSeen,
    LagExceeded,
    Live,
    Loss,
    NoProgress,
    Reconciler,
    Replay,
    ReplayEnd,
    ReplayLost,
    ReplayRestored,
    ReplayServers,
    ReplayTrimmed,
    Request,
    SnapshotDone,
    Stalled,
    Start,
    State,
    StateChanged,
    Tick,
    describe_transitions,
)


@dataclass(frozen=True)
class B:
    """A fake batch: coverage and size are all the reconciler sees. `seqs`: the records it holds, for the
    world's bookkeeping (None: every sequence of its coverage that the client's filter lets through)."""

    first_seq: int
    last_seq: int
    nbytes: int = 100
    seqs: tuple[int, ...] | None = None


# --- the simulated world ---------------------------------------------------------------------------------

DT = 0.01  # seconds per simulated step
PROGRESS_TIMEOUT = 0.15
FIRST_ANSWER = 0.1  # above the slowest simulated answer (max_answer_delay 8 steps): lost answers are cut early
#: Once the network heals, something must be delivered at least this often (timeouts, backoff, delays).
QUIET_STEPS = 120


@dataclass(frozen=True)
class Scenario:
    history: int  # records journaled before the client starts; never seen live
    live_records: int
    first_retained: int  # 1..history+1: only history can have been trimmed
    silent_trims: bool  # the replay server skips trimmed ranges without a TRIMMED
    start: Start
    feeds: tuple[str, ...]
    dead_feed: str | None
    filtered: bool
    p_drop: float
    p_burst: float  # chance per batch that a burst of losses starts on a feed
    burst_len: int
    tail_drop: int  # last live batches lost on every feed
    p_dup: float
    reorder: int  # live copies arrive up to this many steps late
    p_heartbeat_drop: float
    p_answer_lost: float  # a request is never answered
    p_answer_stall: float  # an answer stops part-way
    max_answer_delay: int
    replay_rate: int  # replay messages delivered per step
    outage: tuple[int, int] | None  # (step, length) of a replay disconnection
    buffer_limit: int
    span: int
    max_outstanding: int
    max_lag: int | None
    lag_policy: str
    gap_grace: float
    tail_grace: float
    keys: int = 4  # records are spread over this many keys
    p_delete: float = 0.2  # chance that a record deletes its key (an empty body)
    p_snapshot_pause: float = 0.0  # a snapshot answer pauses part-way for longer than the progress timeout
    replay_only: bool = False  # no feeds: the sidecar's head reports (over its connection) are the heartbeats
    servers: int = 1  # replay servers the reconciler is told of (>1: the first-answer deadline, FIRST_ANSWER)

    @property
    def total(self) -> int:
        return self.history + self.live_records


@dataclass(frozen=True)
class Keyed:
    """The key of every record, and whether it deletes it; with a filter only even keys match."""

    records: tuple[tuple[int, bool], ...]  # index seq - 1
    filtered: bool

    @classmethod
    def make(cls, sc: Scenario, rnd: random.Random) -> Keyed:
        recs = tuple((rnd.randrange(sc.keys), rnd.random() < sc.p_delete) for _ in range(sc.total))
        return cls(recs, sc.filtered)

    def matches(self, seq: int) -> bool:
        return not self.filtered or self.records[seq - 1][0] % 2 == 0

    def apply(self, values: dict[int, int], seqs: Iterable[int]) -> None:
        """Apply records in order to a key -> seq map of last values."""
        for seq in seqs:
            if self.matches(seq):
                key, delete = self.records[seq - 1]
                if delete:
                    values.pop(key, None)
                else:
                    values[key] = seq

    def last_values(self, lo: int, hi: int) -> dict[int, int]:
        values: dict[int, int] = {}
        self.apply(values, range(lo, hi + 1))
        return values


def cut(rnd: random.Random, lo: int, hi: int, max_size: int) -> list[tuple[int, int]]:
    """Split lo..hi into consecutive random pieces."""
    pieces = []
    while lo <= hi:
        top = min(hi, lo + rnd.randint(1, max_size) - 1)
        pieces.append((lo, top))
        lo = top + 1
    return pieces


@dataclass
class ReplayServer:
    """Answers requests from the journal over one FIFO connection (TCP), with injected faults."""

    sc: Scenario
    rnd: random.Random
    journal_head: int
    keyed: Keyed
    faults: bool = True
    up: bool = True
    queue: deque[tuple[int, Event]] = field(default_factory=deque)
    subscriptions: dict[int, int] = field(default_factory=dict)  # open-ended request -> covered up to
    last_ready: int = 0

    def send(self, step: int, event: Event, pause: int = 0) -> None:
        self.last_ready = max(self.last_ready, step + self.rnd.randint(0, self.sc.max_answer_delay)) + pause
        self.queue.append((self.last_ready, event))

    def coverage(self, step: int, rid: int, lo: int, hi: int) -> None:
        for first, last in cut(self.rnd, lo, hi, 10):
            size = last - first + 1
            nbytes = self.rnd.choice([0, 3 * size]) if self.sc.filtered else 10 * size
            self.send(step, Replay(B(first, last, nbytes), rid))

    def request(self, step: int, req: Request) -> None:
        assert req.filtered == self.sc.filtered
        if not self.up:
            return  # the IO layer cannot send on a dead connection
        if req.snapshot:
            self.snapshot(step, req.request_id)
            return
        if req.hi is not None:
            assert req.lo <= req.hi <= self.journal_head, f"{req} asks for what does not exist yet"
        if self.faults and self.rnd.random() < self.sc.p_answer_lost:
            return
        from_first_retained = req.lo == 1 and req.hi is None  # SUBSCRIBE(latest=0): never TRIMMED
        if req.lo < self.sc.first_retained and not (from_first_retained or self.sc.silent_trims):
            self.send(step, ReplayTrimmed(req.request_id, self.sc.first_retained))
        lo = max(req.lo, self.sc.first_retained)
        end = self.journal_head if req.hi is None else req.hi
        if self.faults and self.rnd.random() < self.sc.p_answer_stall:
            end = self.rnd.randint(lo - 1, end) if end >= lo else end
            self.coverage(step, req.request_id, lo, end)
            return
        self.coverage(step, req.request_id, lo, end)
        if req.hi is None:
            self.subscriptions[req.request_id] = max(end, lo - 1)
        else:
            self.send(step, ReplayEnd(req.request_id))

    def snapshot(self, step: int, rid: int) -> None:
        """The last value of every key as of the head: coverage from the first retained, in random pieces."""
        if self.faults and self.rnd.random() < self.sc.p_answer_lost:
            return
        lo, n0 = self.sc.first_retained, self.journal_head
        last = sorted(self.keyed.last_values(lo, n0).values())
        pieces = cut(self.rnd, lo, n0, 10)
        stalled = self.faults and self.rnd.random() < self.sc.p_answer_stall
        if stalled:  # stops part-way: some pieces, never the end marker
            pieces = pieces[: self.rnd.randint(0, len(pieces))]
        paused = self.faults and self.rnd.random() < self.sc.p_snapshot_pause
        pause_at = self.rnd.randint(1, max(1, len(pieces))) if paused else -1  # the rest comes after the client gave up
        for i, (first, top) in enumerate(pieces):
            seqs = tuple(seq for seq in last if first <= seq <= top)
            pause = int(2 * PROGRESS_TIMEOUT / DT) if i == pause_at else 0
            self.send(step, Replay(B(first, top, 10 * len(seqs), seqs), rid), pause)
        if not stalled:
            self.send(step, SnapshotDone(rid, n0))

    def published(self, step: int, head: int) -> None:
        self.journal_head = head
        for rid, pos in self.subscriptions.items():
            if head > pos:
                self.coverage(step, rid, pos + 1, head)
                self.subscriptions[rid] = head

    def cancel(self, rid: int) -> None:
        self.subscriptions.pop(rid, None)  # what is already on the wire still arrives

    def disconnect(self) -> None:
        self.up = False
        self.queue.clear()
        self.last_ready = 0  # a pause on the lost connection does not hold back the next one's answers
        self.subscriptions.clear()

    def ready(self, step: int) -> list[Event]:
        out: list[Event] = []
        while self.queue and self.queue[0][0] <= step and len(out) < self.sc.replay_rate:
            out.append(self.queue.popleft()[1])
        return out


class World:
    """Runs one scenario to quiescence, checking the invariants after every event."""

    def __init__(self, sc: Scenario, rnd: random.Random) -> None:
        self.sc, self.rnd = sc, rnd
        self.rec = Reconciler(
            sc.start,
            key_filter_active=sc.filtered,
            buffer_limit_bytes=sc.buffer_limit,
            max_request_span=sc.span,
            max_outstanding_requests=sc.max_outstanding,
            progress_timeout=PROGRESS_TIMEOUT,
            retry_backoff=(0.01, 0.08),
            max_retries=2,
            gap_grace=sc.gap_grace,
            tail_grace=sc.tail_grace,
            max_lag=sc.max_lag,
            lag_policy=sc.lag_policy,  # type: ignore[arg-type]
            replay_only=sc.replay_only,
            first_answer_timeout=FIRST_ANSWER,
        )
        self.live = [B(f, la, 10 * (la - f + 1)) for f, la in cut(rnd, sc.history + 1, sc.total, 6)]
        self.keyed = Keyed.make(sc, rnd)
        self.values: dict[int, int] = {}  # the application's last value of every key: key -> seq
        self.server = ReplayServer(sc, rnd, journal_head=sc.history, keyed=self.keyed)
        self.inbox: list[tuple[int, int, Event]] = []  # live packets: (arrival step, order, event)
        self.order = itertools.count()
        self.burst = dict.fromkeys(sc.feeds, 0)
        self.expected: int | None = None if sc.start.kind != "at_seq" else sc.start.seq
        self.start_seq = self.expected
        self.ranges: list[tuple[int, int, str]] = []
        self.states: list[State] = [self.rec.state]
        self.stalls: list[Stalled] = []
        self.too_slow: list[LagExceeded] = []
        self.step = 0
        if sc.servers > 1:
            self.feed(ReplayServers(sc.servers))

    # --- feeding ---

    def feed(self, event: Event) -> None:
        rec = self.rec
        if self.expected is None:
            self.expected = self.start_seq = self.position_from(event)
        actions = rec.handle(event, self.step * DT)
        self.apply(actions)
        self.check_invariants(actions)

    def position_from(self, event: Event) -> int | None:
        """Where the stream starts if this event fixes the position (the documented rules, restated)."""
        current = {r.request_id for r in self.rec.outstanding}
        match self.rec.state, event:
            case State.AWAIT_LIVE, Live():
                return event.batch.first_seq
            case State.AWAIT_LIVE, HeadSeen():
                return event.head + 1
            case State.AWAIT_EARLIEST, ReplayTrimmed() if event.request_id in current:
                return event.first_retained
            case State.AWAIT_EARLIEST, Replay() if event.request_id in current:
                return event.batch.first_seq
            case State.SNAPSHOTTING, Replay() if event.request_id in current:
                return event.batch.first_seq
            case State.SNAPSHOTTING, SnapshotDone() if event.request_id in current:
                return event.last + 1
        return None

    def apply(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Emit | Loss):
                assert self.expected is not None, f"{a} before the position was known"
                assert a.lo == self.expected, f"{a}: expected lo={self.expected} (ranges so far {self.ranges[-3:]})"
                assert a.lo <= a.hi <= self.sc.total
                if isinstance(a, Emit):
                    assert a.batch.first_seq <= a.lo and a.hi <= a.batch.last_seq, f"{a} outside its coverage"
                    self.hand_over(a)
                self.ranges.append((a.lo, a.hi, "loss" if isinstance(a, Loss) else a.source))
                self.expected = a.hi + 1
            elif isinstance(a, Request):
                self.server.request(self.step, a)
            elif isinstance(a, Cancel):
                self.server.cancel(a.request_id)
            elif isinstance(a, StateChanged):
                assert a.old is self.states[-1]
                self.states.append(a.new)
            elif isinstance(a, Stalled):
                self.stalls.append(a)
            elif isinstance(a, LagExceeded):
                self.too_slow.append(a)

    def hand_over(self, a: Emit) -> None:
        """What the IO layer does: apply the records of lo..hi to the application's last values."""
        held: tuple[int, ...] | None = a.batch.seqs  # type: ignore[attr-defined]
        assert (held is not None) == (a.source == "snapshot"), f"{a}: snapshot data must be labelled so"
        if held is not None:
            assert all(kind == "snapshot" for _, _, kind in self.ranges), "a snapshot range after a full one"
            seqs: Iterable[int] = (seq for seq in held if a.lo <= seq <= a.hi)
        else:
            seqs = range(a.lo, a.hi + 1)
        self.keyed.apply(self.values, seqs)

    def check_invariants(self, actions: list[Action]) -> None:
        rec, sc = self.rec, self.sc
        assert rec.buffered_bytes <= sc.buffer_limit
        outstanding = sorted(rec.outstanding, key=lambda r: r.lo)
        assert len(outstanding) <= sc.max_outstanding
        for a, b in itertools.pairwise(outstanding):
            assert a.hi is not None and a.hi < b.lo, f"overlapping requests {a} {b}"
        assert sum(isinstance(a, Request) for a in actions) <= sc.max_outstanding
        unknown = (State.AWAIT_LIVE, State.AWAIT_EARLIEST, State.SNAPSHOTTING)  # states before the position
        assert rec.next_seq == self.expected or rec.state in unknown

    # --- the schedule ---

    def send_live(self, batch: B, index: int) -> None:
        sc, rnd = self.sc, self.rnd
        tail = index >= len(self.live) - sc.tail_drop
        for feed in sc.feeds:
            if feed == sc.dead_feed:
                continue
            if self.burst[feed] == 0 and rnd.random() < sc.p_burst:
                self.burst[feed] = sc.burst_len
            if self.burst[feed]:
                self.burst[feed] -= 1
                continue
            if tail or rnd.random() < sc.p_drop:
                continue
            copies = 2 if rnd.random() < sc.p_dup else 1
            for _ in range(copies):
                arrival = self.step + rnd.randint(0, sc.reorder)
                heapq.heappush(self.inbox, (arrival, next(self.order), Live(batch, feed)))

    def heartbeats(self, reliable: bool) -> None:
        if self.sc.replay_only and self.server.up and (reliable or self.rnd.random() >= self.sc.p_heartbeat_drop):
            arrival = self.step + (0 if reliable else self.rnd.randint(0, self.sc.max_answer_delay))
            heapq.heappush(self.inbox, (arrival, next(self.order), HeadSeen(self.server.journal_head, "replay")))
        for feed in self.sc.feeds:
            if feed != self.sc.dead_feed and (reliable or self.rnd.random() >= self.sc.p_heartbeat_drop):
                arrival = self.step + (0 if reliable else self.rnd.randint(0, self.sc.reorder))
                heapq.heappush(self.inbox, (arrival, next(self.order), HeadSeen(self.server.journal_head, feed)))

    def run_step(self, *, publish: bool) -> None:
        sc = self.sc
        if publish and self.step < len(self.live):
            batch = self.live[self.step]
            self.server.published(self.step, batch.last_seq)
            self.send_live(batch, self.step)
        self.heartbeats(reliable=not publish)
        if sc.outage and publish:
            begin, length = sc.outage
            if self.step == begin:
                self.server.disconnect()
                self.feed(ReplayLost())
            elif self.step == begin + length:
                self.server.up = True
                self.feed(ReplayRestored())
        live: list[Event] = []
        while self.inbox and self.inbox[0][0] <= self.step:
            live.append(heapq.heappop(self.inbox)[2])
        replay = self.server.ready(self.step)
        while live or replay:  # interleave the two connections, each in its own order
            source = live if live and (not replay or self.rnd.random() < 0.5) else replay
            self.feed(source.pop(0))
        self.feed(Tick())
        self.step += 1

    def run(self) -> None:
        sc = self.sc
        outage_end = sc.outage[0] + sc.outage[1] if sc.outage else 0
        while self.step < len(self.live) + sc.reorder + 1 or self.step <= outage_end:
            self.run_step(publish=True)
        self.server.faults = False  # quiescence: the network heals; lost requests get retried and answered
        last_progress, seen = self.step, len(self.ranges)
        while not (self.expected == sc.total + 1 and (not self.rec.outstanding or self._tailing())):
            if len(self.ranges) != seen:
                last_progress, seen = self.step, len(self.ranges)
            if self.step - last_progress > QUIET_STEPS:
                pytest.fail(
                    f"no progress for {QUIET_STEPS} steps: expected={self.expected} state={self.rec.state} "
                    f"head={self.rec.head} outstanding={self.rec.outstanding} ranges={self.ranges[-5:]}"
                )
            self.run_step(publish=False)
        self.quiet_steps = self.step - last_progress
        for _ in range(20):  # late and stale answers, heartbeats: nothing more may be delivered
            self.run_step(publish=False)

    def _tailing(self) -> bool:
        """Replay only: merged, the open-ended request streaming on as the live tail."""
        return self.sc.replay_only and self.rec.state is State.MERGED

    def check_result(self) -> None:
        sc, rec = self.sc, self.rec
        first = self.start_seq
        assert first is not None
        if sc.start.kind in ("earliest", "snapshot"):
            assert first == sc.first_retained
            # The same last values whether from a snapshot or from every record: after a snapshot, the
            # ranges below (contiguous, exactly once, no Loss) are every record, one by one.
            assert self.values == self.keyed.last_values(sc.first_retained, sc.total)
        covered = [seq for lo, hi, _ in self.ranges for seq in range(lo, hi + 1)]
        assert covered == list(range(first, sc.total + 1))
        lost = [seq for lo, hi, kind in self.ranges if kind == "loss" for seq in range(lo, hi + 1)]
        assert lost == list(range(first, sc.first_retained)), "Loss must be exactly what the journal dropped"
        stats = rec.stats
        assert stats.records_lost == len(lost)
        from_all = stats.records_from_live + stats.ranges_from_replay + stats.ranges_from_snapshot
        assert from_all == len(covered) - len(lost)
        assert stats.delivered_batches == sum(kind != "loss" for _, _, kind in self.ranges)
        assert rec.next_seq == sc.total + 1 and rec.lag == 0
        outstanding = set(rec.outstanding)
        actions = rec.handle(Close(), self.step * DT)
        assert {a.request_id for a in actions if isinstance(a, Cancel)} == {r.request_id for r in outstanding}
        assert rec.state is State.CLOSED and rec.outstanding == ()
        assert rec.handle(Live(B(sc.total + 1, sc.total + 1), "A"), self.step * DT) == []


@st.composite
def scenarios(draw: st.DrawFn, **forced: object) -> Scenario:
    def pick(name: str, strategy: st.SearchStrategy) -> object:
        chosen = forced.get(name, strategy)  # a forced value may be a strategy too
        return draw(chosen) if isinstance(chosen, st.SearchStrategy) else chosen

    history = pick("history", st.integers(0, 60))
    live_records = pick("live_records", st.integers(1, 150))
    total = history + live_records
    kind = pick("start_kind", st.sampled_from(["earliest", "latest", "at_seq", "after_seq", "snapshot"]))
    start = (
        forced["start"]
        if "start" in forced
        else {
            "earliest": Start.earliest,
            "snapshot": Start.snapshot,
            "latest": Start.latest,
            "at_seq": lambda: Start.at_seq(draw(st.integers(1, total + 1))),
            "after_seq": lambda: Start.after_seq(draw(st.integers(0, total))),
        }[kind]()
    )
    two_feeds = pick("two_feeds", st.booleans())
    replay_only = pick("replay_only", st.just(False))
    feeds = () if replay_only else ("A", "B") if two_feeds else ("A",)
    burst = draw(st.integers(1, 12))
    outage = None
    if pick("outage", st.booleans()):
        outage = (draw(st.integers(0, live_records)), draw(st.integers(1, 40)))
    max_lag = pick("max_lag", st.none() | st.integers(2, 40))
    return Scenario(
        history=history,
        live_records=live_records,
        first_retained=pick("first_retained", st.integers(1, history + 1)),
        silent_trims=draw(st.booleans()),
        start=start,
        feeds=feeds,
        dead_feed=pick("dead_feed", st.sampled_from([None, *feeds]) if two_feeds else st.none()),
        filtered=pick("filtered", st.booleans()),
        p_drop=draw(st.sampled_from([0.0, 0.05, 0.2, 0.5])),
        p_burst=draw(st.sampled_from([0.0, 0.02, 0.1])),
        burst_len=burst,
        tail_drop=draw(st.integers(0, 5)),
        p_dup=draw(st.sampled_from([0.0, 0.1, 0.5])),
        reorder=draw(st.integers(0, 3)),
        p_heartbeat_drop=draw(st.sampled_from([0.0, 0.3, 0.9])),
        p_answer_lost=draw(st.sampled_from([0.0, 0.1, 0.4])),
        p_answer_stall=draw(st.sampled_from([0.0, 0.1, 0.3])),
        max_answer_delay=draw(st.integers(0, 8)),
        replay_rate=draw(st.integers(1, 6)),
        outage=outage,
        buffer_limit=pick("buffer_limit", st.sampled_from([HELD_OVERHEAD_BYTES + 60, 600, 3000, 1 << 20])),
        span=draw(st.integers(1, 40)),
        max_outstanding=draw(st.integers(1, 4)),
        max_lag=max_lag,
        lag_policy=pick("lag_policy", st.sampled_from(["replay", "raise"])),
        gap_grace=draw(st.sampled_from([0.0, 0.02])),
        tail_grace=draw(st.sampled_from([0.0, 0.03])),
        keys=draw(st.integers(1, 12)),
        p_delete=draw(st.sampled_from([0.0, 0.2, 0.5])),
        p_snapshot_pause=draw(st.sampled_from([0.0, 0.3])),
        replay_only=replay_only,  # type: ignore[arg-type]
        servers=pick("servers", st.sampled_from([1, 2])),  # type: ignore[arg-type]
    )


def simulate(sc: Scenario, seed: int) -> World:
    world = World(sc, random.Random(seed))
    world.run()
    world.check_result()
    return world


#: The schedule's randomness: a seed shrinks in few steps, unlike a drawn Random.
SEEDS = st.integers(0, 2**32 - 1)
PROPERTY = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@settings(PROPERTY, max_examples=1000)
@given(scenarios(), SEEDS)
def test_exactly_once_in_order_under_any_fault(sc: Scenario, seed: int) -> None:
    simulate(sc, seed)


@settings(PROPERTY, max_examples=150)
@given(
    scenarios(filtered=True, start=Start.at_seq(1), history=40, first_retained=1, buffer_limit=1 << 20),
    SEEDS,
)
def test_filtered_replay_with_sparse_coverage(sc: Scenario, seed: int) -> None:
    world = simulate(sc, seed)
    assert world.rec.stats.ranges_from_replay > 0


@settings(PROPERTY, max_examples=300)
@given(scenarios(start_kind="snapshot", history=st.integers(0, 60) | st.integers(0, 4)), SEEDS)
def test_snapshot_then_stream_gives_the_last_values_of_the_whole_stream(sc: Scenario, seed: int) -> None:
    """Any interleaving of snapshot, replay and live: the map equals the full stream's last values (checked
    in check_result, as for 'earliest'), and after the snapshot every record comes exactly once."""
    world = simulate(sc, seed)
    kinds = [kind for _, _, kind in world.ranges]
    n0 = max((hi for _, hi, kind in world.ranges if kind == "snapshot"), default=world.start_seq - 1)
    assert kinds[: kinds.count("snapshot")] == ["snapshot"] * kinds.count("snapshot")
    assert [seq for lo, hi, kind in world.ranges if kind != "snapshot" for seq in range(lo, hi + 1)] == list(
        range(n0 + 1, sc.total + 1)
    )


def test_snapshot_scenarios_exercise_snapshots_and_their_failures() -> None:
    """The property above is not vacuous: snapshots deliver, and some are abandoned part-way."""
    delivered = abandoned = 0
    for seed in range(40):
        sc = _fixed(start=Start.snapshot(), history=60, live_records=60, keys=5, p_delete=0.3, p_answer_stall=0.5)
        world = simulate(sc, seed)
        delivered += world.rec.stats.ranges_from_snapshot > 0
        # A snapshot is as of 60 or later: full data from 60 or before means one was abandoned part-way.
        abandoned += min((lo for lo, _, kind in world.ranges if kind != "snapshot"), default=999) <= 60
    assert delivered == 40 and abandoned > 0


@settings(PROPERTY, max_examples=150)
@given(scenarios(two_feeds=True, dead_feed="B", start_kind="latest"), SEEDS)
def test_ab_with_one_feed_dead(sc: Scenario, seed: int) -> None:
    simulate(sc, seed)


@settings(PROPERTY, max_examples=150)
@given(
    scenarios(start_kind="earliest", history=50, live_records=80, outage=True, buffer_limit=1 << 20),
    SEEDS,
)
def test_replay_lost_and_restored_mid_catch_up(sc: Scenario, seed: int) -> None:
    simulate(sc, seed)


@settings(PROPERTY, max_examples=150)
@given(
    scenarios(max_lag=4, lag_policy="replay", start_kind="latest", live_records=120),
    SEEDS,
)
def test_slow_consumer_shifts_to_replay_and_back(sc: Scenario, seed: int) -> None:
    simulate(sc, seed)


@settings(PROPERTY, max_examples=300)
@given(
    scenarios(replay_only=True, two_feeds=False, start_kind=st.sampled_from(["earliest", "at_seq", "after_seq",
                                                                             "snapshot"])),
    SEEDS,
)  # fmt: skip
def test_replay_only_is_exactly_once_and_merged_with_the_sidecars_head(sc: Scenario, seed: int) -> None:
    """Without multicast, under every replay fault: the same guarantee, and MERGED once caught up."""
    world = simulate(sc, seed)
    assert world.states[-1] is State.MERGED, world.states
    assert world.rec.stats.records_from_live == 0


def test_slow_consumer_scenario_really_switches_gears() -> None:
    """A fixed schedule with loss bursts: the lag switch must fire, and the stream must re-merge."""
    world = World(_fixed(p_burst=0.2, burst_len=10), random.Random(7))
    world.run()
    world.check_result()
    downshifts = [b for a, b in itertools.pairwise(world.states) if b is State.CATCHING_UP]
    assert downshifts, world.states
    assert world.states[-1] is State.MERGED


def _fixed(**overrides: object) -> Scenario:
    base = {
        "history": 0,
        "live_records": 120,
        "first_retained": 1,
        "silent_trims": False,
        "start": Start.latest(),
        "feeds": ("A",),
        "dead_feed": None,
        "filtered": False,
        "p_drop": 0.0,
        "p_burst": 0.0,
        "burst_len": 1,
        "tail_drop": 0,
        "p_dup": 0.0,
        "reorder": 0,
        "p_heartbeat_drop": 0.0,
        "p_answer_lost": 0.0,
        "p_answer_stall": 0.0,
        "max_answer_delay": 0,
        "replay_rate": 4,
        "outage": None,
        "buffer_limit": 1 << 20,
        "span": 10,
        "max_outstanding": 2,
        "max_lag": 4,
        "lag_policy": "replay",
        "gap_grace": 0.0,
        "tail_grace": 0.0,
    }
    return Scenario(**{**base, **overrides})  # type: ignore[arg-type]


# --- unit tests: the table, the docs, the docstring ------------------------------------------------------


def test_docstring_examples() -> None:
    result = doctest.testmod(reconcile, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 10 and result.failed == 0


def test_table_names_every_event_and_uses_only_reconciler_methods() -> None:
    assert set(TRANSITIONS) == set(State)
    for state, row in TRANSITIONS.items():
        if state is not State.CLOSED:
            assert set(row.on) == set(EVENT_KINDS), state
        assert all(isinstance(go.target, State) for go in row.go)
        functions = [*row.on.values(), *row.timers, *(go.guard for go in row.go), *(go.action for go in row.go)]
        for function in filter(None, functions):
            assert getattr(Reconciler, function.__name__) is function, f"{state}: {function} is not a Reconciler method"


def test_docs_embed_the_current_table() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "reconciler.md").read_text()
    assert describe_transitions() in doc, "docs/reconciler.md is stale: paste describe_transitions() output"


# --- unit tests: one per transition ----------------------------------------------------------------------


def merged_at(n: int, **options: object) -> Reconciler:
    """A reconciler in MERGED whose next_seq is n (everything before came live)."""
    r = Reconciler(Start.latest(), **options)  # type: ignore[arg-type]
    r.handle(HeadSeen(n - 1, "A"), 0.0)
    assert r.state is State.MERGED and r.next_seq == n
    return r


def requests(actions: list[Action]) -> list[Request]:
    return [a for a in actions if isinstance(a, Request)]


def test_await_live_first_live_batch_fixes_the_position() -> None:
    r = Reconciler(Start.latest())
    assert r.state is State.AWAIT_LIVE and r.next_seq is None
    batch = B(40, 45)
    assert r.handle(Live(batch, "B"), 0.0) == [
        Emit(batch, 40, 45, "live:B"),
        StateChanged(State.AWAIT_LIVE, State.MERGED),
    ]
    assert r.next_seq == 46 and r.head == 45


def test_await_live_heartbeat_fixes_the_position_after_head() -> None:
    r = Reconciler(Start.latest())
    assert r.handle(HeadSeen(41, "A"), 0.0) == [StateChanged(State.AWAIT_LIVE, State.MERGED)]
    assert r.next_seq == 42
    assert r.handle(Live(B(30, 41), "A"), 0.01) == []  # before the position: nothing
    assert r.stats.duplicates_dropped == 1


def test_a_heartbeat_of_an_older_epoch_is_ignored_and_counted() -> None:
    """A paused, deposed leader's heartbeats (an older epoch) cannot move the head: no tail gap, no request."""
    r = Reconciler(Start.latest(), tail_grace=0.1)
    assert r.handle(HeadSeen(10, "A", epoch=5), 0.0) == [StateChanged(State.AWAIT_LIVE, State.MERGED)]
    assert r.handle(HeadSeen(50, "A", epoch=3), 0.1) == []  # the former leader wakes up, claiming more
    assert r.handle(Tick(), 1.0) == [] and (r.head, r.state) == (10, State.MERGED)
    assert r.stats.stale_heartbeats == 1
    assert r.handle(HeadSeen(12, "A", epoch=7), 1.1) == []  # a newer leader's head counts
    assert r.head == 12 and r.stats.stale_heartbeats == 1
    assert r.handle(Tick(), 1.3) == [StateChanged(State.MERGED, State.RECOVERING), Request(1, 11, 12)]


def test_a_stale_heartbeat_does_not_let_catching_up_merge() -> None:
    r = Reconciler(Start.at_seq(1))
    assert r.handle(Tick(), 0.0) == [Request(1, 1, None)]
    r.handle(HeadSeen(5, "A", epoch=9), 0.1)
    assert r.handle(Replay(B(1, 3), 1), 0.2) == [Emit(B(1, 3), 1, 3, "replay")]
    r.handle(HeadSeen(2, "B", epoch=8), 0.3)  # an old leader's low head: replay has not met live yet
    assert r.state is State.CATCHING_UP and r.head == 5 and r.stats.stale_heartbeats == 1


def test_await_live_ignores_replay_and_reports_silence_once() -> None:
    r = Reconciler(Start.latest(), progress_timeout=1.0, max_retries=2)
    assert r.handle(Replay(B(1, 5), 7), 0.0) == []
    stalls = [a for t in range(1, 10) for a in r.handle(Tick(), float(t))]
    assert stalls == [Stalled(0, None, 3)]
    assert r.state is State.AWAIT_LIVE


def test_await_earliest_trimmed_fixes_the_position_without_loss() -> None:
    r = Reconciler(Start.earliest())
    assert r.handle(Tick(), 0.0) == [Request(1, 1, None)]
    assert r.handle(ReplayTrimmed(1, 100), 0.1) == [StateChanged(State.AWAIT_EARLIEST, State.CATCHING_UP)]
    assert r.next_seq == 100
    assert r.handle(Replay(B(100, 104), 1), 0.2) == [Emit(B(100, 104), 100, 104, "replay")]
    assert r.stats.losses == 0


def test_await_earliest_first_batch_fixes_position_and_meets_held_live_at_once() -> None:
    r = Reconciler(Start.earliest())
    r.handle(Tick(), 0.0)
    assert r.handle(Live(B(4, 6), "A"), 0.1) == []  # held: position unknown
    assert r.handle(Replay(B(9, 9), 99), 0.1) == []  # unknown request: cannot fix the position
    assert r.handle(Replay(B(1, 4), 1), 0.2) == [
        Emit(B(1, 4), 1, 4, "replay"),
        Emit(B(4, 6), 5, 6, "live:A"),
        StateChanged(State.AWAIT_EARLIEST, State.CATCHING_UP),
        StateChanged(State.CATCHING_UP, State.MERGED),
        Cancel(1),
    ]


def snapshotting(**options: object) -> Reconciler:
    """A reconciler that has sent its snapshot request (id 1)."""
    r = Reconciler(Start.snapshot(), **options)  # type: ignore[arg-type]
    assert r.state is State.SNAPSHOTTING
    assert r.handle(Tick(), 0.0) == [Request(1, 1, None, snapshot=True)]
    return r


def test_snapshot_batches_are_delivered_as_snapshot_and_live_is_only_held() -> None:
    r = snapshotting()
    s1, s2 = B(3, 10, seqs=(4, 9)), B(11, 20, seqs=(15,))
    assert r.handle(Replay(s1, 1), 0.1) == [Emit(s1, 3, 10, "snapshot")]  # the first batch fixes N
    assert r.next_seq == 11
    # Live reaching N is held all the same: a snapshot range may never follow a full one.
    assert r.handle(Live(B(8, 14), "A"), 0.2) == []
    assert r.handle(Replay(s2, 1), 0.3) == [Emit(s2, 11, 20, "snapshot")]
    assert r.stats.ranges_from_snapshot == 18


def test_snapshot_end_continues_as_from_the_next_sequence_with_held_live() -> None:
    r = snapshotting()
    r.handle(Replay(B(1, 20, seqs=(5,)), 1), 0.1)
    r.handle(Live(B(18, 24), "A"), 0.2)
    assert r.handle(SnapshotDone(1, 20), 0.3) == [
        StateChanged(State.SNAPSHOTTING, State.CATCHING_UP),
        Emit(B(18, 24), 21, 24, "live:A"),  # held live that N reached: due now
        StateChanged(State.CATCHING_UP, State.MERGED),
    ]
    assert r.next_seq == 25 and r.outstanding == ()


def test_empty_snapshot_end_fixes_the_position() -> None:
    r = snapshotting()
    assert r.handle(SnapshotDone(1, 0), 0.1) == [
        StateChanged(State.SNAPSHOTTING, State.CATCHING_UP),
        Request(2, 1, None),
    ]
    assert r.next_seq == 1


def test_snapshot_without_any_answer_is_asked_again() -> None:
    r = snapshotting(progress_timeout=1.0, retry_backoff=(0.5, 0.5))
    assert r.handle(Tick(), 1.0) == [Cancel(1), NoProgress(1)]
    assert r.handle(Tick(), 1.5) == [Request(2, 1, None, snapshot=True)]
    assert r.handle(Replay(B(1, 5, seqs=(2,)), 1), 1.6) == []  # the first one's late answer
    assert r.state is State.SNAPSHOTTING and r.next_seq is None


def test_snapshot_failing_part_way_is_finished_by_full_replay_and_its_late_answers_dropped() -> None:
    r = snapshotting(progress_timeout=1.0)
    r.handle(Replay(B(1, 10, seqs=(3,)), 1), 0.1)
    assert r.handle(Tick(), 1.2) == [
        Cancel(1),
        NoProgress(1),
        StateChanged(State.SNAPSHOTTING, State.CATCHING_UP),
        Request(2, 11, None),  # not a new snapshot: it would be as of another N
    ]
    assert r.handle(Replay(B(11, 12), 2), 1.3) == [Emit(B(11, 12), 11, 12, "replay")]
    assert r.handle(Replay(B(11, 20, seqs=(14,)), 1), 1.4) == []  # the abandoned snapshot, at N: dropped
    assert r.stats.replay_dropped == 1


def test_gap_in_snapshot_coverage_abandons_it() -> None:
    r = snapshotting()
    r.handle(Replay(B(1, 10, seqs=(3,)), 1), 0.1)
    assert r.handle(Replay(B(12, 20, seqs=(15,)), 1), 0.2) == [
        Cancel(1),
        NoProgress(1),
        StateChanged(State.SNAPSHOTTING, State.CATCHING_UP),
        Request(2, 11, None),
    ]


def test_replay_lost_mid_snapshot_continues_with_full_replay_once_restored() -> None:
    r = snapshotting()
    r.handle(Replay(B(1, 10, seqs=(3,)), 1), 0.1)
    assert r.handle(ReplayLost(), 0.2) == [StateChanged(State.SNAPSHOTTING, State.CATCHING_UP)]
    assert r.handle(ReplayRestored(), 0.3) == [Request(2, 11, None)]


def test_catching_up_merges_when_replay_passes_the_heartbeat_head() -> None:
    r = Reconciler(Start.at_seq(10))
    assert r.handle(Tick(), 0.0) == [Request(1, 10, None)]
    r.handle(HeadSeen(12, "A"), 0.1)
    assert r.handle(Replay(B(10, 11), 1), 0.2) == [Emit(B(10, 11), 10, 11, "replay")]
    assert r.handle(Replay(B(12, 12), 1), 0.3) == [
        Emit(B(12, 12), 12, 12, "replay"),
        StateChanged(State.CATCHING_UP, State.MERGED),
        Cancel(1),
    ]
    assert r.handle(Replay(B(13, 13), 1), 0.4) == [Emit(B(13, 13), 13, 13, "replay")]  # late but at N
    assert r.handle(Live(B(13, 14), "A"), 0.5) == [Emit(B(13, 14), 14, 14, "live:A")]


def test_catching_up_does_not_merge_into_a_silent_live_feed() -> None:
    r = Reconciler(Start.at_seq(1), progress_timeout=1.0)
    r.handle(HeadSeen(2, "A"), 0.0)
    assert r.handle(Replay(B(1, 3), 1), 5.0) == [Emit(B(1, 3), 1, 3, "replay")]  # live silent for 5 s
    assert r.state is State.CATCHING_UP
    assert r.handle(HeadSeen(3, "A"), 5.1) == [StateChanged(State.CATCHING_UP, State.MERGED), Cancel(1)]


# Replay only (a subscriber without multicast): the sidecar's head reports (HeadSeen, feed "replay") are its
# heartbeats, and the open-ended request is the live tail.


def tail_at(n: int, **options: object) -> Reconciler:
    """A replay-only reconciler in MERGED whose next_seq is n, its request 1 streaming from 1 on."""
    r = Reconciler(Start.at_seq(1), replay_only=True, **options)  # type: ignore[arg-type]
    assert r.handle(Tick(), 0.0) == [Request(1, 1, None)]
    r.handle(HeadSeen(n - 1, "replay"), 0.0)
    r.handle(Replay(B(1, n - 1), 1), 0.0)
    assert r.state is State.MERGED and r.next_seq == n
    return r


def test_replay_only_merges_at_the_sidecars_head_and_keeps_its_request() -> None:
    r = Reconciler(Start.at_seq(10), replay_only=True)
    assert r.handle(Tick(), 0.0) == [Request(1, 10, None)]
    assert r.handle(HeadSeen(12, "replay"), 0.1) == []
    assert r.handle(Replay(B(10, 11), 1), 0.2) == [Emit(B(10, 11), 10, 11, "replay")]
    assert r.handle(Replay(B(12, 12), 1), 0.3) == [
        Emit(B(12, 12), 12, 12, "replay"),
        StateChanged(State.CATCHING_UP, State.MERGED),  # no Cancel: the request is the live tail
    ]
    assert r.outstanding == (Request(1, 10, None),)
    assert r.handle(Replay(B(13, 20), 1), 0.4) == [Emit(B(13, 20), 13, 20, "replay")]  # the tail, in MERGED
    assert r.handle(HeadSeen(20, "replay"), 0.5) == [] and r.lag == 0 and r.state is State.MERGED


def test_replay_only_empty_journal_is_merged_at_once() -> None:
    r = Reconciler(Start.at_seq(1), replay_only=True)
    r.handle(Tick(), 0.0)
    assert r.handle(HeadSeen(0, "replay"), 0.1) == [StateChanged(State.CATCHING_UP, State.MERGED)]


def test_replay_only_behind_the_head_for_tail_grace_is_catching_up_again() -> None:
    r = tail_at(10, tail_grace=0.1)
    assert r.handle(HeadSeen(15, "replay"), 1.0) == []  # in flight: within the grace
    assert r.handle(Replay(B(10, 15), 1), 1.05) == [Emit(B(10, 15), 10, 15, "replay")]
    assert r.handle(HeadSeen(30, "replay"), 2.0) == []
    assert r.handle(Tick(), 2.05) == []
    assert r.handle(Tick(), 2.25) == [StateChanged(State.MERGED, State.CATCHING_UP)]  # no gap, no new request
    assert r.outstanding == (Request(1, 1, None),) and r.stats.gaps_detected == 0
    assert r.handle(Replay(B(16, 30), 1), 2.3) == [
        Emit(B(16, 30), 16, 30, "replay"),
        StateChanged(State.CATCHING_UP, State.MERGED),
    ]


def test_replay_only_silent_head_reports_fall_back_to_a_new_request() -> None:
    r = tail_at(10, progress_timeout=1.0)
    assert r.handle(Tick(), 1.0) == [
        StateChanged(State.MERGED, State.CATCHING_UP),
        Cancel(1),
        Request(2, 10, None),
    ]
    assert r.handle(HeadSeen(9, "replay"), 1.1) == [StateChanged(State.CATCHING_UP, State.MERGED)]
    assert r.outstanding == (Request(2, 10, None),)


def test_replay_only_lost_connection_reissues_the_tail_in_merged() -> None:
    r = tail_at(10)
    assert r.handle(ReplayLost(), 0.1) == [] and r.outstanding == ()
    assert r.handle(ReplayRestored(), 0.2) == [Request(2, 10, None)]
    assert r.state is State.MERGED


def test_replay_only_needs_a_known_start() -> None:
    with pytest.raises(ValueError, match=r"Start.at_seq\(head \+ 1\)"):
        Reconciler(Start.latest(), replay_only=True)


def test_with_multicast_a_head_beyond_n_is_a_tail_gap_not_catching_up() -> None:
    """The replay-only guards stay out of the multicast machine's way."""
    r = merged_at(10, tail_grace=0.0)
    assert r.handle(HeadSeen(12, "A"), 0.1) == [
        StateChanged(State.MERGED, State.RECOVERING),
        Request(1, 10, 12),
    ]


def test_catching_up_overflow_drops_held_live_but_keeps_replaying() -> None:
    limit = 3 * (100 + HELD_OVERHEAD_BYTES)
    r = Reconciler(Start.at_seq(1), buffer_limit_bytes=limit)
    r.handle(Tick(), 0.0)
    for i in range(10):
        assert r.handle(Live(B(100 + i, 100 + i), "A"), 0.01 * i) == []
        assert r.buffered_bytes <= limit
    assert r.stats.buffer_overflows == 3 and r.outstanding == (Request(1, 1, None),)
    # replay reaches the held window (108..109) and merges
    out = r.handle(Replay(B(1, 108), 1), 0.2)
    assert out[-2:] == [StateChanged(State.CATCHING_UP, State.MERGED), Cancel(1)]
    assert r.next_seq == 110


def test_catching_up_does_not_hold_live_while_far_behind() -> None:
    r = Reconciler(Start.at_seq(1), max_lag=10)
    r.handle(Tick(), 0.0)
    r.handle(Live(B(50, 50), "A"), 0.1)  # lag 50 > 10/2: futile to hold
    assert r.buffered_bytes == 0 and r.stats.live_skipped == 1
    r.handle(Replay(B(1, 47), 1), 0.2)  # lag 3
    r.handle(Live(B(51, 51), "A"), 0.3)
    assert r.buffered_bytes > 0


def test_catching_up_trimmed_reports_loss_at_next_seq() -> None:
    r = Reconciler(Start.after_seq(4))
    r.handle(Tick(), 0.0)
    assert r.handle(ReplayTrimmed(1, 20), 0.1) == [Loss(5, 19, "trimmed")]
    assert r.next_seq == 20 and r.stats.records_lost == 15


def test_merged_drops_duplicates_and_trims_overlaps() -> None:
    r = merged_at(10)
    assert r.handle(Live(B(10, 12), "A"), 0.0) == [Emit(B(10, 12), 10, 12, "live:A")]
    assert r.handle(Live(B(10, 12), "B"), 0.0) == []
    assert r.handle(Live(B(11, 14), "B"), 0.0) == [Emit(B(11, 14), 13, 14, "live:B")]
    assert r.stats.duplicates_dropped == 1 and r.stats.records_from_live == 5


def test_merged_single_sequence_gap_is_requested() -> None:
    r = merged_at(5)
    out = r.handle(Live(B(6, 8), "A"), 0.0)
    assert out == [StateChanged(State.MERGED, State.RECOVERING), Request(1, 5, 5)]
    assert r.handle(Replay(B(5, 5), 1), 0.1) == [
        Emit(B(5, 5), 5, 5, "replay"),
        Emit(B(6, 8), 6, 8, "live:A"),
        StateChanged(State.RECOVERING, State.MERGED),
    ]
    assert r.handle(ReplayEnd(1), 0.1) == []
    assert (r.stats.gaps_detected, r.stats.gaps_filled) == (1, 1)


def test_recovering_splits_large_gaps_and_bounds_outstanding_requests() -> None:
    r = merged_at(1, max_request_span=10, max_outstanding_requests=2)
    out = r.handle(Live(B(36, 36), "A"), 0.0)
    assert requests(out) == [Request(1, 1, 10), Request(2, 11, 20)]
    # the second piece is answered in full (held): its slot goes to the next piece
    assert requests(r.handle(Replay(B(11, 20), 2), 0.1)) == [Request(3, 21, 30)]
    assert requests(r.handle(Replay(B(1, 10), 1), 0.2)) == [Request(4, 31, 35)]
    assert r.next_seq == 21 and r.outstanding == (Request(3, 21, 30), Request(4, 31, 35))


def test_repeated_and_overlapping_gap_evidence_coalesces_into_one_request() -> None:
    r = merged_at(1, tail_grace=0.05)
    out = r.handle(Live(B(5, 5), "A"), 0.0)
    out += r.handle(Live(B(5, 5), "B"), 0.0)
    out += r.handle(HeadSeen(5, "A"), 0.01)
    out += r.handle(Tick(), 0.1)
    out += r.handle(HeadSeen(9, "B"), 0.11)
    out += r.handle(HeadSeen(9, "A"), 0.12)
    out += r.handle(Tick(), 0.2)
    assert requests(out) == [Request(1, 1, 4), Request(2, 6, 9)]
    assert r.stats.gaps_detected == 2


def test_tail_evidence_extends_a_waiting_hole() -> None:
    r = merged_at(1, max_outstanding_requests=1, tail_grace=0.0)
    assert requests(r.handle(HeadSeen(4, "A"), 0.0)) == [Request(1, 1, 4)]
    assert requests(r.handle(HeadSeen(9, "A"), 0.1)) == []  # 5..9 waits for the slot
    assert requests(r.handle(HeadSeen(12, "A"), 0.2)) == []  # and grows to 5..12
    assert requests(r.handle(Replay(B(1, 4), 1), 0.3)) == [Request(2, 5, 12)]
    r.handle(Replay(B(5, 10), 2), 0.4)
    assert (r.stats.gaps_detected, r.stats.gaps_filled) == (2, 1)
    r.handle(Replay(B(11, 12), 2), 0.5)
    assert r.stats.gaps_filled == 2 and r.state is State.MERGED


def test_tail_evidence_right_after_n_passed_a_waiting_hole_is_requested() -> None:
    """The other feed fills a hole still waiting for a request slot, and in the same event the tail grace
    of a newer head expires: the tail beyond it is requested (this used to raise IndexError)."""
    r = merged_at(1, max_outstanding_requests=1, tail_grace=0.1)
    r.handle(Live(B(3, 3), "A"), 0.0)  # 1..2 requested: the one slot is taken
    r.handle(HeadSeen(10, "A"), 0.01)
    r.handle(Tick(), 0.2)  # tail hole 4..10 waits for the slot
    r.handle(HeadSeen(20, "A"), 0.21)
    actions = r.handle(Live(B(1, 10), "B"), 0.4)
    assert actions == [Emit(B(1, 10), 1, 10, "live:B"), Cancel(1), Request(2, 11, 20)]
    assert r.stats.gaps_filled == 2


def test_gap_filled_by_other_feed_within_grace_is_never_requested() -> None:
    r = merged_at(1, gap_grace=0.02)
    out = r.handle(Live(B(3, 4), "A"), 0.0)
    assert out == [StateChanged(State.MERGED, State.RECOVERING)]
    out = r.handle(Live(B(1, 2), "B"), 0.01)
    assert requests(out) == [] and out[-1] == StateChanged(State.RECOVERING, State.MERGED)
    assert r.handle(Tick(), 1.0) == [] and r.stats.requests == 0


def test_tail_loss_waits_for_the_grace_then_requests() -> None:
    r = merged_at(1, tail_grace=0.1)
    assert r.handle(HeadSeen(3, "A"), 0.0) == []
    assert r.handle(Tick(), 0.05) == []
    assert r.handle(Tick(), 0.1) == [StateChanged(State.MERGED, State.RECOVERING), Request(1, 1, 3)]


def test_tail_batch_arriving_within_the_grace_is_not_requested() -> None:
    r = merged_at(1, tail_grace=0.1)
    r.handle(HeadSeen(3, "A"), 0.0)
    assert r.handle(Live(B(1, 3), "A"), 0.05) == [Emit(B(1, 3), 1, 3, "live:A")]
    assert r.handle(Tick(), 0.5) == [] and r.stats.requests == 0


def test_merged_overflow_falls_back_to_catching_up() -> None:
    r = merged_at(1, buffer_limit_bytes=2 * (100 + HELD_OVERHEAD_BYTES))
    r.handle(Live(B(5, 5), "A"), 0.0)
    r.handle(Live(B(6, 6), "A"), 0.0)
    out = r.handle(Live(B(7, 7), "A"), 0.0)
    assert out == [StateChanged(State.RECOVERING, State.CATCHING_UP), Cancel(1), Request(2, 1, None)]
    assert r.buffered_bytes == 0 and r.stats.buffer_overflows == 1


def test_too_slow_with_replay_policy_shifts_to_replay() -> None:
    r = merged_at(1, max_lag=5)
    out = r.handle(HeadSeen(8, "A"), 0.0)
    assert out == [StateChanged(State.MERGED, State.CATCHING_UP), Request(1, 1, None)]


def test_too_slow_with_raise_policy_reports_once_per_excursion() -> None:
    r = merged_at(1, max_lag=5, lag_policy="raise", tail_grace=10.0)
    assert r.handle(HeadSeen(8, "A"), 0.0) == [LagExceeded(8)]
    assert r.handle(HeadSeen(9, "A"), 0.1) == []
    r.handle(Live(B(1, 9), "A"), 0.2)
    assert r.lag == 0
    assert r.handle(HeadSeen(20, "A"), 0.3) == [LagExceeded(11)]
    assert r.state is State.MERGED


def test_live_silence_falls_back_to_replay() -> None:
    r = merged_at(1, progress_timeout=1.0)
    assert r.handle(Tick(), 0.5) == []
    assert r.handle(Tick(), 1.0) == [StateChanged(State.MERGED, State.CATCHING_UP), Request(1, 1, None)]


def test_an_outage_repaired_by_catching_up_counts_as_one_gap_detected_and_filled() -> None:
    """Cut off: live falls silent, the reconciler falls back; back on the LAN, the first live batch shows the
    burst replay is streaming. Counted once, filled when replay meets live; nothing requested twice."""
    r = merged_at(10, progress_timeout=1.0)
    assert r.handle(Tick(), 1.0) == [StateChanged(State.MERGED, State.CATCHING_UP), Request(1, 10, None)]
    assert r.handle(Replay(B(10, 30), 1), 1.5) == [Emit(B(10, 30), 10, 30, "replay")]
    assert r.stats.gaps_detected == 0  # where live is, nobody knows yet
    assert r.handle(Live(B(60, 62), "A"), 2.0) == []  # held: 31..59 is what replay still owes
    assert (r.stats.gaps_detected, r.stats.gaps_filled) == (1, 0)
    actions = r.handle(Replay(B(31, 59), 1), 2.1)
    assert Emit(B(60, 62), 60, 62, "live:A") in actions and requests(actions) == []
    assert (r.stats.gaps_detected, r.stats.gaps_filled) == (1, 1) and r.state is State.MERGED
    assert r.handle(Live(B(63, 63), "A"), 2.2) == [Emit(B(63, 63), 63, 63, "live:A")]
    assert r.stats.gaps_detected == 1  # one burst, one gap


def test_timeouts_retry_with_exponential_backoff_then_stall_and_keep_retrying() -> None:
    r = merged_at(1, progress_timeout=1.0, retry_backoff=(0.5, 2.0), max_retries=2, tail_grace=0.0)
    r.handle(Live(B(5, 5), "A"), 0.0)
    timeline = {t / 10: r.handle(HeadSeen(5, "A"), t / 10) for t in range(1, 120)}
    got = [(t, a) for t, actions in timeline.items() for a in actions if not isinstance(a, StateChanged | NoProgress)]
    failed = [(t, a) for t, actions in timeline.items() for a in actions if isinstance(a, NoProgress)]
    assert failed[:3] == [(1.0, NoProgress(1)), (2.5, NoProgress(2)), (4.5, NoProgress(3))]  # each failed attempt
    assert got[:7] == [
        (1.0, Cancel(1)),  # deadline 1.0, no progress
        (1.5, Request(2, 1, 4)),  # backoff 0.5
        (2.5, Cancel(2)),
        (3.5, Request(3, 1, 4)),  # backoff 1.0
        (4.5, Cancel(3)),
        (4.5, Stalled(1, 4, 3)),  # attempts exceed max_retries: reported once
        (6.5, Request(4, 1, 4)),  # max backoff from now on
    ]
    assert [a for _, a in got[7:]] == [Cancel(4), Request(5, 1, 4), Cancel(5)]
    assert r.handle(Tick(), 12.5) == [Request(6, 1, 4)]
    assert r.stats.retries == 5 and r.stats.stalls == 1
    # progress resets the deadline and the attempts: the next backoff is the initial one again
    r.handle(Replay(B(1, 2), 6), 12.6)
    assert r.handle(HeadSeen(5, "A"), 13.5) == []
    assert r.handle(HeadSeen(5, "A"), 13.6) == [Cancel(6), NoProgress(6)]
    assert r.handle(HeadSeen(5, "A"), 14.1) == [Request(7, 3, 4)]


def test_open_ended_request_times_out_only_when_owed_data() -> None:
    r = Reconciler(Start.at_seq(1), progress_timeout=1.0)
    r.handle(Tick(), 0.0)
    r.handle(Replay(B(1, 3), 1), 0.5)  # all that is known to exist: idle at the tail, not stuck
    assert [a for t in range(1, 20) for a in r.handle(Tick(), float(t))] == []
    r.handle(Live(B(5, 5), "A"), 20.0)  # held; head 5 > covered 3: now data is owed
    assert r.handle(Tick(), 20.9) == []
    assert r.handle(Tick(), 21.0) == [Cancel(1), NoProgress(1)]


def test_short_replay_end_retries_the_remainder() -> None:
    r = merged_at(1, retry_backoff=(0.0, 1.0))
    r.handle(Live(B(10, 10), "A"), 0.0)
    r.handle(Replay(B(1, 4), 1), 0.1)
    # this server holds no more: an answer, short (a new leader's sidecar is asked again, gateway.client.link_state)
    assert r.handle(ReplayEnd(1), 0.2) == [NoProgress(1, short=True), Request(2, 5, 9)]
    assert r.stats.retries == 1


def test_no_progress_by_a_deadline_is_not_a_short_answer() -> None:
    """Silence (the progress deadline; several servers: the first-answer one) is NoProgress(short=False): the
    link moves on; only an answer that ended short of its range says the server is there, holding less."""
    r = filling(2)
    assert beat(r, 0.3) == [Cancel(1), NoProgress(1, short=False)]


def filling(servers: int, **options: object) -> Reconciler:
    """MERGED at 1 with `servers` replay servers; live shows 10, so 1..9 is asked at 0.0 (from request 1 on)."""
    r = merged_at(1, progress_timeout=1.0, **options)
    assert r.handle(ReplayServers(servers), 0.0) == []
    assert requests(r.handle(Live(B(10, 10), "A"), 0.0))[0].lo == 1
    return r


def beat(r: Reconciler, *times: float) -> list[Action]:
    """Live heartbeats (head 10) at `times`: live stays alive, and they say nothing of the replay server."""
    return [a for t in times for a in r.handle(HeadSeen(10, "A"), t)]


def test_a_fill_unanswered_past_the_first_answer_deadline_moves_to_the_next_server() -> None:
    r = filling(2)
    assert r.outstanding == (Request(1, 1, 9),)
    assert beat(r, 0.29) == []
    assert beat(r, 0.3) == [Cancel(1), NoProgress(1)]  # not 1.0: the IO layer asks the next sidecar
    assert r.handle(ReplayLost(), 0.31) == []  # what the Subscriber's link does on NoProgress with several
    assert r.handle(ReplayRestored(), 0.42) == [Request(2, 1, 9)]  # the next sidecar
    assert r.handle(Replay(B(1, 9), 2), 0.43)[0] == Emit(B(1, 9), 1, 9, "replay")
    assert r.next_seq == 11 and r.stats.retries == 1


def test_a_slow_but_live_answer_has_the_progress_deadline() -> None:
    r = filling(2)
    assert r.handle(Replay(B(1, 2), 1), 0.2)[0] == Emit(B(1, 2), 1, 2, "replay")  # alive: slow, not silent
    assert beat(r, 0.3, 0.6, 0.9, 1.1) == []
    assert beat(r, 1.2) == [Cancel(1), NoProgress(1)]  # no progress for progress_timeout since 0.2


def test_a_fill_queued_behind_an_answer_in_progress_is_not_cut() -> None:
    """The sidecar answers FETCHes in order: the second one hears nothing of its own while the first streams,
    but the server is heard; once it falls silent, the second is cut first_answer_timeout after the last word."""
    r = filling(2, max_request_span=5)
    assert r.outstanding == (Request(1, 1, 5), Request(2, 6, 9))
    r.handle(Replay(B(1, 2), 1), 0.25)
    assert beat(r, 0.3, 0.5) == []
    r.handle(Replay(B(3, 4), 1), 0.5)
    assert beat(r, 0.6, 0.79) == []
    assert beat(r, 0.8) == [Cancel(2), NoProgress(2)]  # silent since 0.5; not its progress deadline (1.0)
    assert r.outstanding == (Request(1, 1, 5),)  # request 1 has answered: its progress deadline, 1.5


def test_with_one_server_a_silent_fill_waits_for_the_progress_deadline() -> None:
    for r in (filling(1), merged_at(1, progress_timeout=1.0)):  # told one, or told nothing
        r.handle(Live(B(10, 10), "A"), 0.0)
        assert beat(r, 0.3, 0.6, 0.99) == []
        assert beat(r, 1.0) == [Cancel(1), NoProgress(1)]


def test_the_first_answer_deadline_is_an_option_and_spares_snapshots() -> None:
    r = filling(3, first_answer_timeout=0.1)
    assert beat(r, 0.1) == [Cancel(1), NoProgress(1)]
    s = snapshotting(progress_timeout=1.0)
    s.handle(ReplayServers(2), 0.0)
    assert [a for t in (0.3, 0.6) for a in s.handle(Tick(), t)] == []  # a snapshot's first batch may need a scan
    with pytest.raises(ValueError, match="first_answer_timeout"):
        Reconciler(Start.at_seq(1), first_answer_timeout=0)


def test_head_reports_of_the_sidecar_count_as_answers() -> None:
    """Replay only: the sidecar's head reports come on the replay link; while they come, a catch-up not answered
    yet is slow, not dead."""
    r = Reconciler(Start.at_seq(1), replay_only=True, progress_timeout=1.0)
    assert r.handle(ReplayServers(2), 0.0) == [Request(1, 1, None)]
    assert [a for t in (0.1, 0.3, 0.5) for a in r.handle(HeadSeen(9, "replay"), t)] == []
    assert r.handle(Tick(), 0.79) == []
    assert r.handle(Tick(), 0.8) == [Cancel(1), NoProgress(1)]  # silent since 0.5
    u = Reconciler(Start.at_seq(1), replay_only=True, progress_timeout=1.0)
    u.handle(ReplayServers(2), 0.0)
    u.handle(HeadSeen(9, "A"), 0.0)  # not the replay link
    assert u.handle(Tick(), 0.3) == [Cancel(1), NoProgress(1)]


def test_trimmed_later_piece_is_reported_in_its_place() -> None:
    r = merged_at(1, max_request_span=5)
    r.handle(Live(B(11, 11), "A"), 0.0)
    assert r.outstanding == (Request(1, 1, 5), Request(2, 6, 10))
    assert r.handle(ReplayTrimmed(2, 8), 0.1) == []  # 6..7 gone, but 1..5 must come first
    assert r.handle(Replay(B(8, 10), 2), 0.1) == []
    assert r.handle(Replay(B(1, 5), 1), 0.2)[:3] == [
        Emit(B(1, 5), 1, 5, "replay"),
        Loss(6, 7, "trimmed"),
        Emit(B(8, 10), 8, 10, "replay"),
    ]
    assert r.next_seq == 12


def test_trimmed_range_already_delivered_reports_nothing() -> None:
    r = merged_at(1)
    r.handle(Live(B(6, 6), "A"), 0.0)  # request 1 for 1..5
    r.handle(Live(B(1, 3), "B"), 0.0)
    assert r.handle(ReplayTrimmed(1, 3), 0.1) == []  # 1..2 are gone from the journal, but were delivered live
    assert r.handle(Replay(B(3, 5), 1), 0.2)[:2] == [Emit(B(3, 5), 4, 5, "replay"), Emit(B(6, 6), 6, 6, "live:A")]
    assert r.stats.losses == 0


def test_stale_answers_are_used_only_at_next_seq() -> None:
    r = merged_at(1)
    r.handle(Live(B(6, 6), "A"), 0.0)  # request 1 for 1..5
    r.handle(Live(B(1, 2), "B"), 0.0)
    assert r.handle(Replay(B(4, 5), 77), 0.1) == []  # unknown id, not at N
    assert r.handle(Replay(B(2, 4), 77), 0.1) == [Emit(B(2, 4), 3, 4, "replay")]
    assert r.stats.replay_dropped == 1


def test_answer_skipping_ahead_reports_the_range_skipped() -> None:
    r = Reconciler(Start.at_seq(1))  # the IO layer subscribes "from the first retained": no TRIMMED
    assert r.handle(Tick(), 0.0) == [Request(1, 1, None)]
    assert r.handle(Replay(B(50, 52), 1), 0.1) == [Loss(1, 49, "skipped"), Emit(B(50, 52), 50, 52, "replay")]
    r = merged_at(1, max_request_span=4)
    r.handle(Live(B(9, 9), "A"), 0.0)  # requests 1..4 and 5..8
    assert r.handle(Replay(B(7, 8), 2), 0.1) == []
    assert r.handle(Replay(B(1, 4), 1), 0.2)[:3] == [
        Emit(B(1, 4), 1, 4, "replay"),
        Loss(5, 6, "skipped"),
        Emit(B(7, 8), 7, 8, "replay"),
    ]


def test_replay_lost_voids_requests_and_restored_reissues_the_remainder() -> None:
    r = Reconciler(Start.at_seq(1))
    r.handle(Tick(), 0.0)
    r.handle(Replay(B(1, 3), 1), 0.1)
    assert r.handle(ReplayLost(), 0.2) == []  # no Cancel: the connection is gone
    assert r.outstanding == () and r.handle(Tick(), 10.0) == []
    assert r.handle(Replay(B(4, 4), 1), 10.1) == [Emit(B(4, 4), 4, 4, "replay")]  # in flight: at N
    assert r.handle(ReplayRestored(), 10.2) == [Request(2, 5, None)]
    assert r.stats.retries == 1


def test_close_cancels_everything_and_ignores_what_follows() -> None:
    r = merged_at(1, max_request_span=2)
    r.handle(Live(B(5, 5), "A"), 0.0)
    assert r.handle(Close(), 0.1) == [StateChanged(State.RECOVERING, State.CLOSED), Cancel(1), Cancel(2)]
    assert r.outstanding == () and r.buffered_bytes == 0
    assert r.handle(Live(B(1, 4), "A"), 0.2) == [] and r.handle(Tick(), 9.0) == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Start.at_seq(0), "sequences start at 1"),
        (lambda: Start.after_seq(-1), "checkpoint"),
        (lambda: Reconciler(Start.latest(), max_request_span=0), "max_request_span"),
        (lambda: Reconciler(Start.latest(), retry_backoff=(2.0, 1.0)), "retry_backoff"),
        (lambda: Reconciler(Start.latest(), lag_policy="drop"), "lag_policy"),  # type: ignore[arg-type]
        (lambda: merged_at(1).handle(Live(B(5, 4), "A"), 0.0), "fix the decoder"),
    ],
)
def test_invalid_input_names_the_cause_and_the_fix(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_event_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not an event"):
        Reconciler(Start.latest()).handle("tick", 0.0)  # type: ignore[arg-type]
