"""A replicated gateway group on a netlab Lab (docs/ha.md), for the failover benchmark and the lab tests.

etcd runs on a host of its own with LAN timers (heartbeat 10 ms, election 100 ms); each node is a lab host with
`zeps gateway --etcd --node` multicasting on the group's one channel and `zeps replay` beside it, started,
killed -9 (both) and restarted as a whole. `leader` finds the current leader in etcd. `publish_confirmed`,
`subscribe_all` and `outage` are the paced confirming publisher, the reconciling subscriber and the measure of
one failover that tests and `zeps bench failover` share. Functions run in lab hosts are module-level (Lab.start
pickles them by reference) and each is bounded by its own deadline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import CoordinatorError, DataLoss
from gateway.replication.group import group_key
from gateway.tools.deployment import wait_ping
from gateway.transport.etcd import Etcd
from netlab import HostProcess, Lab

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCD_HEARTBEAT_MS, ETCD_ELECTION_MS = 10, 100  # etcd's LAN timers: its own leader is never in question here
INGEST_PORT, REPLAY_PORT, MCAST_PORT = 5570, 5580, 5555
WAIT_S = 30.0
# What every node runs with unless told otherwise: a batch is confirmed once one follower journaled it.
NODE_OPTIONS = ("--min-insync", "1", "--heartbeat-ms", "50", "--linger-ms", "0")


def zeps(lab: Lab, host: str, log: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m gateway.cli ARGS` on `host` (in `env`, default this process's), its output appended to `log`."""
    out = open(log, "ab")  # noqa: SIM115 (the child keeps it)
    return lab.popen(host, [sys.executable, "-m", "gateway.cli", *args], stdout=out, stderr=out, env=env)


def start_etcd(lab: Lab, data_dir: Path, host: str = "etcd") -> tuple[subprocess.Popen, str]:
    """One etcd member on `host`, bound to its lab address, with LAN-fast timers; (process, client URL)."""
    ip = lab.host(host).ip
    url, peer = f"http://{ip}:2379", f"http://{ip}:2380"
    argv = [ETCD, "--name", "lab", "--data-dir", str(data_dir / "etcd"), "--listen-client-urls", url,
            "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"lab={peer}", "--heartbeat-interval", str(ETCD_HEARTBEAT_MS),
            "--election-timeout", str(ETCD_ELECTION_MS)]  # fmt: skip
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "etcd.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = lab.popen(host, argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        lab.run(host, wait_healthy, url, WAIT_S, timeout=WAIT_S + 5)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, url


