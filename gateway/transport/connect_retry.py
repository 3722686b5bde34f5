"""When a TCP connect still under way is given up and made again, sans-IO: the kernel's SYN back-off is not a LAN's.

Rules
=====

1. A connect still under way `first_s` after it started is abandoned and made again at once: a new SYN. Linux
   sends a lost SYN (or answers a lost SYN-ACK) again only after 1 s, then 3 s, 7 s; a LAN connect takes a
   millisecond. Seen: a follower whose SYN to a new leader was lost (3% loss) joined it 1.0-1.3 s after the
   election instead of 0.02-0.25 s, and with `--min-insync 1` every commit waited for it.
2. Each connect given up doubles the wait for the next, up to `max_s` (the kernel's own first retry, from
   which on nothing is gained): a path whose round trip passes `first_s` still connects, after a few tries.
3. A connect that ends by itself (`ended`: it completed, or the network refused it) sets the wait back to
   `first_s` for the next one.
4. No IO, no clock: the owner passes ``now``.

Theory of operation
===================

IDLE --started(now)--> CONNECTING(until now + wait) --ended()--> IDLE (wait = first_s)
CONNECTING --expired(now): now >= until--> IDLE (wait = min(2 * wait, max_s)); the owner connects again
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIRST_S = 0.2  # a LAN connect answers within a millisecond; a lost SYN is made again after this
MAX_S = 1.0  # Linux's first SYN retransmission (TCP_TIMEOUT_INIT): waiting longer gains nothing


@dataclass
class ConnectRetry:
    """The deadline of one connection's connects (rules above)."""

    first_s: float = FIRST_S
    max_s: float = MAX_S
    wait: float = field(init=False)
    until: float | None = None  # the connect under way is given up then (None: none is under way)

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"ConnectRetry: need 0 < first_s <= max_s, not {self.first_s} and {self.max_s}")
        self.wait = self.first_s

    def started(self, now: float) -> None:
        """A connect was made at `now`."""
        self.until = now + self.wait

    def ended(self) -> None:
        """The connect under way ended by itself: it completed, or the network refused it."""
        self.until, self.wait = None, self.first_s

    def expired(self, now: float) -> bool:
        """Whether the connect under way is past its deadline: the owner abandons it and connects again."""
        if self.until is None or now < self.until:
            return False
        self.until, self.wait = None, min(2 * self.wait, self.max_s)
        return True
