"""Failover: a replicated group's leader killed -9 under a publisher, and what replication costs when nothing fails.

Failover: a namespace lab with etcd on a host of its own (heartbeat 10 ms, election 100 ms; lease TTL 1 s),
three nodes (a gateway and its sidecar each, `--min-insync 1`) multicasting on one udp:// group, a paced
confirming `Publisher` given the three ingests (five records confirmed at a time, 10 ms apart: ~400 records/s)
and a reconciling `Subscriber` given the group and the three sidecars, each on a host of its own. The leader's
gateway and sidecar are killed -9, the victim restarted as a follower, 20 times per run; a failover is the time
from the kill to the subscriber's first delivery of a record published after it (one past the five the
publisher had in flight). The subscriber must get every sequence once, in order, and every confirmed record,
or the run fails. It runs with the followers' suspicion timeout (`zeps gateway --suspect-ms`) at three
settings: a follower deposes a leader whose peer link answered nothing that long.

Cost of replication: a group of one (`--min-insync 0`) against a pair (`--min-insync 1`, the follower in sync
before anything is published), the same processes and options otherwise (udp://, the publisher given the
leader's ingest first, the subscriber the group and the leader's sidecar first). Throughput: a batching
publisher, unpaced and confirming (a leader below --min-insync refuses what it cannot hold, and only a
confirming publisher re-sends it), records/s from the first publish to the last confirmation (the target's
figure) and from the subscriber's first delivery to its last, zero missing. Latency: the latency scenario's
publish -> delivery at 10,000 records/s (publisher defaults: smart batching), every record delivered. A leader change
during these runs (no node is killed) is counted: a spurious failover. Every sidecar runs with
--no-snapshots (SIDECAR_OPTIONS), so both groups' sidecars do the same work. The pair runs a second time with
its peer link over TLS (--peer-tls-*, certificates of one CA made for the run): what encrypting it costs.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import statistics
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.bench import BenchError, latency, pipeline
from gateway.bench.runner import BODY, KEYS, STREAM, Progress, Result, Settings, Stat, Table, Target, repeat, stop
from gateway.tools import hagroup
from gateway.tools.hagroup import MCAST_PORT, NODE_OPTIONS, WAIT_S, Node
from netlab import MP, Lab

TITLE = "Failover: leader kill -9 -> subscribers receive again; the cost of replication"
SUSPECT_MS = (150, 300, 600)  # the default, 300, in the middle
NODES = ("n1", "n2", "n3")
TARGET_P99_S = 1.0
TARGET_RATIO = 0.8
TARGET_EXTRA_MS = 1.0
# No snapshot index in the sidecars: nothing here asks for snapshots, and a sidecar indexes a stream at start
# only if its gateway created the stream first (a race), which made one group's sidecars spend a third of a
# core on per-record indexing and the other's none.
SIDECAR_OPTIONS = ("--no-snapshots",)


def estimate(settings: Settings) -> float:
    kills, settings_n = _kills(settings), len(_suspects(settings))
    return 30 + settings.runs * (settings_n * (20 + kills * 5) + (45 if settings.quick else 90))


def _kills(settings: Settings) -> int:
    return settings.size(20, 3)


def _suspects(settings: Settings) -> tuple[int, ...]:
    return (300,) if settings.quick else SUSPECT_MS


def run(settings: Settings) -> Result:
    progress = Progress("failover")
    kills, failures = _kills(settings), list[str]()
    failover: dict[int, dict[str, list[float]]] = {}
    pooled: dict[int, list[float]] = {}
    for ms in _suspects(settings):
        pooled[ms] = []
        once = functools.partial(_failovers, settings, ms, kills, pooled[ms])
        failover[ms] = repeat(settings.runs, progress, f"{kills} leader kills, suspicion {ms} ms", once, failures)
    count, lat_count = settings.size(300_000, 10_000), settings.size(50_000, 2_000)
    cost = {insync: _cost(settings, insync, count, lat_count, progress, failures) for insync in (0, 1)}
    single, pair = cost[0], cost[1]
    pair_tls = _cost(settings, 1, count, lat_count, progress, failures, tls=True)
    rows = []
    for ms in _suspects(settings):
        got, pool = failover[ms], sorted(pooled[ms])
        pooled_text = f"{len(pool)}: p50 {_pct(pool, 50):.3f} s, p99 {_pct(pool, 99):.3f} s" if pool else "none"
        rows.append((f"{ms} ms" + (" (default)" if ms == 300 else ""), *(_stat(got, k, "s", 3) for k in
                     ("median", "p99", "max")), pooled_text, _stat(got, "records")))  # fmt: skip
    default = _stat(failover.get(300, {}), "p99", "s", 3)
    rate1, rate2 = _stat(single, "rate", "records/s"), _stat(pair, "rate", "records/s")
    p99_1, p99_2 = _stat(single, "p99", "ms", 2), _stat(pair, "p99", "ms", 2)
    targets = [
        _target(f"leader kill -9 -> receiving again, p99 <= {TARGET_P99_S:g} s (suspicion 300 ms)",
                default, lambda a: (str(a), a.median <= TARGET_P99_S)),
        _target(f"throughput with one in-sync follower >= {TARGET_RATIO:g}x one node", (rate2, rate1),
                lambda a, b: (f"{a.median / b.median:.2f}x", a.median / b.median >= TARGET_RATIO)),
        _target(f"p99 at 10,000 records/s with one in-sync follower <= one node's + {TARGET_EXTRA_MS:g} ms",
                (p99_2, p99_1), lambda a, b: (f"{a.median - b.median:+.2f} ms ({a} vs {b})",
                                              a.median - b.median <= TARGET_EXTRA_MS)),
    ]  # fmt: skip
    return Result(
        "failover",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"leader kill -9 -> subscriber receives a record published after it; {kills} failovers per run, "
                "group of 3 on udp://",
                ("suspicion timeout", "median", "p99", "max", "failovers pooled over runs", "records, once in order"),
                rows,
            ),
            Table(
                f"what replication costs: throughput ({count:,} records, unpaced) and publish -> delivery at "
                f"{latency.RATE:,.0f} records/s ({lat_count:,} records)",
                (
                    "group",
                    "confirmed (publisher)",
                    "delivered (subscriber)",
                    "p50",
                    "p99",
                    "p99.9",
                    "max",
                    "leader changes (no kill)",
                ),
                [
                    (
                        label,
                        _stat(m, "rate", "records/s"),
                        _stat(m, "delivered", "records/s"),
                        *(_stat(m, k, "ms", 2) for k in ("p50", "p99", "p99.9")),
                        _stat(m, "max", "ms", 1),
                        int(sum(m.get("leader_changes", [])) + sum(m.get("leader_changes_lat", []))),
                    )
                    for label, m in (
                        ("one node (--min-insync 0)", single),
                        ("a pair (--min-insync 1)", pair),
                        ("the pair, peer link over TLS", pair_tls),
                    )
                ],
            ),
        ],
        targets=targets,
        notes=failures,
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
        issue=18,
    )


FAILED = "every run failed"


def _stat(got: dict[str, list[float]], key: str, unit: str = "", digits: int = 0) -> Stat | str:
    """A metric over runs, or FAILED when no run measured it (the rest of the report still stands)."""
    return Stat.of(got[key], unit, digits) if got.get(key) else FAILED


def _target(goal: str, measured: Stat | str | tuple[Stat | str, ...], judge: Callable[..., tuple[str, bool]]) -> Target:
    """Target(goal, *judge(stats)), or not met when a metric it needs was not measured."""
    stats = measured if isinstance(measured, tuple) else (measured,)
    if any(isinstance(s, str) for s in stats):
        return Target(goal, FAILED, False)
    return Target(goal, *judge(*stats))


def _pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(len(values) * p / 100))]


# --- failover ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _group(settings: Settings, hosts: list[str], nodes: tuple[str, ...], options: tuple[str, ...]) -> Iterator[
    tuple[Lab, dict[str, Node], str]
]:  # fmt: skip
    """A lab of `hosts` with etcd on host "etcd" and `nodes` started (not yet waited for), all removed on exit.
    A run that fails keeps its nodes' and etcd's logs under `settings.tmp`, named in the error."""
    with Lab(hosts) as lab, tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=settings.tmp) as tmp:
        root = Path(tmp)
        etcd_proc, etcd = hagroup.start_etcd(lab, root / "etcd")
        channel = f"udp://{lab.group(1)}:{MCAST_PORT}"
        group = {n: Node(lab, root, n, etcd, channel, stream=STREAM, options=options, replay_options=SIDECAR_OPTIONS,
                         verbose=False) for n in nodes}  # fmt: skip
        try:
            yield lab, group, etcd
        except Exception as exc:
            kept = keep_logs(root, settings.tmp)
            raise BenchError(f"{type(exc).__name__}: {exc} (the nodes' logs are kept in {kept})") from exc
        finally:
            for node in group.values():
                node.kill9()
            etcd_proc.kill()
            etcd_proc.wait(10)


def keep_logs(root: Path, under: Path) -> Path:
    """Copy a failed run's logs (each node's, etcd's) out of its lab directory, which is about to go."""
    kept = Path(tempfile.mkdtemp(prefix="zeps-bench-failed-", dir=under))
    for log in (*root.glob("*.log"), *root.glob("etcd/*.log")):
        shutil.copy2(log, kept / log.name)
    return kept


