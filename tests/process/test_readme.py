"""README.md's TCP quick start runs as written, against a gateway and a replay sidecar on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.readme import quick_start_snippets
from support.servers import STREAM, GatewayProcess, start_sidecar


def test_tcp_quick_start_publishes_and_reads_back(tmp_path: Path) -> None:
    tcp = quick_start_snippets()[0]
    assert "127.0.0.1:5570" in tcp and "127.0.0.1:5571" in tcp and f'"{STREAM}"' in tcp
    root = tmp_path / "journal"
    gw = GatewayProcess(root, streams=(STREAM,))
    try:
        with start_sidecar(root) as side:
            code = tcp.replace("tcp://127.0.0.1:5570", gw.ingest).replace("tcp://127.0.0.1:5571", side.endpoint)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        gw.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "journaled up to sequence 3",
        "1 eu.fr b'order 0'",
        "2 eu.fr b'order 1'",
        "3 eu.fr b'order 2'",
    ]
