"""Is a long-lived process's memory growing, or did it only jump? The soak's verdict on RSS samples.

The first rule took the highest sample of the last half minus its first: one transient spike (a publisher
buffering what it could not send while the gateway was down, back down 5 s later) failed an hour's run.
A leak is a trend, so the verdict is on the trend: the Theil-Sen slope (the median of the slopes between every
pair of samples) of the samples after the warm-up. A spike moves few of those slopes and the median not at
all; a steady rise moves them all. One line per incarnation of a restarted process, each after its own
warm-up: the fall at a restart is not a trend, and neither is the rise of a new incarnation's start.

A trend is flat when it rises at most SLOPE_MIB_PER_H an hour, or at most NOISE_MIB over the whole span of
the samples: a run of a few minutes cannot tell a slow trend from the steps of malloc's high-water mark
(docs/hardening.md, "Soak"), so it only fails on a clear rise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

SLOPE_MIB_PER_H = 16.0  # the memory scenario's 16 MiB, per hour
NOISE_MIB = 4.0  # a rise along the trend below this over the whole span says nothing
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Trend:
    """The trend of one incarnation's samples after its warm-up."""

    slope_mib_per_h: float
    span_s: float
    samples: int

    @property
    def rise_mib(self) -> float:
        """How far the trend line rises over the span of the samples."""
        return self.slope_mib_per_h * self.span_s / 3600

    @property
    def flat(self) -> bool:
        return self.slope_mib_per_h <= SLOPE_MIB_PER_H or self.rise_mib <= NOISE_MIB


def theil_sen_slope(points: Sequence[tuple[float, float]]) -> float:
    """Median of the slopes between every pair of points with different x (y units per x unit)."""
    slopes = [
        (y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1
    ]  # fmt: skip
    if not slopes:
        raise ValueError("a slope needs two points at different times")
    return statistics.median(slopes)


def trend(points: Sequence[tuple[float, float]], warmup_s: float) -> Trend | None:
    """The trend of (seconds, MiB) samples of one incarnation from `warmup_s` after its first sample; None
    when fewer than MIN_SAMPLES remain (an incarnation too short to judge)."""
    if not points:
        return None
    start = points[0][0] + warmup_s
    kept = [(t, mib) for t, mib in points if t >= start]
    if len(kept) < MIN_SAMPLES or kept[-1][0] == kept[0][0]:
        return None
    return Trend(theil_sen_slope(kept) * 3600, kept[-1][0] - kept[0][0], len(kept))


def worst_trend(samples: Sequence[tuple[float, int, float]], warmup_s: float) -> Trend | None:
    """Of (seconds, pid, MiB) samples of a process that may have been restarted: the trend of the incarnation
    (pid) that rises most, each after its own warm-up; None if no incarnation lived long enough to judge."""
    by_pid: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t, pid, mib in samples:
        by_pid[pid].append((t, mib))
    trends = [got for points in by_pid.values() if (got := trend(points, warmup_s)) is not None]
    return max(trends, key=lambda tr: tr.rise_mib, default=None)
