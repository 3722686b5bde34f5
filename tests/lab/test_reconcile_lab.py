"""The reconciling subscriber end to end: real gateway, replay sidecar, multicast between lab hosts.

In every scenario the delivered sequence must equal the published one, record for record.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.feedlab import STREAM, WAIT_S, deploy, expected, publish, subscribe, subscribe_async

from gateway.mcast import Tuning
from gateway.tools.deployment import Deployment
from netlab.impair import Impairment, counters, drop_next, impair, wait_burst
from netlab.procs import MP

pytestmark = pytest.mark.lab


@pytest.fixture
def deployment(make_lab, tmp_path: Path, request):
    feeds = getattr(request, "param", 1)
    lab = make_lab(["pub", "gw", "sub"])
    dep = deploy(lab, tmp_path, feeds)
    yield dep
    assert not dep.close()


def start_subscriber(deployment: Deployment, start: str, until: int, *, feeds: list[str] | None = None, run=subscribe):
    """A subscriber process on host "sub", until sequence `until`; returns once its sockets are up."""
    ready = MP.Queue()
    feeds = deployment.for_host("sub") if feeds is None else feeds
    proc = deployment.lab.start("sub", run, feeds, deployment.replay, start, until, ready)
    ready.get(timeout=WAIT_S)
    return proc


def check(result: dict, first: int, last: int) -> None:
    assert not result["losses"], result["losses"]
    want = expected(first, last)
    got = result["records"]
    assert len(got) == len(want), (len(got), len(want), result["summary"])
    for w, g in zip(want, got, strict=True):
        assert g == w


def test_late_joiner_catches_up_on_100k_records_then_merges_with_live(deployment: Deployment) -> None:
    lab = deployment.lab
    assert lab.run("pub", publish, deployment.ingest, 0, 100_000, 0.0, timeout=WAIT_S) == 100_000
    sub = start_subscriber(deployment, "earliest", 130_000)
    # Live traffic keeps flowing while the late joiner replays history.
    assert lab.run("pub", publish, deployment.ingest, 100_000, 30_000, 20_000.0, timeout=WAIT_S) == 130_000
    result = sub.result(timeout=WAIT_S)
    check(result, 1, 130_000)
    # History came from the journal; OpenPGM may also serve a late joiner part of it from the sender's
    # transmit window (RATE x RECOVERY_IVL), so the split varies: only both sources being used is certain.
    assert result["sources"].get("replay", 0) > 0, result["sources"]
    assert result["sources"].get("live:A", 0) > 0, result["sources"]  # it did switch to live
    assert result["state"] == "MERGED"


@pytest.mark.parametrize("deployment", [2], indirect=True)
def test_ab_feeds_with_one_feed_dead(deployment: Deployment) -> None:
    lab = deployment.lab
    dead, alive = deployment.for_host("sub")
    dead = dead.replace(dead.split(";")[1].split(":")[0], "239.192.254.254")  # a group nobody sends to
    sub = start_subscriber(deployment, "latest", 20_000, feeds=[dead, alive])
    lab.run("pub", publish, deployment.ingest, 0, 20_000, 20_000.0, timeout=WAIT_S)
    result = sub.result(timeout=WAIT_S)
    first = result["records"][0][0]
    check(result, first, 20_000)
    assert result["sources"].get("live:B", 0) > 0 and "live:A" not in result["sources"]


@pytest.mark.parametrize("deployment", [2], indirect=True)
def test_ab_feeds_first_copy_wins(deployment: Deployment) -> None:
    lab = deployment.lab
    sub = start_subscriber(deployment, "latest", 20_000)
    lab.run("pub", publish, deployment.ingest, 0, 20_000, 20_000.0, timeout=WAIT_S)
    result = sub.result(timeout=WAIT_S)
    check(result, result["records"][0][0], 20_000)
    assert result["summary"]["duplicates_dropped"] > 0  # every batch came twice; one copy was delivered


def test_replay_sidecar_restarted_mid_catch_up(deployment: Deployment) -> None:
    lab = deployment.lab
    lab.run("pub", publish, deployment.ingest, 0, 200_000, 0.0, timeout=WAIT_S)
    sub = start_subscriber(deployment, "earliest", 210_000)
    deployment.kill9("replay")
    deployment.start_replay()
    lab.run("pub", publish, deployment.ingest, 200_000, 10_000, 10_000.0, timeout=WAIT_S)
    check(sub.result(timeout=WAIT_S), 1, 210_000)


def test_gateway_killed_and_restarted(deployment: Deployment) -> None:
    lab = deployment.lab
    sub = start_subscriber(deployment, "earliest", 40_000)
    lab.run("pub", publish, deployment.ingest, 0, 20_000, 20_000.0, timeout=WAIT_S)
    deployment.kill9("gateway")
    deployment.start_gateway()
    # Sequences continue from the journal head: the subscriber sees one unbroken stream.
    assert lab.run("pub", publish, deployment.ingest, 20_000, 20_000, 20_000.0, timeout=WAIT_S) == 40_000
    check(sub.result(timeout=WAIT_S), 1, 40_000)


def _feed_port(deployment: Deployment) -> int:
    return int(deployment.multicast[0].rsplit(":", 1)[1])


def _without_pgm_repair(deployment: Deployment, host: str) -> None:
    """Drop every PGM packet `host` sends (its NAKs): what PGM would repair itself, the reconciler must."""
    drop_next(deployment.lab, host, 10**9, udp_port=_feed_port(deployment), direction="out")


def test_random_5pct_loss_on_the_subscriber_link(deployment: Deployment) -> None:
    lab = deployment.lab
    impair(lab, "sub", Impairment(loss_pct=5.0), direction="both")  # data, repairs and NAKs all suffer
    sub = start_subscriber(deployment, "latest", 30_000)
    lab.run("pub", publish, deployment.ingest, 0, 30_000, 20_000.0, timeout=WAIT_S)
    result = sub.result(timeout=WAIT_S)
    check(result, result["records"][0][0], 30_000)
    assert counters(lab, "sub", "in").dropped > 100  # the loss was real


def test_openpgm_counters_are_subscriber_metrics(deployment: Deployment) -> None:
    """The feed read through gateway.transport.pgm under 2% loss: OpenPGM repairs what it can, and its counters
    are in the subscriber's metrics."""
    lab = deployment.lab
    impair(lab, "sub", Impairment(loss_pct=2.0), direction="in")
    run = functools.partial(subscribe, metrics=True, tuning=Tuning(libzmq_pgm=False))
    sub = start_subscriber(deployment, "latest", 20_000, run=run)
    lab.run("pub", publish, deployment.ingest, 0, 20_000, 10_000.0, timeout=WAIT_S)
    result = sub.result(timeout=WAIT_S)
    check(result, result["records"][0][0], 20_000)
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(result["metrics"])
        for sample in family.samples
        if sample.name.startswith("zeps_subscriber_pgm_") and sample.labels == {"stream": STREAM, "feed": "A"}
    }
    assert samples["zeps_subscriber_pgm_repairs_total"] > 0, result["metrics"]
    assert {"zeps_subscriber_pgm_lost_total", "zeps_subscriber_pgm_junk_total"} <= samples.keys()


