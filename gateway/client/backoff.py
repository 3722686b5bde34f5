"""Capped exponential backoff with jitter: how every client waits before trying a server again."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from `first` up to `cap` seconds, each drawn from its upper half ("equal jitter"),
    so that clients cut off together do not come back together. `reset()` once a try succeeds."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"backoff needs 0 < first <= cap, got first={first}, cap={cap}")
        self.first = first
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """The delay before the next try; counts a failure."""
        ceiling = min(self.cap, self.first * 2.0**self.failures)
        self.failures += 1
        return ceiling / 2 + random.random() * ceiling / 2

    def reset(self) -> None:
        self.failures = 0
