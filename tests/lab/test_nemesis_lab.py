"""A short seeded chaos campaign (gateway.bench.chaos, `zeps bench chaos`): a group of 3 on udp:// through 10
combined, overlapping faults of the nemesis with loss and junk throughout; the checker must find nothing.
The seed is fixed, so a failure here is reproduced with `zeps bench chaos --transport udp --faults 10 --seed 34`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.bench.chaos import NODES, campaign

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]


def test_short_campaign(make_lab, tmp_path: Path) -> None:
    lab = make_lab(["etcd", *NODES, "pub", "sub"])
    got = campaign(lab, tmp_path, "udp", 10, seed=34)
    print(f"\n{got['faults']} faults in {got['steps']} steps, {got['confirmed']} confirmed, outage and silence "
          f"p50/p99/max {got['stats']}; long silences {got['long']}; {got['summary']}")  # fmt: skip
    assert got["faults"] == 10
    assert got["clock_steps"] >= 3  # the nodes' wall clocks were stepped meanwhile (the checker: time never back)
    assert not got["problems"], got["problems"]