def test_burst_of_1000_lost_packets_is_filled_from_replay(deployment: Deployment) -> None:
    lab = deployment.lab
    _without_pgm_repair(deployment, "sub")
    sub = start_subscriber(deployment, "latest", 40_000)
    lab.run("pub", publish, deployment.ingest, 0, 10_000, 20_000.0, timeout=WAIT_S)
    drop_next(lab, "sub", 1000, udp_port=_feed_port(deployment))
    lab.run("pub", publish, deployment.ingest, 10_000, 30_000, 20_000.0, timeout=WAIT_S)
    assert wait_burst(lab, "sub").burst_dropped == 1000
    result = sub.result(timeout=WAIT_S)
    check(result, result["records"][0][0], 40_000)
    # PGM holds back everything after a hole it cannot repair: the reconciler sees either a gap or a silent
    # feed, and fills from replay either way.
    assert result["sources"].get("replay", 0) > 1000, result["summary"]


def test_tail_loss_is_found_from_heartbeats_and_filled(deployment: Deployment) -> None:
    """The last batches are lost and nothing follows them but heartbeats: their head reveals the tail."""
    lab = deployment.lab
    _without_pgm_repair(deployment, "sub")
    sub = start_subscriber(deployment, "latest", 20_000)
    lab.run("pub", publish, deployment.ingest, 0, 19_000, 20_000.0, timeout=WAIT_S)
    time.sleep(0.5)  # let the subscriber take in the first part
    drop_next(lab, "sub", 10**9, udp_port=_feed_port(deployment))  # the tail is lost, whatever its size
    assert lab.run("pub", publish, deployment.ingest, 19_000, 1_000, 0.0, timeout=WAIT_S) == 20_000
    time.sleep(0.5)
    drop_next(lab, "sub", 0, udp_port=_feed_port(deployment))  # the publisher has stopped: only heartbeats now
    result = sub.result(timeout=WAIT_S)
    check(result, result["records"][0][0], 20_000)
    assert result["sources"].get("replay", 0) >= 1_000, result["sources"]


