"""The nemesis of `zeps bench chaos`: a seeded schedule of combined, overlapping faults and the code that
applies each one to a running replicated group (gateway.tools.hagroup) in a namespace lab.

Why a schedule apart from its execution: the seed alone must reproduce a failing run, so everything random
(which fault, which cut, how long, what overlaps it and when) is drawn up front by `schedule`, a pure function
of (seed, count); only which node is the leader at that moment is read from the running group. A step is one
fault, or two when the second starts `delay_s` into the first (an overlap): both count. A run may draw from a
subset of KINDS and without overlaps (`zeps bench chaos --kinds ... --no-overlap`, to repeat one scenario such
as issue #30's leader faults one at a time); the kinds and the overlap flag are then part of what reproduces it.

Faults (KINDS): kill -9 of the leader or a follower; SIGSTOP of the leader past its lease; the leader cut off
from everyone (each way of netlab.impair.cuts), from etcd only, from the clients only, or deaf one way (its
INPUT from the group's other hosts dropped: it still sends); the followers cut from each other; etcd killed
-9 or cut off; a partition during an election (the leader killed, the node most likely to succeed it cut off
while it campaigns); a follower killed again while it rejoins; a sidecar killed while its node catches up.
Every fault heals itself before `apply` returns.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.tools.hagroup import Node, leader, start_etcd, zeps
from netlab import Lab
from netlab.impair.cuts import KINDS as CUTS
from netlab.impair.cuts import cut
from netlab.impair.iptables import iptables

KINDS = ("kill-leader", "kill-follower", "pause-leader", "partition-leader", "leader-from-etcd",
         "clients-from-leader", "leader-deaf", "followers-apart", "kill-etcd", "partition-etcd",
         "partition-in-election", "kill-rejoining", "kill-sidecar-catchup")  # fmt: skip
ETCD_KINDS = frozenset({"kill-etcd", "partition-etcd"})
OVERLAP_P = 0.35  # the share of steps with a second fault starting inside the first
LEASE_S = 1.0  # the gateway's etcd lease (gateway.replication.elector.DEFAULT_TTL_S)


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, how it cuts (a netlab.impair.cuts kind, or "drop"/"reject" for rules between
    chosen hosts), how long it holds, and a random pick (0..1) for choices made among live nodes."""

    kind: str
    how: str
    hold_s: float
    pick: float

    def __str__(self) -> str:
        return f"{self.kind} ({self.how}, {self.hold_s:.1f} s)"


@dataclass(frozen=True)
class Step:
    """A fault, and maybe a second one starting `delay_s` into it."""

    first: Fault
    second: Fault | None = None
    delay_s: float = 0.0

    def faults(self) -> int:
        return 1 + (self.second is not None)


def schedule(seed: int, count: int, kinds: tuple[str, ...] = KINDS, overlap: bool = True) -> list[Step]:
    """Steps holding `count` faults in all, drawn from `kinds` (a subset of KINDS) with overlaps unless not
    `overlap`: the same (seed, count, kinds, overlap), the same schedule."""
    kinds = check_kinds(kinds)
    rng = random.Random(seed)
    steps: list[Step] = []
    left = count
    while left > 0:
        first = _fault(rng, rng.choice(kinds))
        # one etcd fault at a time; the second picks among kinds that do not fight over the same process
        seconds = [k for k in kinds if not (k in ETCD_KINDS and first.kind in ETCD_KINDS)]
        if overlap and seconds and left >= 2 and rng.random() < OVERLAP_P:
            steps.append(Step(first, _fault(rng, rng.choice(seconds)), round(rng.uniform(0.0, first.hold_s), 2)))
        else:
            steps.append(Step(first))
        left -= steps[-1].faults()
    return steps


def check_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """`kinds` as a tuple, each one of KINDS and at least one; else ValueError naming the bad ones and the choice."""
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        what = f"unknown fault kind(s) {', '.join(map(repr, bad))}" if bad else "no fault kind given"
        raise ValueError(f"{what}: choose one or more of {', '.join(KINDS)}")
    return kinds


def _fault(rng: random.Random, kind: str) -> Fault:
    if kind in ("partition-leader", "partition-etcd", "partition-in-election"):
        how = rng.choice(CUTS)
    elif kind in ("leader-from-etcd", "clients-from-leader", "leader-deaf", "followers-apart"):
        how = rng.choice(("drop", "reject"))
    else:
        how = "-"
    hold = rng.uniform(1.5, 3.0) if kind == "pause-leader" else rng.uniform(1.0, 3.0)
    return Fault(kind, how, round(hold, 2), round(rng.random(), 3))


