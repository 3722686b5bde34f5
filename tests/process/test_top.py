"""`zeps top` against a running deployment (gateway, replay sidecar, subscriber: real processes on loopback),
and the Grafana dashboard against the metrics those processes export."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.servers import STREAM, GatewayProcess, Sidecar, free_port, start_sidecar

from gateway.client.publisher import Publisher

ZEPS = [sys.executable, "-m", "gateway.cli"]
DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-zeps.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "stateset": ("",)}


class Deployment:
    def __init__(self, gateway: GatewayProcess, sidecar: Sidecar, subscriber: subprocess.Popen, ports: dict) -> None:
        self.gateway, self.sidecar, self.subscriber, self.ports = gateway, sidecar, subscriber, ports

    def top(self, *extra: str) -> subprocess.CompletedProcess:
        argv = [*ZEPS, "top", "--once", "--json", "--interval", "1"]
        for kind, port in self.ports.items():
            argv += [f"--{kind}", f"127.0.0.1:{port}"]
        return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=60)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    ports = {"gateway": free_port(), "replay": free_port(), "subscriber": free_port()}
    journal = tmp_path / "journal"
    gw = GatewayProcess(journal, "--metrics", f"127.0.0.1:{ports['gateway']}")
    try:
        with start_sidecar(journal, "--metrics", f"127.0.0.1:{ports['replay']}") as sidecar:
            sub_argv = ["subscribe", "--replay", sidecar.endpoint, "--stream", STREAM, "--from", "earliest", "--quiet"]
            metrics = ["--metrics", f"127.0.0.1:{ports['subscriber']}"]
            sub = subprocess.Popen([*ZEPS, *sub_argv, *metrics], stderr=subprocess.PIPE, text=True)
            try:
                _wait_serving(ports["subscriber"], sub)
                yield Deployment(gw, sidecar, sub, ports)
            finally:
                sub.send_signal(signal.SIGTERM)
                _, err = sub.communicate(timeout=20)
                assert sub.returncode == 0 and "Traceback" not in err, err
    finally:
        gw.stop()


def _wait_serving(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            _scrape(port)
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing serves metrics on port {port} after {timeout} s"
            time.sleep(0.1)


def _publish(ingest: str, stream: str, count: int, rate: float = 0.0) -> None:
    with Publisher(ingest, stream, confirm=True) as pub:
        start = time.monotonic()
        for i in range(count):
            if rate and i % 50 == 0:
                time.sleep(max(0.0, start + i / rate - time.monotonic()))
            pub.publish(f"k{i % 5}", b"%05d" % i)
        pub.flush()


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_zeps_top_once_json_shows_the_deployment(deployment: Deployment) -> None:
    _publish(deployment.gateway.ingest, STREAM, 300)
    _publish(deployment.gateway.ingest, "other", 7)
    # A paced load while top takes its two scrapes, so that rates are there to see.
    load = threading.Thread(target=_publish, args=(deployment.gateway.ingest, STREAM, 10_000, 2000.0))
    load.start()
    try:
        result = deployment.top()
    finally:
        load.join(timeout=60)
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    [gw], [rp], [sub] = view["gateway"], view["replay"], view["subscriber"]
    assert gw["up"] and rp["up"] and sub["up"]
    assert gw["problems"] == rp["problems"] == sub["problems"] == []

    orders, other = gw["streams"][STREAM], gw["streams"]["other"]
    assert 300 < orders["head"] <= 10_300 and orders["journaled_records"] == orders["head"]
    assert orders["records_per_s"] > 0 and orders["bytes_per_s"] > 0
    assert orders["publishers"] == 1 and other["publishers"] == 0  # the load's publisher was attached
    assert other["head"] == other["published_records"] == 7 and other["records_per_s"] == 0
    assert not orders["journal_full"] and orders["refused_records"] == 0
    assert gw["multicast"] == []  # loopback: no multicast output

    served = rp["streams"][STREAM]
    # The subscription, and the connection a TCP-only subscriber asks the sidecar's head on.
    assert served["clients"] == 2 and served["credit_bytes"] > 0 and served["served_records"] >= 300
    assert rp["streams"]["other"]["clients"] == 0

    mine = sub["streams"][STREAM]
    assert mine["delivered_records"] >= 300 and mine["delivered_by_source"]["replay"] == mine["delivered_records"]
    assert mine["head"] >= 300 and mine["lag_records"] >= 0 and mine["records_per_s"] > 0
    # Replay only, under load: MERGED while within tail_grace of the head the sidecar reports, else catching up.
    assert mine["state"] in ("MERGED", "CATCHING_UP")
    assert mine["lost_records"] == mine["gaps_detected"] == mine["rejected_messages"] == 0

    # A target that is down is shown as such, and --once says so in its exit code.
    result = deployment.top("--subscriber", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1
    down = json.loads(result.stdout)["subscriber"][1]
    assert not down["up"] and "refused" in down["error"].lower()


def test_a_tcp_only_subscriber_caught_up_with_the_sidecars_head_is_merged(deployment: Deployment) -> None:
    """Issue #33 item 7: the subscriber has no multicast; once it has everything the sidecar reports, its state,
    its metric and zeps top say MERGED, not CATCHING_UP with lag 0."""
    _publish(deployment.gateway.ingest, STREAM, 300)
    deadline = time.monotonic() + 20
    while (state := _state(deployment.ports["subscriber"])) != "MERGED" or _head(deployment) != 300:
        assert time.monotonic() < deadline, f"still {state} 20 s after the last record was journaled"
        time.sleep(0.1)
    result = deployment.top()
    mine = json.loads(result.stdout)["subscriber"][0]["streams"][STREAM]
    assert (mine["state"], mine["head"], mine["lag_records"], mine["delivered_records"]) == ("MERGED", 300, 0, 300)


def _state(port: int) -> str:
    """The state zeps_subscriber_state says is set."""
    for family in text_string_to_metric_families(_scrape(port)):
        if family.name == "zeps_subscriber_state":
            [state] = [s.labels["zeps_subscriber_state"] for s in family.samples if s.value == 1]
            return state
    raise AssertionError("no zeps_subscriber_state series")


def _head(deployment: Deployment) -> float:
    for family in text_string_to_metric_families(_scrape(deployment.ports["subscriber"])):
        if family.name == "zeps_subscriber_head_sequence":
            return family.samples[0].value
    raise AssertionError("no zeps_subscriber_head_sequence series")


def test_the_grafana_dashboard_uses_only_exported_metrics(deployment: Deployment) -> None:
    _publish(deployment.gateway.ingest, STREAM, 10)
    exported: set[str] = set()
    for port in deployment.ports.values():
        for family in text_string_to_metric_families(_scrape(port)):
            exported.update(s.name for s in family.samples)
            exported.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", ())]
    assert len(exprs) >= 15
    used = {name for expr in exprs for name in re.findall(r"\bzeps_\w+", expr)}
    assert used - exported == set(), f"the dashboard names metrics no one exports: {sorted(used - exported)}"
    # And it covers every part of the deployment.
    assert {n.split("_")[1] for n in used} >= {"gateway", "replay", "subscriber"}