def test_async_subscriber_late_join_with_metrics(deployment: Deployment) -> None:
    lab = deployment.lab
    lab.run("pub", publish, deployment.ingest, 0, 30_000, 0.0, timeout=WAIT_S)
    sub = start_subscriber(deployment, "earliest", 40_000, run=subscribe_async)
    lab.run("pub", publish, deployment.ingest, 30_000, 10_000, 20_000.0, timeout=WAIT_S)
    result = sub.result(timeout=WAIT_S)
    check(result, 1, 40_000)
    assert result["sources"].get("replay", 0) > 0 and result["state"] == "MERGED"
    metrics = result["metrics"]
    delivered = [
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "zeps_subscriber_delivered_records_total" and sample.labels["stream"] == STREAM
    ]
    assert sum(delivered) == 40000, metrics
    assert f'zeps_subscriber_state{{stream="{STREAM}",zeps_subscriber_state="MERGED"}} 1.0' in metrics, metrics
    assert "zeps_subscriber_lag_records" in metrics


def send_junk(group: str, port: int, count: int) -> int:
    """In a lab host: `count` datagrams of random bytes (and truncated frames) to the feed's group and port."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 4)
        for i in range(count):
            junk = os.urandom(1 + i % 1400) if i % 2 else bytes((0, 1, 200)) + STREAM.encode()  # a cut-off frame
            sock.sendto(junk, (group, port))
    return count


def test_udp_feed_with_5pct_loss_and_junk_datagrams(make_lab, tmp_path: Path) -> None:
    """udp:// hands every datagram over as it comes: each loss is a gap the reconciler fills from replay at
    once, and datagrams that are not messages are dropped without harm."""
    lab = make_lab(["pub", "gw", "sub"])
    dep = deploy(lab, tmp_path, transport="udp")
    try:
        impair(lab, "sub", Impairment(loss_pct=5.0), direction="in")
        sub = start_subscriber(dep, "latest", 30_000)
        lab.run("pub", publish, dep.ingest, 0, 15_000, 20_000.0, timeout=WAIT_S)
        group, port = dep.multicast[0].split(";")[1].split(":")
        assert lab.run("pub", send_junk, group, int(port), 500, timeout=WAIT_S) == 500
        lab.run("pub", publish, dep.ingest, 15_000, 15_000, 20_000.0, timeout=WAIT_S)
        result = sub.result(timeout=WAIT_S)
        check(result, result["records"][0][0], 30_000)
        assert result["sources"].get("replay", 0) > 100, result["summary"]  # no multicast repair: replay filled
        assert result["summary"]["rejected_packets"] >= 200, result["summary"]  # at least the cut-off frames
    finally:
        assert not dep.close()
