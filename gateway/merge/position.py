"""Where the stream is: N, the head, the live edge, the frontier, and the lag against its limit."""

from __future__ import annotations

import math
from typing import Literal


class Position:
    """The numbers the reconciler's guards read, and the lag limit.

    ``next`` is N (0 until the position is known: sequences start at 1); ``head`` the highest sequence known to exist;
    ``live_edge`` the highest sequence seen live (batches, heartbeats; replay only, the sidecar's head reports)
    and ``last_live_at`` when live last spoke; ``frontier`` (MERGED/RECOVERING) the highest sequence delivered,
    held, or in a registered gap.
    ``tail_since``: since when the head has been beyond the frontier (None: it is not).
    ``replay_limit`` / ``raise_limit``: ``max_lag`` under the lag policy "replay" / "raise", else None.
    Plain attributes: the reconciler reads them on every batch.
    """

    __slots__ = (
        "_reported",
        "frontier",
        "head",
        "last_live_at",
        "live_edge",
        "next",
        "raise_limit",
        "replay_limit",
        "tail_since",
    )

    def __init__(self, max_lag: int | None, policy: Literal["replay", "raise"]) -> None:
        if max_lag is not None and max_lag < 1:
            raise ValueError("Reconciler: max_lag must be None (no limit) or >= 1")
        if policy not in ("replay", "raise"):
            raise ValueError('Reconciler: lag_policy must be "replay" or "raise"')
        self.replay_limit = max_lag if policy == "replay" else None
        self.raise_limit = max_lag if policy == "raise" else None
        self.next = 0
        self.head: int | None = None
        self.live_edge: int | None = None
        self.last_live_at = -math.inf
        self.frontier = 0
        self.tail_since: float | None = None
        self._reported = False  # LagExceeded sent for the current excursion above max_lag

    @property
    def accounted(self) -> int:
        """Highest sequence delivered, held, or in a registered gap (MERGED/RECOVERING)."""
        return max(self.frontier, self.next - 1)

    @property
    def lag(self) -> int:
        """Sequences known to exist and not yet delivered (0 while the position is unknown)."""
        if not self.next or self.head is None:
            return 0
        return max(0, self.head - (self.next - 1))

    def saw_live(self, seq: int, now: float) -> None:
        """A live batch ending at ``seq``, or a heartbeat head ``seq``, arrived at ``now``."""
        head, edge = self.head, self.live_edge
        self.head = seq if head is None or seq > head else head
        self.live_edge = seq if edge is None or seq > edge else edge
        self.last_live_at = now

    def advance(self, n: int) -> None:
        """N moves to ``n``: what lies below it exists."""
        self.next = n
        if self.head is None or self.head < n - 1:
            self.head = n - 1

    def tail_lost(self, now: float, grace: float) -> tuple[int, int] | None:
        """The range between the frontier and the head once the head has been beyond it for ``grace``
        (MERGED/RECOVERING: a tail loss, nothing on live will reveal it); else None."""
        head, accounted = self.head, self.accounted
        if head is None or head <= accounted:
            self.tail_since = None
            return None
        if self.tail_since is None:
            self.tail_since = now
        if now - self.tail_since < grace:
            return None
        self.tail_since = None
        return accounted + 1, head

    def holding_futile(self) -> bool:
        """Catching up beyond max_lag / 2 with lag_policy "replay": live held now would be dropped anyway."""
        return self.replay_limit is not None and self.lag > self.replay_limit / 2

    def lag_exceeded(self) -> int | None:
        """With lag_policy "raise": the lag, once per excursion above max_lag; else None."""
        if self.raise_limit is None:
            return None
        lag = self.lag
        if lag <= self.raise_limit:
            self._reported = False
        elif not self._reported:
            self._reported = True
            return lag
        return None
