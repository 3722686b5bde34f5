"""A gateway whose network refuses its sends keeps running (issue #30): one gateway and its sidecar on host
"gw", multicasting each record on udp://, epgm:// and norm:// at once (a refused send on any of them used to end
the process), a paced confirming publisher and a reconciling subscriber of all three feeds on hosts of their
own. Inside the gateway's namespace, one partition kind after another (netlab.impair.cuts: iptables DROP and
REJECT in INPUT, OUTPUT or both, the routes removed, the link set down), each held for HOLD_S. The gateway and
the sidecar must be running after each, and the subscriber must get every record once, in order, once healed.

The eBPF drop and DROP both ways are left to the fault harness (support.hafaults, tests/lab/test_ha_faults_lab.py),
and the transports share one lab, to keep the time this file adds near half a minute.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.feedlab import STREAM, check_all, publish, subscribe

from gateway.tools.deployment import Deployment
from netlab import Lab
from netlab.impair.cuts import KINDS, cut
from netlab.procs import MP

pytestmark = pytest.mark.lab

RATE = 2_000  # records/s, in batches of 100
HOLD_S = 2.0  # one partition
BETWEEN_S = 0.5  # healed between two
CUTS = tuple(k for k in KINDS if k not in ("ebpf", "drop-both"))
FEEDS = {"udp": 1, "epgm": 2, "norm": 3}  # transport: its group (lab.group(N)) and port (5554 + N)


def test_the_gateway_survives_every_partition_on_every_transport(make_lab, tmp_path: Path) -> None:
    lab: Lab = make_lab(["pub", "gw", "sub"])
    count = int(RATE * (1.0 + len(CUTS) * (HOLD_S + BETWEEN_S)))
    feeds = {t: f"{t}://{{ip}};{lab.group(n)}:{5554 + n}" for t, n in FEEDS.items()}
    more = [arg for t in ("epgm", "norm") for arg in ("--multicast", feeds[t].format(ip=lab.host("gw").ip))]
    dep = Deployment(lab, tmp_path, STREAM, transport="udp", gateway_args=more)
    try:
        ready = MP.Queue()
        mine = [feed.format(ip=lab.host("sub").ip) for feed in feeds.values()]
        sub = lab.start("sub", subscribe, mine, dep.replay, "earliest", count, ready)
        ready.get(timeout=30)
        pub = lab.start("pub", publish, dep.ingest, 0, count, RATE)
        time.sleep(1.0)
        for kind in CUTS:
            with cut(lab, "gw", kind):
                time.sleep(HOLD_S)
            exited = [p for p in (dep.gateway, dep.sidecar) if p is None or p.poll() is not None]
            assert not exited, f"exited after {kind}: {dep.close()}"
            time.sleep(BETWEEN_S)
        last = pub.result(90)
        assert last == count
        check_all(sub.result(120), last)
    finally:
        problems = dep.close()
    assert not problems, problems
    said = [line for line in dep.stderr["gateway"].splitlines() if "libpgm: sendto()" in line]
    # libpgm's warnings (one per packet it could not send, on stdout by default): in our log, a few, counted
    assert 1 <= len(said) <= 2 * len(CUTS), said
