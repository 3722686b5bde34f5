"""The soak's RSS verdict (gateway/bench/rss_trend.py) on synthetic samples: a spike or a step is not a leak, a
steady rise is, restarts are judged per incarnation, and a short run fails only on a clear rise."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from gateway.bench.rss_trend import NOISE_MIB, SLOPE_MIB_PER_H, theil_sen_slope, trend, worst_trend

HOUR = 3600.0


def series(
    seconds: float, mib_at: Callable[[float], float], every: float = 5.0, jitter: float = 0.3, seed: int = 1
) -> list[tuple[float, float]]:
    """(t, MiB) every `every` s for `seconds`, MiB from mib_at(t) plus uniform jitter."""
    rnd = random.Random(seed)
    n = int(seconds / every) + 1
    return [(i * every, mib_at(i * every) + rnd.uniform(-jitter, jitter)) for i in range(n)]


def test_slope_of_a_line_is_its_slope() -> None:
    assert theil_sen_slope([(0, 1.0), (1, 3.0), (2, 5.0), (10, 21.0)]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        theil_sen_slope([(1, 1.0), (1, 2.0)])


def test_an_hour_flat_with_one_spike_is_flat() -> None:
    """The publisher's 86 MiB for one sample, 15 s after a gateway kill, in an hour at 72: the old rule's failure."""
    points = series(HOUR, lambda t: 72.0)
    points[len(points) * 2 // 3] = (points[len(points) * 2 // 3][0], 86.1)
    got = trend(points, 120)
    assert got is not None and got.flat and abs(got.slope_mib_per_h) < 1.0, got


def test_a_spike_at_the_very_end_is_flat() -> None:
    points = series(HOUR, lambda t: 60.0)
    points[-1] = (points[-1][0], 90.0)
    got = trend(points, 120)
    assert got is not None and got.flat, got


def test_a_steady_leak_fails() -> None:
    """30 MiB an hour (about 2.5 KiB a second) under jitter: no spike-tolerance may hide it."""
    got = trend(series(HOUR, lambda t: 50.0 + 30.0 * t / HOUR, jitter=2.0), 120)
    assert got is not None and not got.flat
    assert got.slope_mib_per_h == pytest.approx(30.0, rel=0.1)


def test_a_leak_just_over_the_bound_fails_and_just_under_passes() -> None:
    over = trend(series(HOUR, lambda t: 50.0 + (SLOPE_MIB_PER_H + 4) * t / HOUR), 120)
    under = trend(series(HOUR, lambda t: 50.0 + (SLOPE_MIB_PER_H - 4) * t / HOUR), 120)
    assert over is not None and not over.flat
    assert under is not None and under.flat


def test_a_step_that_stays_is_a_small_trend_not_a_leak() -> None:
    """malloc's high-water mark after one backlog (docs/hardening.md): +7 MiB at 20 minutes, then level."""
    got = trend(series(HOUR, lambda t: 65.0 if t < 1200 else 72.0), 120)
    assert got is not None and got.flat and got.slope_mib_per_h < SLOPE_MIB_PER_H, got


def test_the_warm_up_is_not_judged() -> None:
    """A rise of 20 MiB in the first two minutes, then flat."""
    got = trend(series(HOUR, lambda t: 40.0 + min(t, 120.0) / 6), 120)
    assert got is not None and got.flat and abs(got.slope_mib_per_h) < 1.0, got


def test_a_short_run_fails_only_on_a_clear_rise() -> None:
    """Five minutes, three after the warm-up: 3 MiB of steps is noise, 20 MiB is a leak at any rate."""
    steps = trend(series(300, lambda t: 60.0 + (3.0 if t > 200 else 0.0), jitter=0.1), 120)
    clear = trend(series(300, lambda t: 60.0 + 20.0 * t / 300, jitter=0.1), 120)
    assert steps is not None and steps.slope_mib_per_h > SLOPE_MIB_PER_H and steps.rise_mib <= NOISE_MIB
    assert steps.flat
    assert clear is not None and not clear.flat


def test_too_few_samples_give_no_verdict() -> None:
    assert trend([(0, 1.0), (5, 2.0), (10, 3.0)], 5) is None
    assert trend([], 5) is None


def test_restarts_are_judged_per_incarnation() -> None:
    """A gateway killed every 5 minutes restarts low and rises to its level: a sawtooth, not growth; the one
    incarnation that leaks is the one reported."""
    samples: list[tuple[float, int, float]] = []
    for k in range(12):
        for t, mib in series(300, lambda t: 40.0 + min(t, 60.0) / 6, seed=k):
            samples.append((k * 300 + t, 1000 + k, mib))
    got = worst_trend(samples, 120)
    assert got is not None and got.flat, got
    leaky = [(t, pid, mib + (40.0 * (t - 3000) / 300 if pid == 1010 else 0.0)) for t, pid, mib in samples]
    worst = worst_trend(leaky, 120)
    assert worst is not None and not worst.flat and worst.slope_mib_per_h == pytest.approx(480.0, rel=0.1)


def test_one_long_incarnation_sampled_across_restarts_of_others() -> None:
    """The publisher lives the whole hour: one incarnation, judged from the run's warm-up on."""
    samples = [(t, 7, mib) for t, mib in series(HOUR, lambda t: 70.0)]
    got = worst_trend(samples, 120)
    assert got is not None and got.samples == len(samples) - 24 and got.flat
