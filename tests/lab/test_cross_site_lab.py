"""ZEPS across two sites as users run it before mirroring: the gateway and its replay sidecar on site A, a
subscriber on site A reading the multicast, and one on site B reading A's sidecar over TCP across the WAN (30 ms
each way, 1% loss): both get records 1..N exactly once, in order; site B's only by replay. And a deployment on
each site, as the mirror tests start them, the same stream name on both: each site's subscriber gets its own
site's feed, by multicast. (That no multicast crosses sites is tested packet by packet in test_sites.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.feedlab import check_all, publish, subscribe
from support.sitelab import WAN, deployed, two_sites

from netlab import MP

pytestmark = pytest.mark.lab

COUNT = 5_000
RATE = 2_000.0  # records/s: 2.5 s of publishing


def test_site_b_follows_site_a_over_tcp_only(tmp_path: Path) -> None:
    with two_sites(WAN) as sites, deployed(sites, "a", tmp_path / "journal") as dep:
        assert sites.wan("a-to-b") == sites.wan("b-to-a") == WAN
        ready = MP.Queue()
        near = sites.start("a-sub", subscribe, dep.for_host("a-sub"), dep.replay, "earliest", COUNT, ready)
        far = sites.start("b-sub", subscribe, [], dep.replay, "earliest", COUNT, ready)  # TCP only
        assert [ready.get(timeout=60) for _ in range(2)] == ["up", "up"]
        assert sites.run("a-spare", publish, dep.ingest, 0, COUNT, RATE, timeout=120) == COUNT

        local, remote = near.result(timeout=120), far.result(timeout=120)
        check_all(local, COUNT)
        check_all(remote, COUNT)
        assert set(remote["sources"]) == {"replay"}, remote["sources"]
        live = sum(n for source, n in local["sources"].items() if source.startswith("live"))
        assert live > COUNT // 2, local["sources"]  # site A's LAN carries the feed by multicast
        assert sites.wan_counters("a-to-b").seen >= 10  # the sidecar's answers went through the WAN's loss stage


def test_each_site_runs_its_own_feed(tmp_path: Path) -> None:
    counts = {"a": 2_000, "b": 1_000}
    with two_sites(WAN) as sites, deployed(sites, "a", tmp_path / "a") as a, deployed(sites, "b", tmp_path / "b") as b:
        ready = MP.Queue()
        subscribers = {
            site: sites.start(f"{site}-sub", subscribe, dep.for_host(f"{site}-sub"), dep.replay, "earliest",
                              counts[site], ready)
            for site, dep in (("a", a), ("b", b))
        }  # fmt: skip
        assert [ready.get(timeout=60) for _ in range(2)] == ["up", "up"]
        for site, dep in (("a", a), ("b", b)):
            assert sites.run(f"{site}-spare", publish, dep.ingest, 0, counts[site], RATE, timeout=120) == counts[site]
        for site, handle in subscribers.items():
            result = handle.result(timeout=120)
            check_all(result, counts[site])
            assert sum(n for s, n in result["sources"].items() if s.startswith("live")) > counts[site] // 2
