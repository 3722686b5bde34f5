"""Gaps and the replay requests that fill them: cutting, issuing, progress deadlines, retries, backoff.

A gap is a missing range registered at the frontier. After its grace it is cut into bounded fetches of at
most ``span`` sequences, at most ``max_outstanding`` at a time. A fetch is one needed range and the request
currently asking for it; bounded fetches come from gaps, the open-ended one (from N on, history then the
live tail) is opened by the reconciler. A fetch waits (grace or backoff), is issued with a progress
deadline, and makes progress when an answer continues its coverage. One owed data that makes none by its
deadline is cancelled and re-issued for the remainder, under a new id, after a backoff that doubles up
to its maximum; past ``max_retries`` attempts ``Stalled`` is reported once and retrying goes on.

With several replay servers to ask (``servers`` > 1, a group's sidecars), a request not answered yet fails as
soon as the server has been silent for ``first_answer`` since it was asked (nothing heard at all: no record,
no end, no head report, for any request): a healthy server answers within milliseconds, and one that is
paused, cut off or gone would otherwise hold the range for the whole progress deadline before the next server
is asked. Answers to other requests put it off while they come (the server answers FETCHes in order: one
queued behind a long answer hears nothing of its own meanwhile). Once the request has an answer of its own,
the progress deadline alone applies. With one server there is nowhere to move: nothing changes.

A gap is kept until N passes its end (then it counts as filled, or not if a Loss passed it); the pump
forgets passed gaps. Gaps never overlap and are ordered, so the ones already cut into fetches are a
prefix of ``gaps`` (``_cut`` long) and the ones N has passed another (``_passed`` long).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from gateway.merge.stats import ReconcilerStats
from gateway.merge.vocabulary import Action, Cancel, NoProgress, Request, Stalled

FIRST_ANSWER_S = 0.3
"""Seconds a request may wait for the first sign of life from its replay server, when there are others to ask.
A healthy sidecar answers a FETCH at once (data or FETCH-END within milliseconds, a round trip and a journal
read); silence past this is a paused, cut-off or dead node, and the fill moves on instead of waiting for the
progress deadline (1-2 s). Well above a loaded LAN round trip plus a datagram fill's retries (3 x 50 ms)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to wait for progress (and, with several servers, for a first answer), and how to back off after
    attempts without it."""

    timeout: float
    initial: float
    maximum: float
    max_retries: int
    first_answer: float = FIRST_ANSWER_S

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError("Reconciler: progress_timeout must be > 0 seconds")
        if not 0 <= self.initial <= self.maximum:
            raise ValueError("Reconciler: retry_backoff must be (initial, max) with 0 <= initial <= max")
        if self.max_retries < 0:
            raise ValueError("Reconciler: max_retries must be >= 0")
        if self.first_answer <= 0:
            raise ValueError("Reconciler: first_answer_timeout must be > 0 seconds")

    def backoff(self, attempts: int) -> float:
        """The wait after ``attempts`` consecutive failed attempts."""
        if attempts > self.max_retries:
            return self.maximum
        return min(self.initial * 2 ** (attempts - 1), self.maximum)


@dataclass(slots=True)
class Attempts:
    """Consecutive attempts without progress; ``Stalled`` is due once per run of them past max_retries."""

    count: int = 0
    stalled: bool = False

    def fail(self, policy: RetryPolicy) -> bool:
        """Count one; True the first time the retries are exhausted (report ``Stalled``)."""
        self.count += 1
        if self.count > policy.max_retries and not self.stalled:
            self.stalled = True
            return True
        return False

    def reset(self) -> None:
        self.count = 0
        self.stalled = False


@dataclass(slots=True)
class SilenceWatch:
    """Periods of ``policy.timeout`` without a sign of life, counted as failed attempts (AWAIT_LIVE)."""

    policy: RetryPolicy
    until: float | None = None  # the end of the current period; None until the first look
    periods: Attempts = field(default_factory=Attempts)

    def stalled(self, now: float) -> int | None:
        """The periods so far, the first time they exceed max_retries (report ``Stalled``); else None."""
        if self.until is not None and now < self.until:
            return None
        first_look, self.until = self.until is None, now + self.policy.timeout
        if first_look or not self.periods.fail(self.policy):
            return None
        return self.periods.count


@dataclass(slots=True)
class Fetch:
    """One needed range and the request currently asking for it (None while waiting)."""

    hi: int | None  # None: open-ended
    covered_to: int  # highest sequence this fetch's answers accounted for, contiguously
    snapshot: bool = False  # asks for a snapshot (SNAPSHOTTING's one request)
    request: Request | None = None
    due: float = -math.inf  # waiting: when to issue; issued: the progress deadline
    asked_at: float = -math.inf  # issued: when it was asked, or last became owed data (the first-answer clock)
    answered: bool = False  # an answer to this request came since then (only the progress deadline applies)
    attempts: Attempts = field(default_factory=Attempts)
    issued: int = 0
    idle: bool = False  # open-ended and owed nothing at the last check


@dataclass(slots=True)
class Gap:
    """A missing range registered at the frontier; ``cut``: its first sequence not yet cut into fetches."""

    cut: int
    hi: int
    due: float


class RequestScheduler:
    """The gaps, the fetches and their requests. Actions go to the ``out`` list each method is given."""

    __slots__ = (
        "_by_id",
        "_cut",
        "_ids",
        "_passed",
        "_snapshot_ids",
        "fetches",
        "filtered",
        "gaps",
        "heard_at",
        "max_outstanding",
        "policy",
        "replay_ok",
        "servers",
        "span",
        "stats",
    )

    def __init__(
        self, policy: RetryPolicy, *, span: int, max_outstanding: int, filtered: bool, stats: ReconcilerStats
    ) -> None:
        if span < 1:
            raise ValueError("Reconciler: max_request_span must be >= 1")
        if max_outstanding < 1:
            raise ValueError("Reconciler: max_outstanding_requests must be >= 1")
        self.policy = policy
        self.span = span
        self.max_outstanding = max_outstanding
        self.filtered = filtered
        self.stats = stats
        self.fetches: list[Fetch] = []
        self.gaps: deque[Gap] = deque()
        self.replay_ok = True
        self.servers = 1  # replay servers the IO layer can ask (ReplayServers); >1 arms the first-answer deadline
        self.heard_at = -math.inf  # the last answer of any kind from the replay server
        self._cut = 0  # gaps at the front of `gaps` already cut into fetches (or abandoned)
        self._passed = 0  # gaps at the front of `gaps` that N has passed (counted in the stats)
        self._by_id: dict[int, Fetch] = {}
        self._ids = itertools.count(1)
        self._snapshot_ids: set[int] = set()  # every snapshot request issued: their stale answers are dropped

    # --- what the reconciler reads ----------------------------------------------------------------------

    def find(self, request_id: int) -> Fetch | None:
        """The fetch of a request; None for an unknown (cancelled, retired, voided) one."""
        return self._by_id.get(request_id)

    def answer_to(self, request_id: int, now: float) -> Fetch | None:
        """The fetch an answer belongs to (`find`), now answered; any answer, even to an unknown request, shows
        the server alive (`heard`)."""
        self.heard(now)
        if (fetch := self.find(request_id)) is not None:
            fetch.answered = True
        return fetch

    def heard(self, now: float) -> None:
        """The replay server said something (an answer, a head report): the first-answer clocks start again."""
        self.heard_at = now

    def was_snapshot(self, request_id: int) -> bool:
        return request_id in self._snapshot_ids

    def pending(self) -> bool:
        """Whether a gap is still to be requested or answered: a gap not yet cut, or a bounded fetch (the
        open-ended one, replay only in MERGED, is the live tail, not a gap)."""
        return self._cut < len(self.gaps) or any(f.hi is not None for f in self.fetches)

    def outstanding(self) -> tuple[Request, ...]:
        return tuple(f.request for f in self.fetches if f.request is not None)

    # --- gaps -------------------------------------------------------------------------------------------

    def add_gap(self, lo: int, hi: int, due: float) -> None:
        """Register ``lo..hi`` (beyond every gap so far); one adjacent to a gap not yet cut extends it."""
        gaps = self.gaps
        if self._cut < len(gaps) and gaps[-1].hi + 1 == lo:
            gaps[-1].hi = hi
        else:
            gaps.append(Gap(lo, hi, due))
            self.stats.gaps_detected += 1

    def passed(self, n: int, *, filled: bool) -> None:
        """N moved to ``n`` by delivered data (``filled``) or by a Loss: count the gaps it closed."""
        gaps, k = self.gaps, self._passed
        while k < len(gaps) and gaps[k].hi < n:
            k += 1
            self.stats.gaps_filled += filled
        self._passed = k

    def abandon_gaps(self) -> None:
        """Request nothing more for the gaps known (they still count as filled when N passes them)."""
        self._cut = len(self.gaps)

    # --- fetches ----------------------------------------------------------------------------------------

    def open(self, lo: int, *, snapshot: bool = False) -> None:
        """Need everything from ``lo`` on (or, with ``snapshot``, a snapshot): the open-ended fetch."""
        self.fetches.append(Fetch(hi=None, covered_to=lo - 1, snapshot=snapshot))

    def pump(self, now: float, n: int, head: int | None, out: list[Action]) -> None:
        """Retire satisfied fetches, cut due gaps into new ones, issue due ones, time out stuck ones.

        ``n`` is N, 0 while unknown (then only the open-ended fetch exists)."""
        if n:
            gaps = self.gaps
            while gaps and gaps[0].hi < n:  # passed (filled by the other feed, say), perhaps before it was due
                gaps.popleft()
                self._passed -= 1
                if self._cut:
                    self._cut -= 1
            for f in list(self.fetches):  # delivered by anyone: retired, cancelled if its answer is not complete
                if f.hi is not None and max(f.covered_to, n - 1) >= f.hi:
                    self.retire(f, out, cancel=f.covered_to < f.hi)
            while self._cut < len(gaps) and len(self.fetches) < self.max_outstanding and gaps[self._cut].due <= now:
                gap = gaps[self._cut]
                lo = max(gap.cut, n)
                hi = min(gap.hi, lo + self.span - 1)
                self.fetches.append(Fetch(hi=hi, covered_to=lo - 1))
                if hi >= gap.hi:
                    self._cut += 1
                else:
                    gap.cut = hi + 1
        if not self.replay_ok:
            return
        for f in self.fetches:
            if f.request is not None:
                owed = self._owed(f, n, head)
                if not owed or f.idle:  # idle at the live tail: the clock starts once data is owed
                    f.due, f.asked_at, f.answered = now + self.policy.timeout, now, False
                elif f.due <= now or self._unanswered(f, now):
                    self.fail(f, now, n, out, cancel=True)
                f.idle = not owed
            if f.request is None and f.due <= now:
                self._issue(f, now, n, out)

    def progress(self, fetch: Fetch, covered_to: int, now: float) -> None:
        """An answer continued the fetch's coverage to ``covered_to``: a new deadline, attempts forgiven."""
        fetch.covered_to = covered_to
        fetch.due = now + self.policy.timeout
        fetch.attempts.reset()

    def fail(self, fetch: Fetch, now: float, n: int, out: list[Action], *, cancel: bool, short: bool = False) -> None:
        """A timeout or (`short`) an answer that ended short of the range: drop this request, re-issue the
        remainder after the backoff."""
        assert fetch.request is not None
        rid = fetch.request.request_id
        del self._by_id[rid]
        if cancel:
            out.append(Cancel(rid))
        out.append(NoProgress(rid, short))
        fetch.request = None
        if fetch.attempts.fail(self.policy):
            out.append(Stalled(max(fetch.covered_to + 1, n or 1), fetch.hi, fetch.attempts.count))
            self.stats.stalls += 1
        fetch.due = now + self.policy.backoff(fetch.attempts.count)

    def retire(self, fetch: Fetch, out: list[Action], *, cancel: bool) -> None:
        """The fetch is done (answered, or its range delivered by anyone)."""
        self.fetches.remove(fetch)
        if fetch.request is not None:
            del self._by_id[fetch.request.request_id]
            if cancel:
                out.append(Cancel(fetch.request.request_id))

    def cancel_all(self, out: list[Action]) -> None:
        for fetch in self.fetches:
            if fetch.request is not None:
                out.append(Cancel(fetch.request.request_id))
        self.fetches.clear()
        self._by_id.clear()

    def void(self) -> None:
        """The replay connection is gone: every request with it (no Cancel to send); re-issue when back."""
        self.replay_ok = False
        for f in self.fetches:
            if f.request is not None:
                del self._by_id[f.request.request_id]
                f.request = None
                f.due = -math.inf

    def _owed(self, fetch: Fetch, n: int, head: int | None) -> bool:
        """Whether silence from this fetch means it is stuck rather than idle at the live tail."""
        if fetch.hi is not None or fetch.snapshot or head is None:
            return True
        return head > max(fetch.covered_to, (n or 1) - 1)

    def _unanswered(self, fetch: Fetch, now: float) -> bool:
        """Several servers, the fetch not answered yet, and nothing heard from its server for `first_answer`
        since it was asked (module docstring). Not a snapshot: its first batch may wait for a scan of the journal."""
        return (
            self.servers > 1
            and not fetch.answered
            and not fetch.snapshot
            and now - max(fetch.asked_at, self.heard_at) >= self.policy.first_answer
        )

    def _issue(self, fetch: Fetch, now: float, n: int, out: list[Action]) -> None:
        rid = next(self._ids)
        fetch.request = request = Request(
            rid, max(fetch.covered_to + 1, n or 1), fetch.hi, self.filtered, fetch.snapshot
        )
        if fetch.snapshot:
            self._snapshot_ids.add(rid)
        fetch.due, fetch.asked_at, fetch.answered = now + self.policy.timeout, now, False
        self._by_id[rid] = fetch
        out.append(request)
        self.stats.requests += 1
        self.stats.retries += fetch.issued > 0
        fetch.issued += 1
