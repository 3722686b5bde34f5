"""A gateway whose network refuses its sends keeps running (issue #30): one gateway and its sidecar on host
"gw", a paced confirming publisher and a reconciling subscriber on hosts of their own; inside the gateway's
namespace, one partition kind after another (netlab.impair.cuts: iptables DROP and REJECT in INPUT, OUTPUT or
both, the routes removed, the link set down, the eBPF drop), each held for HOLD_S. The gateway and the sidecar
must be running after each, and the subscriber must get every record once, in order, once it is healed.

Every kind runs on udp:// (its sender saw the EPERM that ended the gateway); epgm:// and norm:// get the kinds
their sending sockets see (OUTPUT rules, routes, the link), a third of the time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.feedlab import check_all, deploy, publish, subscribe

from netlab import Lab
from netlab.impair.cuts import KINDS, cut
from netlab.procs import MP

pytestmark = pytest.mark.lab

RATE = 2_000  # records/s, in batches of 100
HOLD_S = 2.0  # one partition
BETWEEN_S = 0.5  # healed between two
SEEN_BY_SENDER = ("drop-out", "reject-both", "route", "link-down")
CUTS = {"udp": KINDS, "epgm": SEEN_BY_SENDER, "norm": SEEN_BY_SENDER}


@pytest.mark.parametrize("transport", list(CUTS))
def test_the_gateway_survives_every_partition(make_lab, tmp_path: Path, transport: str) -> None:
    lab: Lab = make_lab(["pub", "gw", "sub"])
    kinds = CUTS[transport]
    count = int(RATE * (1.0 + len(kinds) * (HOLD_S + BETWEEN_S)))
    dep = deploy(lab, tmp_path, transport=transport)
    try:
        ready = MP.Queue()
        sub = lab.start("sub", subscribe, dep.for_host("sub"), dep.replay, "earliest", count, ready)
        ready.get(timeout=30)
        pub = lab.start("pub", publish, dep.ingest, 0, count, RATE)
        time.sleep(1.0)
        for kind in kinds:
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