def wait_healthy(url: str, timeout: float) -> None:
    """Inside a lab host: until etcd at `url` says it is healthy."""
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
    """`zeps gateway --etcd --node` of `stream` multicasting on `channel` ("udp://GROUP:PORT", the node's own
    address is put in) and `zeps replay` beside it (with `replay_options`), on lab host `name`; output to
    ROOT/NAME.log."""

    def __init__(
        self,
        lab: Lab,
        root: Path,
        name: str,
        etcd: str,
        channel: str,
        *,
        stream: str,
        options: Sequence[str] = NODE_OPTIONS,
        replay_options: Sequence[str] = (),
        verbose: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.lab, self.name, self.journal, self.log = lab, name, root / name, root / f"{name}.log"
        ip = lab.host(name).ip
        self.ingest, self.replay = f"tcp://{ip}:{INGEST_PORT}", f"tcp://{ip}:{REPLAY_PORT}"
        transport, where = channel.split("://")
        self.gateway_args = [*(["-v"] if verbose else []), "gateway", "--stream", stream, "--journal",
                             str(self.journal), "--ingest", self.ingest, "--multicast", f"{transport}://{ip};{where}",
                             "--replay-endpoint", self.replay, "--etcd", etcd, "--node", name, *options]  # fmt: skip
        self.replay_args = ["replay", "--journal", str(self.journal), "--bind", self.replay, "--tail-poll-ms", "1",
                            *replay_options]  # fmt: skip
        self.env = env  # the processes' environment (a netlab.WallClock's, say); None: this process's
        self.procs: list[subprocess.Popen] = []

    def start(self) -> Node:
        """Start the gateway and the sidecar; a no-op while they run (started, not killed since): a second gateway
        would find the journal's writer lock held and exit. One that exited on its own stays exited, for the
        checks that look for such processes."""
        if self.procs:
            return self
        self.journal.mkdir(parents=True, exist_ok=True)
        self.procs = [zeps(self.lab, self.name, self.log, *args, env=self.env)
                      for args in (self.gateway_args, self.replay_args)]  # fmt: skip
        return self

    def wait_ready(self) -> Node:
        for endpoint in (self.ingest, self.replay):
            self.lab.run(self.name, wait_ping, endpoint, WAIT_S, timeout=WAIT_S + 5)
        roles = dict(zip(("gateway", "sidecar"), self.procs, strict=False))
        if exited := [f"{role} (exit code {p.returncode})" for role, p in roles.items() if p.poll() is not None]:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-5:])
            raise RuntimeError(f"node {self.name}: {', '.join(exited)} exited while starting; see {self.log}:\n{tail}")
        return self

    @property
    def gateway_pid(self) -> int:
        return self.procs[0].pid

    def kill9(self) -> None:
        """SIGKILL the gateway and the sidecar (those still running) and reap both."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.procs = []


def leader(etcd: str, stream: str, timeout: float = 15.0) -> tuple[str, int]:
    """Inside a lab host: (the leader node's name, its epoch) of the group of `stream`, once there is one (and
    etcd answers)."""
    client, deadline, key = Etcd(etcd), time.monotonic() + timeout, f"{group_key([stream])}/leader"
    while time.monotonic() < deadline:
        try:
            holder = client.holder(key)
        except CoordinatorError:  # etcd down or cut off for a while (a fault): ask again until the deadline
            holder = None
        if holder is not None:
            return json.loads(holder.value)["node"], holder.create_revision
        time.sleep(0.02)
    raise TimeoutError("no leader elected")


def publish_confirmed(
    ingests: list[str], stream: str, stop: Any, progress: Any, limit: int = 5_000
) -> tuple[list[int], int]:
    """Publish "record-N" five at a time, each five confirmed (flush) before the next, 10 ms apart, until `stop`
    is set or `limit` records; (numbers confirmed, the last sequence confirmed). `progress` counts the confirmed."""
    confirmed: list[int] = []
    head = n = 0
    with Publisher(ingests, stream, confirm=True, linger_ms=1, timeout=WAIT_S) as pub:
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


def wait_confirmed(progress: Any, beyond: int, timeout: float = WAIT_S, publisher: HostProcess | None = None) -> None:
    """Until publish_confirmed has had more than `beyond` records confirmed (TimeoutError after `timeout`). With
    `publisher` (the process publishing), one that ended raises what ended it at once: a Publisher that failed
    (a PublishError) must not pass for a group that stopped confirming."""
    deadline = time.monotonic() + timeout
    while progress.value <= beyond:
        if publisher is not None and not publisher.is_alive():
            publisher.result(0)  # re-raises the publisher's exception
            raise RuntimeError(f"the publisher ended at {progress.value} confirmed, waiting for more than {beyond}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no record confirmed past {beyond} within {timeout} s")
        time.sleep(0.01)


def subscribe_all(
    multicast: str, replays: list[str], stream: str, ready: Any, until: Any, deadline_s: float = 120.0
) -> dict[str, Any]:
    """A Subscriber on the group and every sidecar, from the earliest record until the sequence put on `until`
    (or WAIT_S after it was started without one): what it delivered and when, losses, and its summary."""
    got: list[tuple[int, bytes]] = []
    arrived: list[float] = []  # time.monotonic() of each delivery (one clock for every namespace)
    losses: list[tuple[int, int]] = []
    target: int | None = None
    with Subscriber(stream, multicast=[multicast], replay=replays, start="earliest", progress_timeout=1.0) as sub:
        ready.put("up")
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and (target is None or not got or got[-1][0] < target):
            target, deadline = take_target(until, target, deadline, WAIT_S)
            try:
                rec = sub.next(timeout=0.2)
            except DataLoss as exc:
                losses.append((exc.lo, exc.hi))
                continue
            if rec is not None:
                got.append((rec.seq, bytes(rec.body)))
                arrived.append(time.monotonic())
        return {"records": got, "arrived": arrived, "losses": losses, "summary": sub.summary(), "target": target}


def take_target(until: Any, target: int | None, deadline: float, grace_s: float) -> tuple[int | None, float]:
    """A subscriber's last sequence to read, once it was put on `until`, and its deadline, then at most
    `grace_s` away: (target, deadline), unchanged while nothing was put."""
    if target is None and not until.empty():
        return until.get(), min(deadline, time.monotonic() + grace_s)
    return target, deadline


def journal_records(root: Path, stream: str) -> list[tuple[int, str, bytes]]:
    """Every record of `stream` in the journal under `root`: (sequence, key, body), in order."""
    from gateway.journal import JournalReader

    with JournalReader(root, stream).cursor(1) as cursor:
        out: list[tuple[int, str, bytes]] = []
        while (batch := cursor.next_batch()) is not None:
            out.extend((r.seq, r.key, r.body) for r in batch.records())
        return out


def number(body: bytes) -> int:
    """N of a "record-N" body."""
    return int(body.removeprefix(b"record-"))


def outage(got: dict[str, Any], killed: float, confirmed_before: int) -> float:
    """From a kill to the subscriber's first delivery of a record published after it: one past the five the
    publisher had in flight (those the old leader may have confirmed and multicast). inf if none came."""
    deliveries = zip(got["records"], got["arrived"], strict=True)
    after = (t for (_, body), t in deliveries if number(body) > confirmed_before + 5)
    return next(after, float("inf")) - killed


def exactly_once_problems(got: dict[str, Any], confirmed: list[int], head: int) -> list[str]:
    """What is wrong with a subscriber's stream (subscribe_all) for a publisher's (publish_confirmed): losses,
    a gap or reordering of sequences 1..head, a record twice or out of publishing order, a confirmed record
    missing. Empty when it was every record once, in order."""
    problems = []
    records = got["records"]
    if got["losses"]:
        problems.append(f"losses reported: {got['losses'][:5]}")
    if [seq for seq, _ in records] != list(range(1, head + 1)):
        problems.append(f"not sequences 1..{head} in order (target {got['target']}, got {len(records)})")
    numbers = [number(body) for _, body in records]
    if len(set(numbers)) != len(numbers):
        problems.append("a record delivered twice")
    if numbers != sorted(numbers):
        problems.append("records out of publishing order")
    missing = set(confirmed) - set(numbers)
    if missing:
        problems.append(f"{len(missing)} confirmed records never delivered: {sorted(missing)[:10]}")
    return problems