@dataclass
class Group:
    """A running group the nemesis acts on: its lab, etcd, nodes, and the log of what it did (`marks`: when
    each fault started (time.monotonic()), the records the publisher had offered then, what it was, in which
    step)."""

    lab: Lab
    root: Path
    nodes: dict[str, Node]
    etcd_proc: Any  # subprocess.Popen of etcd
    etcd: str
    stream: str
    progress: Any  # MP.Value: records the publisher has had confirmed
    offered: Any  # MP.Value: records the publisher has handed over (numbered 1..offered)
    marks: list[tuple[float, int, str, int]] = field(default_factory=list)
    step: int = 0  # the step being applied (its marks carry it)
    restarts: list[str] = field(default_factory=list)  # exits the nemesis did not cause, found on the way
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _mark_lock: threading.Lock = field(default_factory=threading.Lock)

    def leader(self) -> str:
        return str(self.lab.run("etcd", leader, self.etcd, self.stream, timeout=60)[0])

    def follower(self, pick: float, besides: str | None = None) -> str:
        others = [n for n in self.nodes if n != (besides or self.leader())]
        return others[int(pick * len(others)) % len(others)]

    def mark(self, fault: Fault, what: str) -> None:
        """Note that `fault` starts now, doing `what` (marks read "KIND: WHAT at HH:MM:SS.mmm")."""
        with self._mark_lock:
            wall = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"  # to read the nodes' logs
            self.marks.append((time.monotonic(), self.offered.value, f"{fault.kind}: {what} at {wall}", self.step))

    def lock(self, name: str) -> threading.Lock:
        return self._locks.setdefault(name, threading.Lock())

    def restart(self, name: str, pause_s: float = 0.5) -> None:
        """kill -9 of node `name` (gateway and sidecar), `pause_s`, then both again."""
        node = self.nodes[name]
        with self.lock(name):
            node.kill9()
            time.sleep(pause_s)
            node.start()
        node.wait_ready()

    def restart_etcd(self, down_s: float) -> None:
        self.etcd_proc.kill()
        self.etcd_proc.wait(10)
        time.sleep(down_s)
        self.etcd_proc, _ = start_etcd(self.lab, self.root / "etcd")

    def ips(self, *hosts: str) -> list[str]:
        return [self.lab.host(h).ip for h in hosts]

    def exited(self) -> dict[str, list[int]]:
        """Processes of the group that exited on their own: {node: exit statuses}."""
        out = {}
        for name, node in self.nodes.items():
            with self.lock(name):
                codes = [p.returncode for p in node.procs if p.poll() is not None]
            if codes:
                out[name] = codes
        return out


@contextmanager
def drop_between(lab: Lab, host: str, peers: list[str], verdict: str, chains: tuple[str, ...]) -> Iterator[None]:
    """In `host`'s namespace, packets from (INPUT) and to (OUTPUT) the `peers` addresses dropped or rejected
    (`verdict` "drop" or "reject") for the block; the rules go again when it ends, however it ends."""
    netns = lab.host(host).netns
    rules = [[chain, "-s" if chain == "INPUT" else "-d", ip, "-j", verdict.upper()] for chain in chains for ip in peers]
    done: list[list[str]] = []
    try:
        for rule in rules:
            iptables(netns, "-I", *rule, table="filter")
            done.append(rule)
        yield
    finally:
        for rule in done:
            iptables(netns, "-D", *rule, table="filter")


BOTH = ("INPUT", "OUTPUT")


def apply(group: Group, step: Step) -> None:
    """Run `step` against the group: its first fault, and its second from `delay_s` on in a thread; returns
    when both have healed."""
    if step.second is None:
        _run(group, step.first)
        return
    errors: list[BaseException] = []

    def second() -> None:
        time.sleep(step.delay_s)
        try:
            _run(group, step.second)  # type: ignore[arg-type]
        except BaseException as exc:  # raised again in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=second, name="nemesis-overlap", daemon=True)
    thread.start()
    try:
        _run(group, step.first)
    finally:
        thread.join(120)
    if errors:
        raise errors[0]


def _run(group: Group, fault: Fault) -> None:
    _FAULTS[fault.kind](group, fault)


def _kill_leader(group: Group, fault: Fault) -> None:
    name = group.leader()
    group.mark(fault, f"kill -9 leader {name}")
    group.restart(name, fault.hold_s / 4)


def _kill_follower(group: Group, fault: Fault) -> None:
    name = group.follower(fault.pick)
    group.mark(fault, f"kill -9 follower {name}")
    group.restart(name, fault.hold_s / 4)


def _pause_leader(group: Group, fault: Fault) -> None:
    name = group.leader()
    group.mark(fault, f"SIGSTOP leader {name} {fault.hold_s} s")
    with group.lock(name):
        procs = list(group.nodes[name].procs)
        procs[0].send_signal(signal.SIGSTOP)
    try:
        time.sleep(max(fault.hold_s, 1.5 * LEASE_S))
    finally:
        procs[0].send_signal(signal.SIGCONT)  # a no-op on a process killed meanwhile (reaped: no such pid reuse)


