"""Fan-in (docs/mirroring.md): two sites' streams mirrored into one aggregator gateway, all real processes on
loopback, with the directory in a real etcd.

What is proved: the aggregator serves both streams (one `zeps mirror` per stream, live while the sources
publish); a subscriber of each at the aggregator's sidecar gets 1..N exactly once; each aggregator journal
equals its source's (the `zeps ha check` comparison); `zeps streams` lists, for each stream, the source site's
gateway as the primary and the aggregator as a mirror of that site's sidecar, and after `zeps mirror promote`
the aggregator as promoted, still naming that sidecar after the aggregator restarts (its promotion mark keeps it),
and the aggregator's other stream, with no mirror running, still as a mirror of its source (its `mirror-source`
mark keeps it).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.etcd import EtcdProcess
from support.servers import GatewayProcess, Side, side

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.journal import JournalReader
from gateway.journal.crosscheck import check_group

pytestmark = pytest.mark.timeout(180)

STREAMS = ("s1", "s2")
WAIT_S = 60.0


def zeps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=30)


def publish(ingest: str, stream: str, first: int, n: int) -> None:
    with Publisher(ingest, stream, confirm=True, timeout=20) as pub:
        for i in range(first, first + n):
            pub.publish(f"k{i % 3}", f"{stream} {i}".encode())
        assert pub.flush() == first + n - 1


def wait_head(root: Path, stream: str, head: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while JournalReader(root, stream).last_seq < head:
        assert time.monotonic() < deadline, f"{stream}: the aggregator holds {JournalReader(root, stream).last_seq}"
        time.sleep(0.05)


def listing(etcd: EtcdProcess, want: dict[str, list[str]]) -> dict[str, dict]:
    """`zeps streams --etcd --json` once every stream's copies are `want` (one holder each) and every mirror names
    its source (lease-bound entries take a moment)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        done = zeps("streams", "--etcd", etcd.url, "--json", "--wait", "0.5")
        rows = {row["stream"]: row for row in map(json.loads, done.stdout.splitlines())}
        copies = {name: sorted(h["copy"] for h in row["holders"]) for name, row in rows.items() if name in want}
        mirrors = [h for name in want for h in rows.get(name, {}).get("holders", []) if h["copy"] == "mirror"]
        sourced = all(h["source"] for h in mirrors)
        if copies == want and sourced:  # a mirror's source is known once its first session asked (MIRROR)
            return rows
        assert time.monotonic() < deadline, (want, done.stdout, done.stderr)
        time.sleep(0.2)


def test_two_sites_fan_in_to_one_aggregator_listed_by_the_directory(etcd: EtcdProcess, tmp_path: Path) -> None:
    roots = {name: tmp_path / name for name in ("a", "c", "agg")}
    for root in roots.values():
        root.mkdir()
    a = GatewayProcess(roots["a"], "--etcd", etcd.url, streams=("s1",))
    c = GatewayProcess(roots["c"], "--etcd", etcd.url, streams=("s2",))
    mirrors = ("--mirror", "s1", "--mirror", "s2")
    agg = GatewayProcess(roots["agg"], "--etcd", etcd.url, *mirrors, streams=STREAMS)
    procs: list[subprocess.Popen] = []
    try:
        with side(roots["a"]) as a_side, side(roots["c"]) as c_side, side(roots["agg"]) as agg_side:
            sources: dict[str, tuple[GatewayProcess, Side]] = {"s1": (a, a_side), "s2": (c, c_side)}
            for stream, (gw, _) in sources.items():
                publish(gw.ingest, stream, 1, 1000)  # history to catch up with
            for stream, (_, sc) in sources.items():
                log = open(tmp_path / f"mirror-{stream}.log", "ab")  # noqa: SIM115 - written until it ends
                argv = [sys.executable, "-m", "gateway.cli", "mirror", "-v", "--source", sc.endpoint,
                        "--to", agg.ingest, "--stream", stream, "--timeout", "3s"]  # fmt: skip
                procs.append(subprocess.Popen(argv, stderr=log))
            for first in range(1001, 3001, 500):  # the live tails, both at once
                for stream, (gw, _) in sources.items():
                    publish(gw.ingest, stream, first, 500)
            for stream in STREAMS:
                wait_head(roots["agg"], stream, 3000)
                got = []
                with Subscriber(stream, replay=agg_side.endpoint, start="earliest") as sub:
                    while len(got) < 3000 and (rec := sub.next(timeout=10.0)) is not None:
                        got.append((rec.seq, bytes(rec.body)))
                assert got == [(i, f"{stream} {i}".encode()) for i in range(1, 3001)]

            rows = listing(etcd, {"s1": ["mirror", "primary"], "s2": ["mirror", "primary"]})
            for stream, (gw, sc) in sources.items():
                holders = {h["copy"]: h for h in rows[stream]["holders"]}
                assert holders["mirror"]["source"] == sc.endpoint and holders["primary"]["source"] == ""
                assert rows[stream]["source"] == [sc.endpoint]
                assert rows[stream]["ingest"] == gw.ingest, "publishers resolve to the primary, not the mirror"
            table = zeps("streams", "--etcd", etcd.url, "--wait", "0.5")
            assert table.stdout.splitlines()[0].split()[:3] == ["STREAM", "COPY", "SOURCE"], table.stdout
            assert "mirror@" in table.stdout and a_side.endpoint in table.stdout, table.stdout

            for proc in procs:  # the source site is gone: the aggregator takes over s1
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(15) == 0, (tmp_path / "mirror-s1.log").read_text()
            a.stop()
            promoted = zeps("mirror", "promote", "--stream", "s1", "--gateway", agg.ingest, "--force")
            assert promoted.returncode == 0, promoted.stderr
            rows = listing(etcd, {"s1": ["promoted"], "s2": ["mirror", "primary"]})
            node = rows["s1"]["holders"][0]["node"]
            assert rows["s1"]["holders"] == [{"node": node, "copy": "promoted", "source": a_side.endpoint}]
            assert rows["s1"]["ingest"] == agg.ingest
            agg.stop()  # its etcd entries go with it (the lease revoked)
            agg.restart()  # no mirror runs: s2's source comes from its `mirror-source` mark, s1's from its promotion
            rows = listing(etcd, {"s1": ["promoted"], "s2": ["mirror", "primary"]})
            assert rows["s1"]["holders"] == [{"node": node, "copy": "promoted", "source": a_side.endpoint}]
            assert {"node": node, "copy": "mirror", "source": c_side.endpoint} in rows["s2"]["holders"], rows["s2"]
        for stream, source in (("s1", roots["a"]), ("s2", roots["c"])):
            result = check_group([source, roots["agg"]], stream)
            assert result.violation is None, result.plain()
            assert {r.head for r in result.nodes.values()} == {3000}, result.plain()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        for gw in (a, c, agg):
            gw.stop()
