"""The token bucket every rate limit of ours uses: the udp:// sender's pacing, the sidecar's fill answers per
source host, a site mirror's datagram tail per session.

Bytes accrue at `rate` per second up to `burst`; a sender charges what it sends. Callers decide what an empty
bucket means (wait, drop, or let the TCP copy carry it), so this holds only the arithmetic. Threading: one
owner; no locks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float  # bytes a second
    burst: float  # bytes at most
    tokens: float
    at: float  # when `tokens` was last refilled

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def refill(self, now: float) -> float:
        """Add what accrued since the last refill (capped at `burst`); the tokens now held."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return self.tokens
