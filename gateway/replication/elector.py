"""The elector: campaigns for a group's leader key in etcd and keeps the lease alive, on a thread of its own.

Threading contract: one elector thread makes every etcd request of its node (each bounded by the client's
timeout, `ttl / 4`) and is the only writer of `Leadership`. Other threads read `authority()` and `holder()`:
each one value, replaced whole, so a reader never sees an epoch from one grant with the deadline of another.
The gateway's loop calls `may_act(now)` before it multicasts or confirms; it never waits on etcd.

The owner's other etcd work (the in-sync set, the node's status: gateway.replication.insync_keeper) runs on its thread
as *jobs*: `post(name, job)` (any thread, never waits) leaves `job(etcd)` for the thread, a later job of the
same name replacing one not yet started (the newest intent wins). The thread runs posted jobs after each
renewal or poll that was due and stops a pass when the next one falls due, so a job delays a renewal by its
own requests at most (a job should make one). It appends each outcome (what the job returned, or the
CoordinatorError it raised) to a queue that `outcomes()` empties; `fileno()` is an eventfd, readable while
outcomes wait, for the owner's poller. A job shares nothing with the owner's thread: it gets copies of what
it needs when posted and returns a value.

A follower that finds the key held polls it every `poll_s`, or every renewal interval while its owner says it
hears the leader on the leader's own link (`leader_heard`; a leader that stops answering is `suspect`ed
anyway); as soon as the key is gone (the leader's lease expired or was revoked), the follower campaigns. A
leader whose renewal fails keeps its authority only until `authority_until`: if etcd is unreachable for
longer, it steps down without being told (rule 2 of gateway.replication.leadership), and campaigns again when etcd
answers.

Two hooks serve replication (docs/ha.md). `eligible(etcd)` is asked before every campaign (only an in-sync
follower may lead): it answers None when this node may not lead, else (key, mod_revision) of what it read,
and the campaign then succeeds only if that key is unchanged when the leader key is created (one
transaction), so a set rewritten meanwhile cannot be acted on. `suspect(epoch)` lets the gateway's loop say
that the leader of `epoch` went silent: the elector then revokes that leader's lease (any client may) and
campaigns at once instead of waiting out the lease. Safety never rests on the suspicion being right: a
deposed leader cannot confirm without its followers' acknowledgements, and its in-sync set can only shrink
by a write fenced by its epoch.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gateway.errors import CoordinatorError
from gateway.replication.leadership import RENEWALS_PER_TTL, Leadership, Role
from gateway.transport.etcd import Etcd, Holder
from gateway.transport.pollable import PolledByFd
from gateway.transport.send_errors import SendErrors

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 1  # etcd's lease unit is the second; a LAN etcd with fast heartbeats grants 1 s
DEFAULT_MARGIN_S = 0.2
RETRY_S = 0.05  # after etcd failed a request: soon enough for a leader to renew within its margin, not a spin


Job = Callable[[Etcd], Any]


class Elector(PolledByFd):
    """Campaigns for `key` with `value` (what followers and clients learn of the leader); runs its owner's jobs."""

    def __init__(
        self,
        etcd_url: str | Sequence[str],
        key: str,
        value: str,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        margin_s: float = DEFAULT_MARGIN_S,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float | None = None,
        eligible: Callable[[Etcd], tuple[str, int] | None] | None = None,
        errors: SendErrors | None = None,
    ) -> None:
        self.key, self.value, self.ttl_s = key, value, ttl_s
        self.poll_s = ttl_s / RENEWALS_PER_TTL if poll_s is None else poll_s  # a follower looks at the key this often
        self.heard_poll_s = max(self.poll_s, ttl_s / RENEWALS_PER_TTL)  # ... and this often while it hears the leader
        self._heard = False
        self._eligible = eligible
        self._etcd = Etcd(etcd_url, timeout_s=ttl_s / RENEWALS_PER_TTL, errors=errors)
        self._leadership = Leadership(margin_s)
        self._clock = clock
        self._lease = 0
        self._authority: tuple[int, float] = (0, -math.inf)  # (epoch, authority_until): replaced whole
        self._unreachable = False  # etcd failed the last request: said once, until it answers again
        self._failed_at = -math.inf  # when etcd last failed a step: the next waits RETRY_S after it
        self._holder: Holder | None = None  # who leads, as last seen (replaced whole)
        self._suspect = 0  # the epoch whose leader the gateway found silent (0: none)
        self._suspected = False  # suspect() was called: look at the leader key now, not at the next poll
        self._polled_at = -math.inf  # when a follower last looked at the key
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # readable while outcomes wait
        self._lock = threading.Lock()  # guards _jobs and _outcomes
        self._jobs: dict[str, Job] = {}  # name -> the newest job of that name not yet started
        self._outcomes: deque[tuple[str, Any]] = deque()  # (name, result or CoordinatorError), in order run
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"elector-{key}", daemon=True)

    def start(self) -> Elector:
        self._thread.start()
        return self

    def authority(self) -> tuple[int, float]:
        """(epoch, until): this node may act as leader of `epoch` while the monotonic clock is below `until`."""
        return self._authority

    def may_act(self, now: float) -> bool:
        return now < self._authority[1]

    def holder(self) -> Holder | None:
        """The leader key as last seen (this node's own while it leads): value, epoch, lease."""
        return self._holder

    @property
    def suspected(self) -> int:
        """The epoch whose leader this node last found silent (0: none)."""
        return self._suspect

    def suspect(self, epoch: int) -> None:
        """The leader of `epoch` went silent: revoke its lease and campaign now (if eligible)."""
        self._suspect = epoch
        self._suspected = True
        self._wake.set()

    def leader_heard(self, heard: bool) -> None:
        """(the owner's thread; never waits) Whether the leader answers us on its own link: while it does, the key
        is polled every `heard_poll_s`, not every `poll_s`. Each poll is a request whose Python work holds the
        GIL: at 20 a second they delayed the owner's loop enough to show in the p99 of a pair's latency."""
        if self._heard and not heard:
            self._wake.set()  # the next poll comes at poll_s
        self._heard = heard

    def post(self, name: str, job: Job) -> None:
        """(any thread; never waits) Run `job(etcd)` on the elector's thread, replacing a job `name` not yet
        started; its outcome comes back through `outcomes()`."""
        with self._lock:
            self._jobs[name] = job
        self._wake.set()

    def outcomes(self) -> list[tuple[str, Any]]:
        """(the owner's thread; never waits) The outcomes of jobs run since the last call, in the order run: (name,
        what the job returned or the CoordinatorError it raised)."""
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            return []
        with self._lock:
            done = list(self._outcomes)
            self._outcomes.clear()
        return done

    def fileno(self) -> int:
        return self._fd

    def close(self, *, resign: bool = True) -> None:
        """Stops campaigning; with `resign`, revokes the lease so a successor need not wait for it to expire."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if self._fd >= 0:  # a second close() finds it closed
            os.close(self._fd)
            self._fd = -1
        self._authority = (self._authority[0], -math.inf)
        if resign and self._lease:
            try:
                self._etcd.revoke(self._lease)
            except CoordinatorError as exc:
                log.warning("leadership: could not resign (%s); the lease ends by itself", exc)

    def _run(self) -> None:
        interval = self.ttl_s / RENEWALS_PER_TTL
        while not self._stop.is_set():
            self._wake.wait(self._step_wait(interval))
            self._wake.clear()
            if self._stop.is_set():
                break
            if self._suspected or self._step_wait(interval) <= 0:  # not woken only for a job
                self._suspected = False
                self._guarded_step(interval)
            self._run_jobs(interval)

    def _guarded_step(self, interval: float) -> None:
        try:
            self._step()
        except CoordinatorError as exc:
            self._failed_at = self._clock()
            if not self._unreachable:
                self._unreachable = True
                log.warning("leadership: %s (retrying in %.2f s)", exc, self._step_wait(interval))
        else:
            if self._unreachable:
                log.info("leadership: etcd at %s answers again", self._etcd.url)
            self._unreachable = False
        self._publish()

    def _run_jobs(self, interval: float) -> None:
        """Run the jobs posted so far, each once, in the order their names were first posted, until a renewal
        or poll is due (the rest wait for the next pass, as do jobs posted meanwhile)."""
        with self._lock:
            jobs, self._jobs = self._jobs, {}
        for i, (name, job) in enumerate(jobs.items()):
            if self._stop.is_set() or self._step_wait(interval) <= 0:
                with self._lock:  # back, unless a newer job of the same name came meanwhile
                    self._jobs = dict(list(jobs.items())[i:]) | self._jobs
                self._wake.set()
                return
            try:
                outcome = job(self._etcd)
            except CoordinatorError as exc:
                outcome = exc
            with self._lock:
                self._outcomes.append((name, outcome))
                os.eventfd_write(self._fd, 1)  # close() joins this thread before it closes the fd

    def _step_wait(self, interval: float) -> float:
        """Seconds until the next renewal (a leader) or poll (a follower) is due; never sooner than RETRY_S
        after a failed step, or a leader whose renewal etcd refuses would retry at once, over and over."""
        if self._leadership.role is Role.LEADER:
            due = self._leadership.renewed_at + interval
        else:
            due = self._polled_at + (self.heard_poll_s if self._heard else self.poll_s)
        if self._unreachable:
            due = max(due, self._failed_at + RETRY_S)
        return max(0.0, due - self._clock())

    def _step(self) -> None:
        now = self._clock()
        lead = self._leadership
        if lead.role is Role.LEADER and not lead.may_act(now):
            log.warning("leadership: epoch %d lapsed (no renewal in time); stepping down", lead.epoch)
            lead.lost()
        if lead.role is Role.LEADER:
            ttl = self._etcd.keepalive(self._lease)
            if ttl <= 0:
                log.warning("leadership: etcd no longer holds the lease of epoch %d; stepping down", lead.epoch)
                lead.lost()
                self._lease = 0
            else:
                lead.renewed(now, ttl)
            return
        self._polled_at = now
        holder = self._holder = self._etcd.holder(self.key)
        if holder is not None and holder.create_revision == self._suspect and holder.lease:
            log.warning("leadership: the leader of epoch %d went silent; revoking its lease", self._suspect)
            self._etcd.revoke(holder.lease)
            holder = self._holder = self._etcd.holder(self.key)
        if holder is not None:
            return
        unchanged = self._eligible(self._etcd) if self._eligible is not None else None
        if self._eligible is not None and unchanged is None:
            return
        sent_at = self._clock()
        self._lease = self._etcd.grant(self.ttl_s)
        epoch = self._etcd.create(self.key, self.value, self._lease, unchanged)
        if epoch is None:  # someone else was faster
            self._etcd.revoke(self._lease)
            self._lease = 0
            return
        lead.granted(sent_at, epoch, self.ttl_s)
        self._holder = Holder(self.value, epoch, self._lease)
        # not the value: a group's holds its ack key (gateway.replication.group), which no log should carry
        log.info("leadership: this process leads %s in epoch %d (lease %x)", self.key, epoch, self._lease)

    def _publish(self) -> None:
        lead = self._leadership
        self._authority = (lead.epoch, lead.authority_until if lead.role is Role.LEADER else -math.inf)
