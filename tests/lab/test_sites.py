"""netlab.Sites: two LANs joined by a router. Multicast stays home, TCP crosses, the WAN delays, loses and caps
what crosses as configured, changes under traffic, and everything goes with the sites.

Timing checks are lower bounds from the configured values (a delay can only add), with generous upper bounds:
the machine is shared, and a loaded machine only makes things slower.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyroute2 import IPRoute
from support.leftovers import NOTHING, alive, objects_of
from support.tcpprobes import echo_client, echo_server, round_trips, round_trips_on_cue, send_bulk, sink

from netlab import MP, Impairment, LabError, Sites, down_all, ns
from netlab.packets import probe
from netlab.sites import ROUTER

pytestmark = pytest.mark.lab

NETLAB_CLI = Path(sys.executable).parent / "netlab"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
ZEPS_TTL = 16  # the multicast TTL ZEPS sends with (gateway.mcast.Tuning.hops): enough to cross routers


def forwarded() -> int:
    """Inside a host: IP datagrams it forwarded (ForwDatagrams of /proc/net/snmp)."""
    names, values = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Ip:")]
    return int(values[names.index("ForwDatagrams")])


def ip_forward() -> str:
    return IP_FORWARD.read_text().strip()


@pytest.fixture
def sites() -> Iterator[Sites]:
    with Sites(["a1", "a2"], ["b1", "b2"]) as two:
        yield two


def echo_port(sites: Sites, server: str) -> int:
    """Start an echo server (one connection) on ``server``; its port."""
    ready = MP.Queue()
    sites.start(server, echo_server, sites.host(server).ip, ready)
    return int(ready.get(timeout=30))


def rtts(sites: Sites, client: str, server: str, count: int = 20) -> list[float]:
    port = echo_port(sites, server)
    return list(sites.run(client, round_trips, sites.host(server).ip, port, count))


def bulk(sites: Sites, sender: str, receiver: str, size: int) -> float:
    """kbit/s of a ``size``-byte TCP transfer, timed by the receiver from its first byte to the last."""
    ready = MP.Queue()
    receiving = sites.start(receiver, sink, sites.host(receiver).ip, ready)
    sites.run(sender, send_bulk, sites.host(receiver).ip, ready.get(timeout=30), size, timeout=120)
    got, seconds = receiving.result(timeout=120)
    assert got == size
    return size * 8 / seconds / 1000


# --- the topology -------------------------------------------------------------------------------------


def test_hosts_sites_and_addresses(sites: Sites) -> None:
    assert [h.name for h in sites.hosts] == ["a1", "a2", ROUTER, "b1", "b2"]
    assert sites.a.subnet != sites.b.subnet and sites.a.bridge != sites.b.bridge
    assert [sites.site_of(n) for n in ("a1", "b2", ROUTER)] == ["a", "b", "b"]
    assert sites.router.netns == sites.router_a.netns == sites.host(ROUTER).netns
    assert sites.router_a.ip.endswith(".254") and sites.router_a.ifname == "site-a"
    assert sites.lab_of("a2") is sites.a and sites.lab("b") is sites.b
    with pytest.raises(KeyError, match="no host 'c1'"):
        sites.host("c1")
    with pytest.raises(ValueError, match="unique across both sites"):
        Sites(["x", "y"], ["y"])
    with pytest.raises(ValueError, match="'a-to-b', 'b-to-a' or 'both'"):
        sites.set_wan(Impairment(), "sideways")  # type: ignore[arg-type]
    with pytest.raises(LabError, match="not up"):
        Sites().set_wan(Impairment())


def test_multicast_stays_on_its_lan(sites: Sites) -> None:
    sites.set_wan(Impairment())  # counters on the WAN from now on
    for here, neighbour, there in (("a1", "a2", "b1"), ("b1", "b2", "a1")):
        group = sites.lab_of(here).group(1)
        assert probe(sites.lab_of(here), here, neighbour, group=group, count=300, pps=1000, ttl=ZEPS_TTL).lost() == []
        across = probe(sites.lab_of(here), here, sites.host(there), group=group, count=300, pps=1000, ttl=ZEPS_TTL)
        assert across.received == 0, f"multicast from {here} reached {there} on the other site"
    # Site B's bridge floods no multicast to the router: the WAN saw (almost) none of b1's 600 datagrams.
    assert sites.wan_counters("b-to-a").seen < 20


def test_tcp_crosses_the_router(sites: Sites) -> None:
    assert sites.run(ROUTER, ip_forward) == "1"
    before = sites.run(ROUTER, forwarded)
    payload = bytes(range(256)) * 400
    for client, server in (("a1", "b1"), ("b2", "a2")):
        ready = MP.Queue()
        echoing = sites.start(server, echo_server, sites.host(server).ip, ready)
        echoed = sites.run(client, echo_client, sites.host(server).ip, ready.get(timeout=30), payload, timeout=60)
        assert echoed == payload and echoing.result(timeout=30) == len(payload)
    assert sites.run(ROUTER, forwarded) - before >= 4 * len(payload) // 65536  # both ways, both connections


def test_wan_delay_shows_in_every_round_trip(sites: Sites) -> None:
    sites.set_wan(Impairment(delay_ms=30))
    assert sites.wan("a-to-b") == sites.wan("b-to-a") == Impairment(delay_ms=30)
    delayed = rtts(sites, "a1", "b1")
    assert min(delayed) >= 59.5, delayed  # 30 ms each way
    assert statistics.median(delayed) < 60 + 200  # generous: a loaded machine only adds

    sites.set_wan(Impairment(delay_ms=30, jitter_ms=10))
    jittered = rtts(sites, "b2", "a2", count=30)
    assert min(jittered) >= 39.5, jittered  # 20..40 ms each way
    assert max(jittered) - min(jittered) >= 5, jittered

    assert max(rtts(sites, "a1", "a2")) < 30  # the LAN itself is not delayed (a generous bound)


def test_wan_loss_shows_up_in_its_direction(sites: Sites) -> None:
    sites.set_wan(Impairment(loss_pct=10), "a-to-b")
    assert sites.wan("b-to-a") is None
    b1 = sites.host("b1")
    lossy = probe(sites.a, "a1", b1, group=b1.ip, count=2000, pps=2000)  # unicast, across the router
    assert 120 <= len(lossy.lost()) <= 280, len(lossy.lost())  # 10% of 2,000: 200, sd 13
    assert sites.wan_counters("a-to-b").dropped >= len(lossy.lost())
    a1 = sites.host("a1")
    assert probe(sites.b, "b1", a1, group=a1.ip, count=1000, pps=2000).lost() == []  # the other way is clean


def test_wan_rate_cap_bounds_a_bulk_transfer(sites: Sites) -> None:
    cap_kbit, size = 4000, 1_500_000  # 12 Mbit: 3 s at the cap
    free = bulk(sites, "a1", "b1", size)
    assert free > 2 * cap_kbit, free
    sites.set_wan(Impairment(rate_kbit=cap_kbit))
    assert sites.wan("a-to-b") == Impairment(rate_kbit=cap_kbit)
    capped = bulk(sites, "a1", "b1", size)
    assert 0.3 * cap_kbit <= capped <= 1.05 * cap_kbit, capped  # payload only: headers take their share too
    # The WAN carried wire-sized segments (the hosts' TCP segmentation offload is off), not 64 KB offload packets.
    assert sites.wan_counters("a-to-b").seen >= size // 1500


def test_wan_changes_under_traffic(sites: Sites) -> None:
    sites.set_wan(Impairment(delay_ms=10))
    cues, out = MP.Queue(), MP.Queue()
    client = sites.start("a1", round_trips_on_cue, sites.host("b1").ip, echo_port(sites, "b1"), 10, cues, out)

    def phase() -> list[float]:
        cues.put(True)
        return list(out.get(timeout=60))

    assert min(phase()) >= 19.5
    sites.set_wan(Impairment(delay_ms=40))  # on the same connection
    assert min(phase()) >= 79.5
    sites.clear_wan()
    assert sites.wan("a-to-b") is None and sites.wan("b-to-a") is None
    assert statistics.median(phase()) < 20
    sites.cut_wan()
    b1 = sites.host("b1")
    assert probe(sites.a, "a1", b1, group=b1.ip, count=100, pps=1000).received == 0
    sites.heal_wan()
    assert probe(sites.a, "a1", b1, group=b1.ip, count=100, pps=1000).lost() == []
    sites.cut_wan("drop")  # the router's firewall drops all it forwards: the same silence
    assert probe(sites.a, "a1", b1, group=b1.ip, count=100, pps=1000).received == 0
    sites.heal_wan()
    assert probe(sites.a, "a1", b1, group=b1.ip, count=100, pps=1000).lost() == []
    cues.put(False)
    assert client.result(timeout=30) == 3


# --- clean-up ----------------------------------------------------------------------------------------


def test_everything_goes_with_the_sites() -> None:
    root_forwarding = IP_FORWARD.read_text()
    wan = Impairment(delay_ms=5, loss_pct=1, rate_kbit=10_000)
    with pytest.raises(RuntimeError, match="mid-test"), Sites(["a1"], ["b1"], wan=wan) as sites:
        ids = (sites.a.id, sites.b.id)
        with IPRoute() as ipr:
            wan_port = ipr.link_lookup(ifname=sites.router.veth)[0]
            assert {q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=wan_port)} >= {"tbf", "clsact"}
        delay_pids = ns.pids_in_netns(sites.router.netns)
        assert len(delay_pids) == 2  # one delay process per direction
        assert sites.run(ROUTER, ip_forward) == "1"
        raise RuntimeError("mid-test")
    assert [objects_of(i) for i in ids] == [NOTHING, NOTHING]  # namespaces, bridges, veths (and their qdiscs)
    with IPRoute() as ipr:
        assert wan_port not in {m["index"] for m in ipr.link("dump")}
    assert not [pid for pid in delay_pids if alive(pid)]
    assert IP_FORWARD.read_text() == root_forwarding  # the router's forwarding was its own namespace's


_CRASHING_RUN = """
import os, netlab
sites = netlab.Sites(["a1"], ["b1"], wan=netlab.Impairment(delay_ms=5)).up()
print(sites.a.id, sites.b.id, flush=True)
os._exit(0)  # a crash: no teardown
"""


def test_down_all_removes_crashed_sites() -> None:
    out = subprocess.run([sys.executable, "-c", _CRASHING_RUN], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert all(objects_of(i)["netns"] for i in ids)
    assert sorted(down_all(ids[0]) + down_all(ids[1])) == sorted(ids)
    assert [objects_of(i) for i in ids] == [NOTHING, NOTHING]


# --- command line ------------------------------------------------------------------------------------


def netlab_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NETLAB_CLI), *args], capture_output=True, text=True, timeout=120)


def test_cli_sites_up_impair_down() -> None:
    name = f"st{os.getpid()}"
    ids: list[str] = []
    try:
        up = netlab_cli("sites", "up", "--name", name, "--a", "a-gw,a-sub", "--b", "b-gw", "--delay", "20ms")
        assert up.returncode == 0, up.stderr
        assert f"{name}-a" in up.stdout and f"{name}-b" in up.stdout and "delay 20ms" in up.stdout
        records = {r["name"]: r for r in json.loads(netlab_cli("status", "--json").stdout)["labs"]}
        ids = [records[f"{name}-a"]["id"], records[f"{name}-b"]["id"]]
        assert [h["name"] for h in records[f"{name}-b"]["hosts"]] == [ROUTER, "b-gw"]
        changed = netlab_cli("impair", f"{name}-b/{ROUTER}", "--dir", "both", "--loss", "1%", "--rate", "10mbit")
        assert f"{ROUTER} out: loss 1%, rate 10mbit" in changed.stdout, changed.stderr
        again = netlab_cli("sites", "up", "--name", name)
        assert again.returncode == 1 and "already exists" in again.stderr
    finally:
        down = netlab_cli("sites", "down", name)
    assert down.returncode == 0, down.stderr
    assert [objects_of(i) for i in ids] == [NOTHING, NOTHING]
    missing = netlab_cli("sites", "down", name)
    assert missing.returncode == 1 and "no sites named" in missing.stderr