def _failovers(settings: Settings, suspect_ms: int, kills: int, pool: list[float], _run: int) -> dict[str, float]:
    """Run `_run`: `kills` leader kills under the confirming publisher; the failover times' median, p99, max."""
    options = (*NODE_OPTIONS, "--suspect-ms", str(suspect_ms))
    with _group(settings, ["etcd", *NODES, "pub", "sub"], NODES, options) as (lab, nodes, etcd):
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            node.wait_ready()
        ready, until, stopping, confirmed_n = MP.Queue(), MP.Queue(), MP.Event(), MP.Value("i", 0)
        multicast = f"udp://{lab.host('sub').ip};{lab.group(1)}:{MCAST_PORT}"
        replays, ingests = [n.replay for n in nodes.values()], [n.ingest for n in nodes.values()]
        deadline = 60.0 + kills * 15.0
        sub = lab.start("sub", hagroup.subscribe_all, multicast, replays, STREAM, ready, until, deadline)
        pub = None
        try:
            ready.get(timeout=WAIT_S)
            pub = lab.start("pub", hagroup.publish_confirmed, ingests, STREAM, stopping, confirmed_n, 1_000_000)
            killed_at: list[tuple[float, int]] = []
            for _ in range(kills):
                hagroup.wait_confirmed(confirmed_n, confirmed_n.value + 100)
                name, _ = lab.run("etcd", hagroup.leader, etcd, STREAM)
                before = confirmed_n.value
                nodes[name].kill9()
                killed_at.append((time.monotonic(), before))
                hagroup.wait_confirmed(confirmed_n, before + 5)  # a successor leads
                nodes[name].start().wait_ready()  # the victim rejoins as a follower
            hagroup.wait_confirmed(confirmed_n, confirmed_n.value + 100)
            stopping.set()
            confirmed, head = pub.result(WAIT_S)
            until.put(head)
            got = sub.result(WAIT_S + 10)
        finally:
            stop(sub, *([pub] if pub is not None else []))
    problems = hagroup.exactly_once_problems(got, confirmed, head)
    if problems:
        raise BenchError(f"the subscriber's stream is wrong: {'; '.join(problems)}")
    times = sorted(hagroup.outage(got, *kill) for kill in killed_at)
    if times[-1] == float("inf"):
        raise BenchError("after a kill, no record published after it reached the subscriber")
    pool.extend(times)
    return {"median": statistics.median(times), "p99": _pct(times, 99), "max": times[-1], "records": len(confirmed)}