def _partition_leader(group: Group, fault: Fault) -> None:
    name = group.leader()
    group.mark(fault, f"partition leader {name} from everyone ({fault.how}) {fault.hold_s} s")
    with cut(group.lab, name, fault.how):
        time.sleep(fault.hold_s)


def _leader_from_etcd(group: Group, fault: Fault) -> None:
    name = group.leader()
    group.mark(fault, f"cut leader {name} from etcd ({fault.how}) {fault.hold_s} s")
    with drop_between(group.lab, name, group.ips("etcd"), fault.how, BOTH):
        time.sleep(fault.hold_s)


def _clients_from_leader(group: Group, fault: Fault) -> None:
    name = group.leader()
    group.mark(fault, f"cut clients from leader {name} ({fault.how}) {fault.hold_s} s")
    with drop_between(group.lab, name, group.ips("pub", "sub"), fault.how, BOTH):
        time.sleep(fault.hold_s)


def _leader_deaf(group: Group, fault: Fault) -> None:
    """One-way: the leader hears nobody (its INPUT from every other host dropped) and still sends."""
    name = group.leader()
    group.mark(fault, f"leader {name} deaf one way ({fault.how}) {fault.hold_s} s")
    others = [h for h in ("etcd", "pub", "sub", *group.nodes) if h != name]
    with drop_between(group.lab, name, group.ips(*others), "drop", ("INPUT",)):
        time.sleep(fault.hold_s)


def _followers_apart(group: Group, fault: Fault) -> None:
    lead = group.leader()
    a, b = [n for n in group.nodes if n != lead][:2]
    group.mark(fault, f"followers {a} and {b} cut apart ({fault.how}) {fault.hold_s} s")
    with drop_between(group.lab, a, group.ips(b), fault.how, BOTH):
        time.sleep(fault.hold_s)


def _kill_etcd(group: Group, fault: Fault) -> None:
    group.mark(fault, f"kill -9 etcd, down {fault.hold_s / 2:.1f} s")
    group.restart_etcd(fault.hold_s / 2)


def _partition_etcd(group: Group, fault: Fault) -> None:
    group.mark(fault, f"partition etcd ({fault.how}) {fault.hold_s} s")
    with cut(group.lab, "etcd", fault.how):
        time.sleep(fault.hold_s)


def _partition_in_election(group: Group, fault: Fault) -> None:
    """The leader killed; 0.3 s later (inside its lease: the election has not ended) a follower cut off."""
    name = group.leader()
    victim = group.follower(fault.pick, besides=name)
    group.mark(fault, f"kill -9 leader {name}, partition {victim} ({fault.how}) in the election {fault.hold_s} s")
    node = group.nodes[name]
    with group.lock(name):
        node.kill9()
    try:
        time.sleep(0.3)
        with cut(group.lab, victim, fault.how):
            time.sleep(fault.hold_s)
    finally:
        with group.lock(name):
            node.start()  # a no-op if an overlapping fault restarted it meanwhile
    node.wait_ready()


def _hit_rejoining(group: Group, fault: Fault, what: str, down_s: float, hit: Callable[[Node], None]) -> None:
    """A follower killed -9, down for `down_s`, started, and `hit` while it rejoins (catching up on what it
    missed)."""
    name = group.follower(fault.pick)
    group.mark(fault, f"kill -9 follower {name}, {what}")
    node = group.nodes[name]
    with group.lock(name):
        node.kill9()
        time.sleep(down_s)
        node.start()
        hit(node)
    node.wait_ready()


def _kill_rejoining(group: Group, fault: Fault) -> None:
    def again(node: Node) -> None:
        time.sleep(fault.hold_s / 5)
        node.kill9()
        node.start()

    _hit_rejoining(group, fault, f"again {fault.hold_s / 5:.2f} s into its rejoin", 1.0, again)


def _kill_sidecar_catchup(group: Group, fault: Fault) -> None:
    def sidecar(node: Node) -> None:
        time.sleep(0.2)
        node.procs[1].kill()
        node.procs[1].wait(10)
        node.procs[1] = zeps(group.lab, node.name, node.log, *node.replay_args, env=node.env)

    _hit_rejoining(group, fault, "its sidecar again while it catches up", fault.hold_s / 2, sidecar)


_FAULTS: dict[str, Callable[[Group, Fault], None]] = {
    "kill-leader": _kill_leader,
    "kill-follower": _kill_follower,
    "pause-leader": _pause_leader,
    "partition-leader": _partition_leader,
    "leader-from-etcd": _leader_from_etcd,
    "clients-from-leader": _clients_from_leader,
    "leader-deaf": _leader_deaf,
    "followers-apart": _followers_apart,
    "kill-etcd": _kill_etcd,
    "partition-etcd": _partition_etcd,
    "partition-in-election": _partition_in_election,
    "kill-rejoining": _kill_rejoining,
    "kill-sidecar-catchup": _kill_sidecar_catchup,
}
