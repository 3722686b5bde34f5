"""A replicated gateway group in a namespace lab: etcd on a host of its own, three nodes (a gateway and its
sidecar each, all multicasting on one group), a publisher host and a subscriber host. Functions run in lab hosts
are module-level (Lab.start pickles them)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from support.etcd import ETCD

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import DataLoss
from gateway.server.ha import group_key
from gateway.tools.deployment import wait_ping
from gateway.transport.etcd import Etcd
from netlab import Lab

STREAM = "ha"
LEADER_KEY = f"{group_key([STREAM])}/leader"
INGEST_PORT, REPLAY_PORT, MCAST_PORT = 5570, 5580, 5555
WAIT_S = 30.0


def zeps(lab: Lab, host: str, log: Path, *args: str) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 (the child keeps it)
    return lab.popen(host, [sys.executable, "-m", "gateway.cli", *args], stdout=out, stderr=out)


def start_etcd(lab: Lab, data_dir: Path) -> tuple[subprocess.Popen, str]:
    """One etcd member on host "etcd", bound to its lab address, with LAN-fast timers; (process, client URL)."""
    ip = lab.host("etcd").ip
    url, peer = f"http://{ip}:2379", f"http://{ip}:2380"
    argv = [ETCD, "--name", "lab", "--data-dir", str(data_dir / "etcd"), "--listen-client-urls", url,
            "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"lab={peer}", "--heartbeat-interval", "10", "--election-timeout", "100"]  # fmt: skip
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "etcd.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = lab.popen("etcd", argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    lab.run("etcd", wait_healthy, url, WAIT_S, timeout=WAIT_S + 5)
    return proc, url


def wait_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=0.5) as resp:
                if b'"true"' in resp.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"etcd at {url} not healthy within {timeout} s")


class Node:
    """`zeps gateway --etcd --node` multicasting on `channel` and `zeps replay` beside it, on one lab host."""

    def __init__(self, lab: Lab, root: Path, name: str, etcd: str, channel: str) -> None:
        self.lab, self.name, self.journal, self.log = lab, name, root / name, root / f"{name}.log"
        ip = lab.host(name).ip
        self.ingest, self.replay = f"tcp://{ip}:{INGEST_PORT}", f"tcp://{ip}:{REPLAY_PORT}"
        transport, where = channel.split("://")
        self.gateway_args = ["-v", "gateway", "--stream", STREAM, "--journal", str(self.journal), "--ingest",
                             self.ingest, "--multicast", f"{transport}://{ip};{where}", "--replay-endpoint",
                             self.replay, "--etcd", etcd, "--node", name, "--min-insync", "1",
                             "--heartbeat-ms", "50", "--linger-ms", "0"]  # fmt: skip
        self.replay_args = ["replay", "--journal", str(self.journal), "--bind", self.replay, "--tail-poll-ms", "1"]
        self.procs: list[subprocess.Popen] = []

    def start(self) -> Node:
        self.journal.mkdir(parents=True, exist_ok=True)
        self.procs = [zeps(self.lab, self.name, self.log, *args) for args in (self.gateway_args, self.replay_args)]
        return self

    def wait_ready(self) -> Node:
        for endpoint in (self.ingest, self.replay):
            self.lab.run(self.name, wait_ping, endpoint, WAIT_S, timeout=WAIT_S + 5)
        assert all(p.poll() is None for p in self.procs), self.log.read_text()
        return self

    def kill9(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.procs = []


def leader(etcd: str, timeout: float = 15.0) -> tuple[str, int]:
    """Inside a lab host: (the leader node's name, its epoch), once there is one."""
    client, deadline = Etcd(etcd), time.monotonic() + timeout
    while time.monotonic() < deadline:
        holder = client.holder(LEADER_KEY)
        if holder is not None:
            return json.loads(holder.value)["node"], holder.create_revision
        time.sleep(0.02)
    raise TimeoutError("no leader elected")


def publish(ingests: list[str], stop: Any, progress: Any, limit: int = 5_000) -> tuple[list[int], int]:
    """Publish "record-N" five at a time, each five confirmed (flush) before the next, until `stop` is set or
    `limit` records; (numbers confirmed, the last sequence confirmed). `progress` counts the confirmed."""
    confirmed: list[int] = []
    head = 0
    n = 0
    with Publisher(ingests, STREAM, confirm=True, linger_ms=1, timeout=WAIT_S) as pub:
        while not stop.is_set() and n < limit:
            step = list(range(n + 1, n + 6))
            for i in step:
                pub.publish("k", f"record-{i}".encode())
            last = pub.flush()
            assert last is not None
            head, n = last, step[-1]
            confirmed += step
            progress.value = len(confirmed)
            time.sleep(0.01)
    return confirmed, head


def subscribe(multicast: str, replays: list[str], ready: Any, until: Any) -> dict[str, Any]:
    """A Subscriber on the group and every sidecar, from the earliest record until the sequence put on `until`
    (or WAIT_S after it was started without one): what it delivered and when, losses, and its summary."""
    got: list[tuple[int, bytes]] = []
    arrived: list[float] = []  # time.monotonic() of each delivery (one clock for every namespace)
    losses: list[tuple[int, int]] = []
    target: int | None = None
    with Subscriber(STREAM, multicast=[multicast], replay=replays, start="earliest", progress_timeout=1.0) as sub:
        ready.put("up")
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline and (target is None or not got or got[-1][0] < target):
            if target is None and not until.empty():
                target = until.get()
                deadline = min(deadline, time.monotonic() + WAIT_S)
            try:
                rec = sub.next(timeout=0.2)
            except DataLoss as exc:
                losses.append((exc.lo, exc.hi))
                continue
            if rec is not None:
                got.append((rec.seq, bytes(rec.body)))
                arrived.append(time.monotonic())
        return {"records": got, "arrived": arrived, "losses": losses, "summary": sub.summary(), "target": target}
