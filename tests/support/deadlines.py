"""A subscriber's deadlines, checked: `next(timeout=t)` returns within t + SLACK_S whatever the servers do."""

from __future__ import annotations

import contextlib
import time

from gateway.client.subscriber import Subscriber
from gateway.errors import ReplayRefused

SLACK_S = 0.05  # how late next(timeout) may return


def timed_next(sub: Subscriber, timeout: float) -> float:
    """How long next(timeout) took, raising or not; asserts it kept its deadline."""
    began = time.monotonic()
    with contextlib.suppress(ReplayRefused):
        sub.next(timeout=timeout)
    took = time.monotonic() - began
    assert took <= timeout + SLACK_S, f"next(timeout={timeout}) took {took:.3f} s in state {sub.replay_state}"
    return took


def exercise_deadlines(sub: Subscriber, seconds: float) -> set[str]:
    """next() with several timeouts for `seconds` (through handshake deadlines and retries); the replay
    states seen."""
    seen = {sub.replay_state}
    end = time.monotonic() + seconds
    timeouts = (0.0, 0.01, 0.1, 0.25)
    i = 0
    while time.monotonic() < end:
        timed_next(sub, timeouts[i % len(timeouts)])
        seen.add(sub.replay_state)
        i += 1
    return seen