# --- the cost of replication ------------------------------------------------------------------------------


def _cost(
    settings: Settings,
    insync: int,
    count: int,
    lat_count: int,
    progress: Progress,
    failures: list[str],
    *,
    tls: bool = False,
) -> dict[str, list[float]]:
    """A group of 1 + `insync` nodes: throughput and latency runs, each metric a list over runs; `tls`: its peer
    link over TLS."""
    names = NODES[: 1 + insync]
    options = ("--min-insync", str(insync), "--heartbeat-ms", "50", *pipeline.gateway_options())
    what = ("one node" if insync == 0 else "a pair") + (", TLS" if tls else "")
    with contextlib.ExitStack() as stack:
        lab, nodes, etcd = stack.enter_context(_group(settings, ["etcd", *names, "pub", "sub"], names, options))
        if tls:
            certs = _peer_tls(Path(stack.enter_context(tempfile.TemporaryDirectory(dir=settings.tmp))), names)
            for name, node in nodes.items():
                node.gateway_args += certs[name]
        for node in nodes.values():
            node.start().wait_ready()
        # One record confirmed: with --min-insync 1, once the follower is in sync.
        lab.run("pub", _confirm_one, [n.ingest for n in nodes.values()], timeout=WAIT_S + 5)
        steady = _Steady(lab, nodes, etcd, [f"udp://{lab.host('sub').ip};{lab.group(1)}:{MCAST_PORT}"])
        out = repeat(settings.runs, progress, f"{what}: throughput, {count:,} records",
                     lambda _: _throughput(steady, count), failures)  # fmt: skip
        out |= repeat(settings.runs, progress, f"{what}: latency at 10,000 records/s, {lat_count:,} records",
                      lambda _: _latency(steady, lat_count), failures)  # fmt: skip
        return out


