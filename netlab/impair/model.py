"""What an impairment is: the settings of one direction of a host's link, and the counters read back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["in", "out"]
DIRECTIONS: tuple[Direction, Direction] = ("in", "out")


@dataclass(frozen=True)
class Impairment:
    """What one direction of a host's link does to packets. Defaults: a perfect link.

    ``loss_burst`` turns random loss into bursts: the Gilbert model (netem's ``loss gemodel p r 100% 0%``) with
    ``loss_pct`` average loss in bursts of ``loss_burst`` consecutive packets on average (geometric lengths).
    ``reorder_pct`` of the packets skip the delay and so overtake the others (netem's rule; needs a delay).
    Jitter is uniform in ±``jitter_ms`` and reorders packets too, as in netem.
    """

    loss_pct: float = 0.0
    loss_burst: float | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    reorder_pct: float = 0.0
    duplicate_pct: float = 0.0
    rate_kbit: int | None = None

    def __post_init__(self) -> None:
        for name in ("loss_pct", "reorder_pct", "duplicate_pct"):
            if not 0 <= getattr(self, name) <= 100:
                raise ValueError(f"{name} must be a percentage, 0 to 100 (got {getattr(self, name)})")
        if self.loss_burst is not None and (self.loss_burst < 1 or not 0 < self.loss_pct < 100):
            raise ValueError(
                f"loss_burst (mean burst length, packets) must be >= 1 with 0 < loss_pct < 100 "
                f"(got loss_burst={self.loss_burst}, loss_pct={self.loss_pct})"
            )
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError(f"delay_ms and jitter_ms must be >= 0 (got {self.delay_ms}, {self.jitter_ms})")
        if self.reorder_pct and not self.delay_ms:
            raise ValueError("reorder_pct needs delay_ms > 0: reordered packets are the ones that skip the delay")
        if self.rate_kbit is not None and self.rate_kbit <= 0:
            raise ValueError(f"rate_kbit must be > 0, or None for no limit (got {self.rate_kbit})")

    @property
    def is_clear(self) -> bool:
        return self == Impairment()

    def describe(self) -> str:
        """Short text in the CLI's own units, e.g. ``loss 5% burst 10, delay 2ms``."""
        parts = []
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g}%" + (f" burst {self.loss_burst:g}" if self.loss_burst else ""))
        if self.delay_ms or self.jitter_ms:
            parts.append(f"delay {self.delay_ms:g}ms" + (f" jitter {self.jitter_ms:g}ms" if self.jitter_ms else ""))
        if self.reorder_pct:
            parts.append(f"reorder {self.reorder_pct:g}%")
        if self.duplicate_pct:
            parts.append(f"duplicate {self.duplicate_pct:g}%")
        if self.rate_kbit:
            mbit = self.rate_kbit / 1000
            parts.append(f"rate {mbit:g}mbit" if self.rate_kbit >= 1000 else f"rate {self.rate_kbit}kbit")
        return ", ".join(parts) or "none"


@dataclass(frozen=True)
class LinkCounters:
    """Counters of the eBPF stage of one direction (zero when nothing is installed)."""

    seen: int = 0  # packets that passed the hook (duplicates not counted)
    dropped: int = 0  # by any cause: random or burst loss, partition, drop_next
    burst_dropped: int = 0  # by drop_next budgets
    burst_left: int = 0  # what the current drop_next budget still has to drop
    duplicated: int = 0
    partitioned: bool = False
