"""The nemesis schedule (gateway.bench.nemesis.schedule): a pure function of its seed, holding exactly the
faults asked for, of every kind over a long run, overlapping some, with at most one etcd fault at a time."""

from __future__ import annotations

from gateway.bench.nemesis import ETCD_KINDS, KINDS, schedule


def test_same_seed_same_schedule() -> None:
    assert schedule(7, 50) == schedule(7, 50)
    assert schedule(7, 50) != schedule(8, 50)


def test_schedule_holds_the_faults_asked_for() -> None:
    for count in (1, 2, 10, 101):
        assert sum(step.faults() for step in schedule(count, count)) == count


def test_every_kind_and_overlaps() -> None:
    steps = schedule(1, 300)
    kinds = {f.kind for s in steps for f in (s.first, s.second) if f is not None}
    assert kinds == set(KINDS)
    pairs = [s for s in steps if s.second is not None]
    assert pairs and all(0 <= s.delay_s <= s.first.hold_s for s in pairs)
    assert not [s for s in pairs if s.first.kind in ETCD_KINDS and s.second.kind in ETCD_KINDS]  # type: ignore[union-attr]