def _peer_tls(tmp: Path, names: tuple[str, ...]) -> dict[str, list[str]]:
    """Per node of `names`, the options of its peer link over TLS: a CA made in `tmp`, and a certificate of it
    named for the node (the peer link checks that a node's certificate carries its --node name)."""
    from gateway.transport.tls import make_ca, make_node

    ca, _ = ca_files = make_ca(tmp / "ca")
    out = {}
    for name in names:
        crt, key = make_node(tmp / name, ca_files, [])
        out[name] = ["--peer-tls-cert", str(crt), "--peer-tls-key", str(key), "--peer-tls-ca", str(ca)]
    return out


def _confirm_one(ingests: list[str]) -> None:
    """In host pub: one record published and confirmed (with --min-insync 1: once a follower is in sync)."""
    from gateway.client.publisher import Publisher

    with Publisher(ingests, STREAM, confirm=True, timeout=WAIT_S) as pub:
        pub.publish("warm-up", b"x")
        pub.flush()


def _publish_confirmed(ingests: list[str], count: int) -> float:
    """In host pub: `count` records as fast as they are taken, batched and confirmed; the seconds from the first
    publish to the last confirmation: what replication costs a producer. Confirmed, also because a leader below
    --min-insync refuses ("retry later") what it cannot hold: a confirming publisher re-sends it, an unconfirmed
    one (pipeline.publish) cannot know."""
    from gateway.client.publisher import Publisher

    names, body = pipeline.record_keys(), b"x" * BODY
    with Publisher(ingests, STREAM, confirm=True, linger_ms=5.0, timeout=120.0) as pub:
        start = time.perf_counter()
        for i in range(count):
            pub.publish(names[i % KEYS], body)
        pub.flush()
        return time.perf_counter() - start


@dataclass(frozen=True)
class _Steady:
    """A running group the cost runs publish to: its lab, nodes, etcd and the subscriber's multicast."""

    lab: Lab
    nodes: dict[str, Node]
    etcd: str
    multicast: list[str]

    def leader(self) -> tuple[Node, int]:
        name, epoch = self.lab.run("etcd", hagroup.leader, self.etcd, STREAM)
        return self.nodes[name], epoch


def _through(group: _Steady, count: int, rate: float) -> dict:
    """`count` records from host pub at `rate` (0: unpaced) to the leader (the other node's ingest and sidecar
    listed after its own), taken by a subscriber on host sub (keeping latencies when paced); its result, with
    "leader_changes": 1 if the leader changed meanwhile (no node was killed: a spurious failover)."""
    first, epoch = group.leader()
    order = [first, *(n for n in group.nodes.values() if n is not first)]
    ready = MP.Queue()
    take = functools.partial(pipeline.subscribe, group.multicast, [n.replay for n in order], count, ready,
                             latency=bool(rate))  # fmt: skip
    sub = group.lab.start("sub", take)
    try:
        if ready.get(timeout=pipeline.READY_S + 30) == "AWAIT_LIVE":
            raise BenchError("the subscriber heard no heartbeat in 30 s: multicast is not flowing in the lab")
        confirmed_s = 0.0
        if rate:
            publish = functools.partial(pipeline.publish, linger_ms=latency.LINGER_MS)
            group.lab.run("pub", publish, [n.ingest for n in order], count, rate, timeout=300)
        else:
            confirmed_s = group.lab.run("pub", _publish_confirmed, [n.ingest for n in order], count, timeout=300)
        got = sub.result(timeout=300)
    finally:
        stop(sub)
    if got["missing"] or got["disorder"]:
        raise BenchError(f"the reconciled subscriber missed {got['missing']} records: {got['summary']}")
    return {**got, "confirmed_s": confirmed_s, "leader_changes": int(group.leader()[1] != epoch)}


def _throughput(group: _Steady, count: int) -> dict[str, float]:
    """Records/s by the publisher's clock (first publish -> last confirmation: what replication costs a
    producer) and by the subscriber's (first -> last delivery, which flatters a pair: its first record waits
    for the follower while the publisher already floods)."""
    got = _through(group, count, 0.0)
    return {"rate": count / got["confirmed_s"], "delivered": got["records"] / got["seconds"],
            "leader_changes": got["leader_changes"]}  # fmt: skip


def _latency(group: _Steady, count: int) -> dict[str, float]:
    got = _through(group, count, latency.RATE)
    lat = array("q")
    lat.frombytes(got["latencies"])
    ms = sorted(x / 1e6 for x in lat)
    return {"p50": _pct(ms, 50), "p99": _pct(ms, 99), "p99.9": _pct(ms, 99.9), "max": ms[-1],
            "leader_changes_lat": got["leader_changes"]}  # fmt: skip
