"""When a TCP connect still under way is given up and made again, sans-IO: the kernel's SYN back-off is not a LAN's.

Rules
=====

1. A connect still under way `first_s` after it started is abandoned and made again at once: a new SYN. Linux
   sends a lost SYN (or answers a lost SYN-ACK) again only after 1 s, then 3 s, 7 s; a LAN connect takes a
   millisecond. Seen: a follower whose SYN to a new leader was lost (3% loss) joined it 1.0-1.3 s after the
   election instead of 0.02-0.25 s, and with `--min-insync 1` every commit waited for it.
2. Each connect given up doubles the wait for the next, up to `max_s`: a path whose round trip passes
   `first_s` still connects, after a few tries. `ConnectWaits` is this doubling alone, for every owner: the
   follower's peer link (0.2 s up to 1 s, the kernel's own first retry, from which on nothing is gained) and the
   clients' endpoint rotation (gateway.client.endpoints: 0.2 s up to 0.5 s, doubled per round of endpoints in
   which nothing answered, with libzmq's CONNECT_TIMEOUT as the deadline).
3. A connect that ends by itself (`ended`: it completed, or the network refused it) sets the wait back to
   `first_s` for the next one.
4. No IO, no clock: the owner passes ``now``.

Theory of operation
===================

IDLE --started(now)--> CONNECTING(until now + wait) --ended()--> IDLE (unanswered = 0, wait = first_s)
CONNECTING --expired(now): now >= until--> IDLE (unanswered += 1, wait = min(first_s * 2**unanswered, max_s));
the owner connects again
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_S = 0.2  # a LAN connect answers within a millisecond; a lost SYN is made again after this
MAX_S = 1.0  # Linux's first SYN retransmission (TCP_TIMEOUT_INIT): waiting longer gains nothing


@dataclass(frozen=True)
class ConnectWaits:
    """How long a connect may go unanswered: `first_s`, doubled for each connect before it given up without an
    answer, up to `max_s` (rule 2)."""

    first_s: float = FIRST_S
    max_s: float = MAX_S

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"ConnectWaits: need 0 < first_s <= max_s, not {self.first_s} and {self.max_s}")

    def after(self, unanswered: int) -> float:
        """The wait of a connect made after `unanswered` connects in a row went unanswered."""
        return min(self.max_s, self.first_s * 2 ** min(unanswered, 32))


@dataclass
class ConnectRetry:
    """The deadline of one connection's connects (rules above)."""

    waits: ConnectWaits = ConnectWaits()
    unanswered: int = 0  # connects given up in a row
    until: float | None = None  # the connect under way is given up then (None: none is under way)

    @property
    def wait(self) -> float:
        """How long the next connect may go unanswered."""
        return self.waits.after(self.unanswered)

    def started(self, now: float) -> None:
        """A connect was made at `now`."""
        self.until = now + self.wait

    def ended(self) -> None:
        """The connect under way ended by itself: it completed, or the network refused it."""
        self.until, self.unanswered = None, 0

    def expired(self, now: float) -> bool:
        """Whether the connect under way is past its deadline: the owner abandons it and connects again."""
        if self.until is None or now < self.until:
            return False
        self.until, self.unanswered = None, self.unanswered + 1
        return True
