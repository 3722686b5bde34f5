"""Where a stream's authoritative copy lives, as each LAN's announcements say it (docs/mirroring.md, Fan-in):
netlab's two sites (a perfect WAN), the stream's primary at site A, a mirror of it at site B fed by `zeps mirror`
across the router. Real processes and real multicast announcements on each LAN (TTL 1: each LAN hears its own).

What is proved: `zeps streams --interface` on site B lists B's gateway as a mirror of A's sidecar (announcement
version 2 on the wire), on site A as the primary (version 1); after `zeps mirror promote --force` at B, site
B lists it as promoted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.feedlab import STREAM, publish
from support.sitelab import deployed, two_sites

from gateway.journal import JournalReader
from netlab import Sites

pytestmark = pytest.mark.lab

WAIT_S = 60.0
IF = "lab0"  # every site host's interface


def holders(sites: Sites, host: str, want: list[str]) -> list[dict]:
    """The holders of the stream `zeps streams` on `host` lists, once their copies are `want`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        argv = [sys.executable, "-m", "gateway.cli", "streams", "--interface", IF, "--json", "--wait", "1.5"]
        proc = sites.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=30)
        rows = [row for row in map(json.loads, out.splitlines()) if row["stream"] == STREAM]
        found = rows[0]["holders"] if rows else []
        if [h["copy"] for h in found] == want:
            return found
        assert time.monotonic() < deadline, (host, want, out, err)


def test_each_lan_lists_where_the_streams_authoritative_copy_lives(tmp_path: Path) -> None:
    with (
        two_sites(None) as sites,
        deployed(sites, "a", tmp_path / "a") as a,
        deployed(sites, "b", tmp_path / "b", gateway_args=["--mirror", STREAM]) as b,
    ):
        argv = [sys.executable, "-m", "gateway.cli", "mirror", "-q", "--source", a.replay, "--to", b.ingest,
                "--stream", STREAM, "--timeout", "3s"]  # fmt: skip
        mirror = sites.popen("b-spare", argv, stderr=subprocess.PIPE, text=True)
        try:
            assert sites.run("a-spare", publish, a.ingest, 0, 500, 0.0, timeout=WAIT_S) == 500
            deadline = time.monotonic() + WAIT_S
            while JournalReader(b.journal, STREAM).last_seq < 500:
                assert time.monotonic() < deadline and mirror.poll() is None
                time.sleep(0.05)
            assert holders(sites, "b-sub", ["mirror"])[0]["source"] == a.replay
            assert holders(sites, "a-sub", ["primary"])[0]["source"] == ""
        finally:
            mirror.send_signal(signal.SIGTERM)
            _, err = mirror.communicate(timeout=15)
        assert mirror.returncode == 0, err
        promote = sites.popen("b-spare", [sys.executable, "-m", "gateway.cli", "mirror", "promote", "--stream",
                                          STREAM, "--gateway", b.ingest, "--force"], stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
        _, err = promote.communicate(timeout=WAIT_S)
        assert promote.returncode == 0, err
        assert holders(sites, "b-sub", ["promoted"])[0]["source"] == a.replay
