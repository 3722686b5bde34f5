"""`zeps top` on a LAN of namespaces: a gateway with a udp:// multicast output, its sidecar and a subscriber,
all with metrics; a burst of lost datagrams is repaired from the journal, and the view shows it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.feedlab import STREAM, WAIT_S, publish

from gateway.tools.deployment import wait_ping
from netlab import Lab
from netlab.impair import drop_next, wait_burst

ZEPS = [sys.executable, "-m", "gateway.cli"]
PORT = 5555
DROPS = 300  # datagrams: heartbeats (40/s) while no one publishes, then data


def top(lab: Lab, argv: list[str]) -> dict[str, Any]:
    """`zeps top --once --json` run on host "pub"."""
    proc = lab.popen("pub", [*ZEPS, "top", "--once", "--json", "--interval", "0.5", *argv], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    return json.loads(out)


def test_zeps_top_shows_multicast_and_a_lost_burst_repaired_from_replay(make_lab, tmp_path: Path) -> None:
    lab = make_lab(["pub", "gw", "sub"])
    gw, sub = lab.host("gw"), lab.host("sub")
    group = lab.group(1)
    ingest, replay = f"tcp://{gw.ip}:5570", f"tcp://{gw.ip}:5580"
    log = open(tmp_path / "servers.log", "w")  # noqa: SIM115
    procs = []

    def start(host: str, *args: str) -> None:
        procs.append(lab.popen(host, [*ZEPS, *args], stdout=subprocess.DEVNULL, stderr=log))

    try:
        start("gw", "gateway", "--stream", STREAM, "--stream", "quotes", "--journal", str(tmp_path / "journal"),
              "--ingest", ingest, "--replay-endpoint", replay, "--multicast", f"udp://{gw.ip};{group}:{PORT}",
              "--heartbeat-ms", "50", "--metrics", f"{gw.ip}:9108")  # fmt: skip
        lab.run("gw", wait_ping, ingest, 30.0, timeout=40)
        start("gw", "replay", "--journal", str(tmp_path / "journal"), "--bind", replay, "--metrics", f"{gw.ip}:9109")
        lab.run("gw", wait_ping, replay, 30.0, timeout=40)
        start("sub", "subscribe", "--multicast", f"udp://{sub.ip};{group}:{PORT}", "--replay", replay,
              "--stream", STREAM, "--quiet", "--metrics", f"{sub.ip}:9110")  # fmt: skip
        targets = ["--gateway", f"{gw.ip}:9108", "--replay", f"{gw.ip}:9109", "--subscriber", f"{sub.ip}:9110"]
        deadline = time.monotonic() + WAIT_S
        while not (view := top(lab, targets))["subscriber"][0]["up"]:
            assert time.monotonic() < deadline, view
        lab.run("pub", publish, ingest, 0, 5_000, 5_000.0, timeout=WAIT_S)
        drop_next(lab, "sub", DROPS, udp_port=PORT)
        lab.run("pub", publish, ingest, 5_000, 5_000, 5_000.0, timeout=WAIT_S)
        assert wait_burst(lab, "sub").burst_dropped == DROPS
        quotes = lab.popen("pub", [*ZEPS, "publish", "--ingest", ingest, "--stream", "quotes", "--count", "100"])
        assert quotes.wait(60) == 0
        while True:
            view = top(lab, targets)
            mine = view["subscriber"][0]["streams"][STREAM]
            if mine["delivered_records"] == 10_000 and mine["state"] == "MERGED":
                break
            assert time.monotonic() < deadline, view
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(30) == 0, (tmp_path / "servers.log").read_text()
        log.close()

    [gateway], [sidecar], [subscriber] = view["gateway"], view["replay"], view["subscriber"]
    assert gateway["problems"] == sidecar["problems"] == subscriber["problems"] == []
    assert gateway["streams"][STREAM]["head"] == 10_000 and gateway["streams"]["quotes"]["head"] == 100
    [out] = gateway["multicast"]
    assert out["endpoint"].startswith("udp://") and out["queue_messages"] == 0
    assert out["streams"][STREAM]["sent_head"] == 10_000 and out["streams"]["quotes"]["sent_head"] == 100
    assert out["streams"][STREAM]["behind_records"] == 0
    # The lost datagrams were repaired from the journal (no loss), and the view shows where records came from.
    # (The reconciler repairs a burst this long by a catch-up rather than a gap fill: gaps_* may stay 0.)
    by_source = mine["delivered_by_source"]
    assert by_source["replay"] >= 1 and by_source["live"] >= 5_000 and mine["gaps_filled"] == mine["gaps_detected"]
    assert mine["lost_records"] == 0 and mine["lag_records"] == 0 and mine["head"] == 10_000
    assert sidecar["streams"][STREAM]["served_records"] >= by_source["replay"]
