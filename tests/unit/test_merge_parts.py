"""Unit tests for the reconciler's parts (gateway.merge): held buffer, request scheduler, position.

The reconciler's own tests (test_reconcile.py) cover them end to end; these pin each part's contract.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from gateway.merge.held import HELD_OVERHEAD_BYTES, HeldBuffer
from gateway.merge.position import Position
from gateway.merge.requests import RequestScheduler, RetryPolicy, SilenceWatch
from gateway.merge.stats import ReconcilerStats
from gateway.merge.vocabulary import Action, Cancel, NoProgress, Request, Stalled


@dataclass(frozen=True)
class B:
    first_seq: int
    last_seq: int
    nbytes: int = 100


# --- held buffer ------------------------------------------------------------------------------------------


def test_held_pops_in_order_of_first_seq_and_tracks_the_lowest() -> None:
    held = HeldBuffer(1 << 20)
    assert not held and held.lowest == math.inf and held.nbytes == 0
    for batch in (B(30, 31), B(10, 12), B(20, 20)):
        assert held.hold(batch, "live:A")
    assert held.lowest == 10 and held.nbytes == 3 * (100 + HELD_OVERHEAD_BYTES)
    assert [(h.first, h.last) for h in (held.pop(), held.pop())] == [(10, 12), (20, 20)]
    assert held.lowest == 30
    held.pop()
    assert not held and held.lowest == math.inf and held.nbytes == 0


def test_held_is_bounded_in_bytes_and_charges_empty_batches_too() -> None:
    cost = 100 + HELD_OVERHEAD_BYTES
    held = HeldBuffer(2 * cost + HELD_OVERHEAD_BYTES - 1)
    assert held.hold(B(5, 5), "replay") and held.hold(B(6, 6), "replay")
    assert not held.hold(B(7, 7, nbytes=0), "replay")  # even an empty batch costs the overhead
    assert not held.hold_loss(8, 9, "trimmed")
    assert held.nbytes == 2 * cost
    held.clear()
    assert held.nbytes == 0 and held.lowest == math.inf and not held.holds(B(5, 5))


def test_held_knows_a_coverage_it_holds_and_keeps_loss_markers_apart() -> None:
    held = HeldBuffer(1 << 20)
    held.hold(B(10, 12), "live:A")
    assert held.holds(B(10, 12, nbytes=7)) and not held.holds(B(10, 11))
    assert held.hold_loss(10, 12, "trimmed")  # a marker for the same range is a different thing
    first, second = held.pop(), held.pop()
    assert {first.batch is None, second.batch is None} == {True, False}
    assert not held.holds(B(10, 12))


def test_held_refuses_a_limit_below_one_item() -> None:
    with pytest.raises(ValueError, match="buffer_limit_bytes must exceed"):
        HeldBuffer(HELD_OVERHEAD_BYTES)


# --- retry policy -----------------------------------------------------------------------------------------


def test_backoff_doubles_to_its_maximum_and_stays_there_past_the_retries() -> None:
    policy = RetryPolicy(timeout=1.0, initial=0.1, maximum=0.5, max_retries=4)
    assert [policy.backoff(k) for k in range(1, 7)] == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.0, 0.1, 1.0, 3), "progress_timeout"),
        ((1.0, 2.0, 1.0, 3), "retry_backoff"),
        ((1.0, 0.1, 1.0, -1), "max_retries"),
    ],
)
def test_retry_policy_names_the_bad_setting(args: tuple[float, float, float, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(*args)


def test_silence_watch_reports_once_when_the_periods_exceed_the_retries() -> None:
    watch = SilenceWatch(RetryPolicy(timeout=1.0, initial=0.1, maximum=1.0, max_retries=2))
    reports = [(t, watch.stalled(t)) for t in (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)]
    assert [(t, k) for t, k in reports if k is not None] == [(3.0, 3)]


# --- request scheduler ------------------------------------------------------------------------------------


def scheduler(**overrides: object) -> tuple[RequestScheduler, ReconcilerStats]:
    options: dict[str, object] = {"span": 10, "max_outstanding": 2, "filtered": False}
    options.update(overrides)
    stats = ReconcilerStats()
    policy = RetryPolicy(timeout=1.0, initial=0.1, maximum=0.4, max_retries=2)
    return RequestScheduler(policy, stats=stats, **options), stats  # type: ignore[arg-type]


def test_gaps_are_cut_into_bounded_requests_at_most_max_outstanding_at_a_time() -> None:
    req, stats = scheduler()
    req.add_gap(5, 29, due=0.0)
    out: list[Action] = []
    req.pump(0.0, 5, 40, out)
    assert out == [Request(1, 5, 14), Request(2, 15, 24)]
    assert req.pending() and len(req.outstanding()) == 2
    out.clear()
    req.pump(0.1, 15, 40, out)  # 5..14 delivered by anyone: retired (cancelled, its answer is incomplete)
    assert out == [Cancel(1), Request(3, 25, 29)]
    assert stats.requests == 3 and stats.gaps_detected == 1


def test_a_gap_waits_for_its_grace_and_adjacent_evidence_extends_it() -> None:
    req, stats = scheduler(span=100)
    req.add_gap(5, 9, due=0.5)
    req.add_gap(10, 12, due=0.9)  # adjacent and not yet cut: the same gap
    out: list[Action] = []
    req.pump(0.4, 5, 12, out)
    assert out == []
    req.pump(0.5, 5, 12, out)
    assert out == [Request(1, 5, 12)] and stats.gaps_detected == 1
    req.add_gap(13, 14, due=0.5)  # the last gap is cut already: a new one
    assert stats.gaps_detected == 2


def test_gaps_count_as_filled_only_when_delivered_data_passes_them() -> None:
    req, stats = scheduler()
    req.add_gap(5, 6, due=0.0)
    req.add_gap(9, 9, due=0.0)
    req.passed(7, filled=True)
    req.passed(10, filled=False)  # a Loss passed the second one
    assert stats.gaps_filled == 1
    out: list[Action] = []
    req.pump(0.0, 10, 10, out)
    assert out == [] and not req.gaps and not req.pending()


def test_abandoned_gaps_are_not_requested_but_still_counted_when_filled() -> None:
    req, stats = scheduler()
    req.add_gap(5, 6, due=0.0)
    req.abandon_gaps()
    assert not req.pending()
    out: list[Action] = []
    req.pump(0.0, 5, 6, out)
    assert out == []
    req.passed(7, filled=True)
    assert stats.gaps_filled == 1


def test_a_stuck_request_is_cancelled_and_reissued_with_backoff_then_stalls_once() -> None:
    req, stats = scheduler()
    req.open(5)
    out: list[Action] = []
    now = 0.0
    for _ in range(100):  # 5 s: issued at 0, 1.1, 2.3, 3.7 (backoff 0.1, 0.2, 0.4), timed out 1 s after each
        req.pump(now, 5, 50, out)
        now += 0.05
    requests = [a for a in out if isinstance(a, Request)]
    assert [r.request_id for r in requests] == [a.request_id for a in out if isinstance(a, Cancel)] == [1, 2, 3, 4]
    assert all(r.lo == 5 and r.hi is None for r in requests)
    assert [a for a in out if isinstance(a, Stalled)] == [Stalled(5, None, 3)]
    assert stats.stalls == 1 and stats.retries == 3


def test_progress_resets_the_deadline_and_the_attempts() -> None:
    req, _ = scheduler()
    req.open(5)
    out: list[Action] = []
    req.pump(0.0, 5, 50, out)
    fetch = req.find(1)
    assert fetch is not None
    req.pump(1.0, 5, 50, out)  # no progress by the deadline: cancelled
    assert out[-2:] == [Cancel(1), NoProgress(1)] and fetch.attempts.count == 1
    req.pump(1.1, 5, 50, out)  # re-issued after the backoff, for the remainder
    req.progress(fetch, 20, 1.2)
    assert fetch.attempts.count == 0
    req.pump(2.1, 5, 50, out)
    assert out[-1] == Request(2, 5, None)  # still the second request: its deadline moved


def test_an_open_ended_request_idle_at_the_tail_does_not_time_out() -> None:
    req, _ = scheduler()
    req.open(5)
    out: list[Action] = []
    for t in range(10):
        req.pump(float(t), 5, 4, out)  # the head is behind it: nothing is owed
    assert out == [Request(1, 5, None)]


def test_replay_lost_voids_requests_and_nothing_is_issued_until_restored() -> None:
    req, _ = scheduler()
    req.open(5)
    out: list[Action] = []
    req.pump(0.0, 5, 50, out)
    fetch = req.find(1)
    assert fetch is not None
    req.progress(fetch, 9, 0.1)
    req.void()
    assert req.find(1) is None and req.outstanding() == ()
    req.pump(0.2, 5, 50, out)
    assert out == [Request(1, 5, None)]
    req.replay_ok = True
    req.pump(0.3, 5, 50, out)
    assert out[-1] == Request(2, 10, None)  # the remainder, no Cancel for the void one


def test_snapshot_ids_are_remembered_after_the_request_is_gone() -> None:
    req, _ = scheduler()
    req.open(1, snapshot=True)
    out: list[Action] = []
    req.pump(0.0, 0, None, out)
    assert out == [Request(1, 1, None, snapshot=True)]
    req.cancel_all(out)
    assert out[-1] == Cancel(1) and req.was_snapshot(1) and not req.pending()


# --- position ---------------------------------------------------------------------------------------------


def test_position_lag_and_head() -> None:
    pos = Position(None, "replay")
    assert pos.lag == 0 and pos.next == 0
    pos.saw_live(20, now=1.0)
    assert pos.lag == 0  # position unknown
    pos.advance(11)
    assert pos.lag == 10 and pos.head == 20 and pos.live_edge == 20 and pos.last_live_at == 1.0
    pos.advance(31)  # delivered beyond anything seen: it exists
    assert pos.head == 30 and pos.lag == 0


def test_lag_exceeded_once_per_excursion_and_only_under_the_raise_policy() -> None:
    pos = Position(5, "raise")
    pos.advance(1)
    reports = []
    for head in (3, 7, 9, 4, 12):
        pos.saw_live(head, 0.0)
        pos.head = head
        reports.append(pos.lag_exceeded())
    assert reports == [None, 7, None, None, 12]
    replaying = Position(5, "replay")
    replaying.advance(1)
    replaying.saw_live(9, 0.0)
    assert replaying.lag_exceeded() is None and replaying.holding_futile()


def test_tail_lost_waits_for_the_grace() -> None:
    pos = Position(None, "replay")
    pos.advance(11)
    pos.frontier = 12
    pos.saw_live(15, now=0.0)
    assert pos.tail_lost(0.0, grace=0.1) is None
    assert pos.tail_lost(0.05, grace=0.1) is None
    assert pos.tail_lost(0.1, grace=0.1) == (13, 15)
    pos.frontier = 15
    assert pos.tail_lost(0.2, grace=0.1) is None and pos.tail_since is None


def test_position_names_bad_lag_settings() -> None:
    with pytest.raises(ValueError, match="max_lag"):
        Position(0, "replay")
    with pytest.raises(ValueError, match="lag_policy"):
        Position(None, "drop")  # type: ignore[arg-type]
