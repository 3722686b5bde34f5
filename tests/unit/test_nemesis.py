"""The nemesis schedule (gateway.bench.nemesis.schedule): a pure function of its seed, holding exactly the
faults asked for, of every kind over a long run, overlapping some, with at most one etcd fault at a time; or of
the kinds asked for only, one at a time when asked (`zeps bench chaos --kinds ... --no-overlap`)."""

from __future__ import annotations

import pytest

from gateway.bench.nemesis import ETCD_KINDS, KINDS, schedule
from gateway.cli.main import build_parser, main

LEADER = ("kill-leader", "pause-leader", "partition-leader")  # issue #30's faults


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


def test_chosen_kinds_without_overlap() -> None:
    steps = schedule(5, 200, LEADER, overlap=False)
    assert len(steps) == 200 and all(s.second is None for s in steps)
    assert {s.first.kind for s in steps} == set(LEADER)
    assert schedule(5, 200, LEADER, overlap=False) == steps  # the seed, the kinds and the flag repeat it
    assert schedule(5, 200, LEADER) != steps
    overlapping = schedule(5, 200, LEADER)
    assert {f.kind for s in overlapping for f in (s.first, s.second) if f is not None} == set(LEADER)
    assert any(s.second is not None for s in overlapping)


def test_etcd_kinds_alone_never_overlap_each_other() -> None:
    steps = schedule(3, 50, tuple(ETCD_KINDS))
    assert sum(s.faults() for s in steps) == 50 and all(s.second is None for s in steps)


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'kill-everything'.*choose one or more of kill-leader"):
        schedule(1, 5, ("kill-leader", "kill-everything"))
    with pytest.raises(ValueError, match="no fault kind given"):
        schedule(1, 5, ())


def test_bench_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["bench", "chaos", "--kinds", ",".join(LEADER), "--no-overlap"])
    assert (args.kinds, args.overlap) == (LEADER, False)
    args = build_parser().parse_args(["bench", "chaos"])
    assert (args.kinds, args.overlap) == (None, True)
    assert main(["bench", "chaos", "--kinds", "kill-leader,pause-lead"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'pause-lead'" in err and "pause-leader" in err and "kill-sidecar-catchup" in err
