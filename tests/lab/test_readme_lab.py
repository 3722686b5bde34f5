"""README.md's multicast quick start runs as written on a two-host lab: gateway and sidecar on one host, the
snippet's subscriber on the other (PGM does not loop back to the sending host)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.readme import quick_start_snippets

from gateway import Publisher, PublishError

pytestmark = pytest.mark.lab
ZEPS = [sys.executable, "-m", "gateway.cli"]


def test_multicast_quick_start_subscribes_live(make_lab, tmp_path: Path) -> None:
    lab = make_lab(["gw", "sub"])
    gw, sub = lab.host("gw"), lab.host("sub")
    snippet = quick_start_snippets()[1]
    assert "epgm://eth1;239.192.1.1:5555" in snippet and "tcp://GW:5571" in snippet
    code = snippet.replace("eth1", sub.ifname).replace("tcp://GW:5571", f"tcp://{gw.ip}:5571")
    journal = tmp_path / "journal"
    journal.mkdir()
    ingest, replay = f"tcp://{gw.ip}:5570", f"tcp://{gw.ip}:5571"
    servers = [
        lab.popen(gw, [*ZEPS, "gateway", "--stream", "orders", "--journal", str(journal), "--ingest", ingest,
                       "--multicast", f"epgm://{gw.ifname};239.192.1.1:5555", "--replay-endpoint", replay, "-q"]),
        lab.popen(gw, [*ZEPS, "replay", "--journal", str(journal), "--bind", replay, "-q"], stdout=subprocess.DEVNULL),
    ]  # fmt: skip
    try:
        reader = lab.popen(sub, [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        published = lab.run(gw, _publish, ingest, 5, timeout=60)  # the gateway is up once this attaches
        out, err = reader.communicate(timeout=60)  # it ends 10 s after the last record
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(10)
    assert published == 5 and reader.returncode == 0, err
    lines = [line.split(" ", 2) for line in out.splitlines()]
    assert [int(seq) for seq, _, _ in lines] == [1, 2, 3, 4, 5]
    assert any(source == "live:A" for _, source, _ in lines), out


def _publish(ingest: str, count: int) -> int:
    import time

    deadline = time.monotonic() + 30
    while True:
        try:
            pub = Publisher(ingest, "orders", confirm=True, timeout=2.0)
            break
        except PublishError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with pub:
        time.sleep(1.0)  # the subscriber's PGM receiver joins the group
        for i in range(count):
            pub.publish("eu.fr", b"order %d" % i)
            pub.flush()
            time.sleep(0.2)
    return count
