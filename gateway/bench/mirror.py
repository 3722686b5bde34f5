"""Scenario: site mirroring (issue #35), `zeps mirror` between the two LANs of netlab's two-site lab.

Site A: host a-gw runs the source's gateway and sidecar, a-pub the publisher, a-sub a subscriber. Site B: b-gw a
gateway serving the stream with `--mirror` and its sidecar, b-sub a subscriber, b-mirror `zeps mirror` reading
A's sidecar across the router and writing B's ingest. Both gateways run with `--rate-kbps` 1,000,000 (epgm). Each
run starts both sites on fresh journals: with a perfect link between the sites (LAN to LAN); with the WAN
delaying every packet 30 ms and losing 1% each way (RTT 60 ms; netlab's impairments on the router); and over
that WAN with every host's TCP congestion control set to BBR (a sysctl of each namespace) instead of Linux's
default CUBIC, which halves its window at each loss (the mirror's one TCP connection carries the stream); and
over that WAN with `zeps mirror --paths 4` (the catch-up striped over four TCP sessions, the live tail on two,
first arrival wins), and with `zeps mirror --datagram-tail xor:4` and `repeat:1` (the live tail as datagrams
from A's sidecar too, with forward error correction, one TCP path as the fallback), their runs alternating
with the plain WAN row's in one lab. `zeps bench mirror --lag-only` runs the lag of those WAN rows alone.

- Lag: A publishes at 10,000 records/s (100-byte bodies) while a reconciling subscriber on each LAN takes them
  from its own site's multicast; each times publish -> delivery with the one clock of the machine. The mirror's
  lag is B's p99 against A's, in the same run. The WAN's bytes a-to-b per record published (the router's B-side
  link, every packet that crossed: TCP copies, datagrams, their redundancy, headers) say what each way costs.
- Throughput: the mirror is stopped, A's journal gets a burst (publish_many), and the mirror started again: the
  rate at which B's journal head advances, from its first step to level (or for at most a bounded time over the
  WAN), is the most the mirror keeps up with. Per stage, to find the hop that limits it: the rate of a plain
  reader of A's sidecar on b-mirror (the same reading over the same paths, no forwarding), the CPU time per
  record each process of the path spent while the mirror caught up (A's sidecar, the mirror, B's gateway: 1 /
  that is what the stage would do with a core to itself), and the share of that time the mirror waited for a
  CPU (/proc schedstat: on a loaded machine, what starves a pipeline whose processes each use little CPU).
- Promotion: right after the catch-up, `zeps mirror promote` on b-mirror, and one confirmed publish at B: from
  the command's start to that confirm (B need not be level: it continues from its own head). Python's start and
  the CLI's imports are part of that; `zeps mirror promote --help`, timed just before, shows what they cost. LAN
  to LAN with `--force` (A's publishers stopped: the command's own cost); over the WAN with A cut off and
  `--source A` (the disaster case: the command first finds A silent).
- Promotion of a group: in the LAN to LAN lab, site B is also a replicated group (docs/mirroring.md, "Promoting
  a group"): etcd on b-etcd, nodes on b-n1 and b-n2 (`zeps gateway --etcd --node --mirror` and a sidecar each),
  the mirror into both until they hold a short history, then the same `zeps mirror promote --force`, given both
  nodes, and one confirmed publish at the group: the promotion adds an etcd transaction (fenced by the epoch)
  before PROMOTE-OK.
- Promotion after A is cut off at the router (the disaster case as it happens), in the WAN lab, B one node and B
  a group of two: fresh sites, the mirror running into B until it holds a short history, then an iptables DROP
  of everything the router forwards (no RST, no ICMP: a connect to A hangs), and at once `zeps mirror promote
  --source A` (no `--force`: the command must find A gone within its `--probe-timeout`) and one confirmed publish
  at B. Timed from the command's start and from the cut (the rule in place) to that confirm: the latter is the
  outage a publisher at B sees if the operator acts at once. `zeps bench mirror --promotion-only` runs the
  promotion rows of their own (these two and the group's, not the links' runs).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from gateway.bench import BenchError, pipeline
from gateway.bench.runner import (
    STREAM,
    Progress,
    Result,
    Settings,
    Stat,
    Table,
    Target,
    percentiles,
    repeat,
    run_seconds,
    runqueue_seconds,
    stop,
    stop_process,
    times,
)
from gateway.client.publisher import Publisher
from gateway.client.source_paths import SourcePaths
from gateway.journal import JournalReader
from gateway.tools import hagroup
from gateway.tools.deployment import Deployment
from netlab import MP, Impairment, Sites, ns

TITLE = "Site mirroring: throughput, lag and promotion between two LANs"
LAG_RATE = 10_000.0
WAN = Impairment(delay_ms=30, loss_pct=1)
RTT_MS = 2 * WAN.delay_ms


@dataclass(frozen=True)
class Link:
    """How the sites are joined: the WAN's impairment (None: a perfect link) and the hosts' TCP congestion
    control (a sysctl of each namespace; None: the kernel's default, CUBIC)."""

    name: str
    wan: Impairment | None = None
    congestion: str | None = None
    paths: int = 1  # `zeps mirror --paths`
    tail: str | None = None  # `zeps mirror --datagram-tail`

    @property
    def lab(self) -> tuple[Impairment | None, str | None]:
        """What the lab is built with: links that share it alternate their runs in one lab."""
        return self.wan, self.congestion


LAN = Link("LAN to LAN")
LINKS = (
    LAN,
    Link("WAN 30 ms, 1% loss", WAN),
    Link("WAN 30 ms, 1% loss, --paths 4", WAN, paths=4),
    Link("WAN 30 ms, 1% loss, --datagram-tail xor:4", WAN, tail="xor:4"),
    Link("WAN 30 ms, 1% loss, --datagram-tail repeat:1", WAN, tail="repeat:1"),
    Link("WAN 30 ms, 1% loss, BBR", WAN, "bbr"),
)
GROUP_NODES = ("b-n1", "b-n2")  # site B as a group (the promotion of a group)
PROMOTION_HISTORY = 10_000  # records mirrored into B before a promotion row of its own promotes it


@dataclass(frozen=True)
class Promotion:
    """A promotion row of its own: site B one node or a group of two, promoted with `--force` (A's publishers
    stopped), or once A is cut off at the router with `--source A`."""

    name: str
    wan: Impairment | None
    group: bool
    cut: bool


GROUP = Promotion("LAN to LAN, B a group of 2", None, group=True, cut=False)
CUT = Promotion("WAN 30 ms, 1% loss, A cut off at the router", WAN, group=False, cut=True)
CUT_GROUP = Promotion("WAN 30 ms, 1% loss, A cut off at the router, B a group of 2", WAN, group=True, cut=True)
PROMOTIONS = (GROUP, CUT, CUT_GROUP)
A_HOSTS, B_HOSTS = ("a-gw", "a-pub", "a-sub"), ("b-gw", "b-sub", "b-mirror", "b-etcd", *GROUP_NODES)
TARGET_LAN_RATE, TARGET_WAN_RATE = 500_000.0, 200_000.0
TARGET_ADDED_P99_MS = 5.0  # LAN to LAN: B's p99 at most this above A's
TARGET_WAN_P99_MS = RTT_MS + 20.0  # over the WAN: B's p99 (publish at A -> delivery at B) at most this
TARGET_PROMOTION_S = 1.0
CATCHUP_S = 30.0  # longest a catch-up is timed (over the WAN it does not finish: the rate so far)
POLL_S = 0.02
CONGESTION = "/proc/sys/net/ipv4/tcp_congestion_control"
STAGES = ("sidecar_us", "mirror_us", "b_gateway_us")


def estimate(settings: Settings) -> float:
    if settings.lag_only:
        return 60 + len(_lag_links()) * settings.runs * (20 if settings.quick else 30)
    links = 0 if settings.promotion_only else len(LINKS) * settings.runs * (40 if settings.quick else 120)
    return 60 + links + len(PROMOTIONS) * settings.runs * 30


def _lag_links() -> tuple[Link, ...]:
    """`--lag-only`: the rows of the WAN lag target (one path, --paths 4, the datagram tail), in one lab."""
    return tuple(link for link in LINKS if link.wan == WAN and link.congestion is None)


def run(settings: Settings) -> Result:
    progress = Progress("mirror")
    lag_count = settings.size(60_000, 3_000)
    burst = settings.size(1_000_000, 50_000)
    failures: list[str] = []
    stats: dict[str, dict[str, list[float]]] = {}
    measured_links: tuple[Link, ...] = () if settings.promotion_only else _lag_links() if settings.lag_only else LINKS
    for (wan, congestion), group in itertools.groupby(LINKS, key=lambda link: link.lab):
        links = [link for link in group if link in measured_links]
        promotions = [] if settings.lag_only else [p for p in PROMOTIONS if p.wan == wan and congestion is None]
        if not links and not promotions:
            continue
        with Sites(A_HOSTS, B_HOSTS, wan=wan) as sites:
            if congestion:
                for host in sites.hosts:
                    ns.call_in_netns(host.netns, Path(CONGESTION).write_text, congestion)
            for i in range(settings.runs):  # the links of one lab alternate, run by run
                for link in links:
                    rest = "" if settings.lag_only else f", a {burst:,}-record catch-up, promotion"
                    what = f"{link.name}: lag at {LAG_RATE:,.0f}/s{rest} (run {i + 1} of {settings.runs})"
                    got = repeat(1, progress, what, _Run(sites, settings, link, lag_count, burst), failures)
                    progress(f"{link.name}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in got.items()))
                    for key, values in got.items():
                        stats.setdefault(link.name, {}).setdefault(key, []).extend(values)
                for promotion in promotions:
                    what = f"{promotion.name}: promotion (run {i + 1} of {settings.runs})"
                    got = repeat(1, progress, what, _Promotion(sites, settings, promotion), failures)
                    for key, values in got.items():
                        stats.setdefault(promotion.name, {}).setdefault(key, []).extend(values)

    def cell(link: Link | Promotion, key: str, unit: str = "", digits: int = 0) -> Stat:
        return Stat.of(stats.get(link.name, {}).get(key), unit, digits)

    lag_keys = ("a_p50", "a_p99", "b_p50", "b_p99", "added_p99")
    lag_rows = [
        (
            link.name,
            *(cell(link, k, "ms", 2) for k in lag_keys),
            cell(link, "wan_bytes"),
            (cell(link, "tail_share", "%") if link.tail else "—"),
        )
        for link in measured_links
    ]
    lag_table = Table(
        f"publish -> delivery at {LAG_RATE:,.0f} records/s, {lag_count:,} records: at site A (the source's own) "
        "and at site B (through the mirror); the WAN's bytes a-to-b per record published; with the datagram "
        "tail, the share of records forwarded from its copy (it came first)",
        ("link", "A p50", "A p99", "B p50", "B p99", "B p99 - A p99", "WAN bytes a-to-b / record",
         "records forwarded from datagrams"),
        lag_rows,
    )  # fmt: skip
    wan_lag_targets = [
        _at_most(f"{link.name}: lag p99 at {LAG_RATE:,.0f}/s (publish at A -> delivery at B) <= RTT + 20 ms "
                 f"({TARGET_WAN_P99_MS:g} ms)", cell(link, "b_p99", "ms", 2), TARGET_WAN_P99_MS)
        for link in measured_links
        if link.wan is not None
    ]  # fmt: skip
    if settings.lag_only:
        return _result(settings, progress, [lag_table], wan_lag_targets, failures)

    promo_rows: list[tuple[object, ...]] = [
        (
            link.name,
            "--force" if link.wan is None else "A cut off (netlab's partition), --source A",
            cell(link, "promote_s", "s", 2),
            cell(link, "first_publish_s", "s", 2),
            "—",
            cell(link, "cold_start_s", "s", 2),
        )
        for link in measured_links
    ]
    promo_rows += [
        (
            p.name,
            "A cut off (iptables DROP at the router), --source A" if p.cut else "--force",
            cell(p, "promote_s", "s", 2),
            cell(p, "first_publish_s", "s", 2),
            cell(p, "from_cut_s", "s", 2) if p.cut else "—",
            cell(p, "cold_start_s", "s", 2),
        )
        for p in PROMOTIONS
    ]
    promo_table = Table(
        "promotion: `zeps mirror promote` started -> it returned, and -> the first publish confirmed at B; with A "
        "cut off at the router, also from the cut (the rule in place, the command started at once) to that "
        "publish; and, for reference, `zeps mirror promote --help` on that host (Python's start and the CLI's "
        "imports)",
        ("link", "how", "command", "first publish at B", "cut -> first publish at B", "`--help` alone"),
        promo_rows,
    )
    promoted: tuple[Link | Promotion, ...] = (*measured_links, *PROMOTIONS)
    promo_targets = [
        _at_most(f"{link.name}: promotion, command to first publish accepted at B, < {TARGET_PROMOTION_S:g} s",
                 cell(link, "first_publish_s", "s", 2), TARGET_PROMOTION_S)
        for link in promoted
    ]  # fmt: skip
    if settings.promotion_only:
        return _result(settings, progress, [promo_table], promo_targets, failures)

    rate_rows = [
        (link.name, cell(link, "mirror_rate"), cell(link, "read_rate"), *(cell(link, k, digits=2) for k in STAGES),
         cell(link, "mirror_waiting", "%"))
        for link in LINKS
    ]  # fmt: skip
    targets = [
        _at_least(f"{LAN.name}: the mirror keeps up with >= {TARGET_LAN_RATE:,.0f} records/s",
                  cell(LAN, "mirror_rate"), TARGET_LAN_RATE),
        _at_most(f"{LAN.name}: mirror lag p99 at {LAG_RATE:,.0f}/s at most {TARGET_ADDED_P99_MS:g} ms above the "
                 "source's own publish -> delivery p99", cell(LAN, "added_p99", "ms", 2), TARGET_ADDED_P99_MS),
    ]  # fmt: skip
    targets += [
        _at_least(f"{link.name}: >= {TARGET_WAN_RATE:,.0f} records/s sustained", cell(link, "mirror_rate"),
                  TARGET_WAN_RATE)
        for link in LINKS
        if link.wan is not None
    ]  # fmt: skip
    targets += wan_lag_targets
    tables = [
        lag_table,
        Table(
            f"catch-up of a {burst:,}-record burst (at most {CATCHUP_S:g} s timed), records/s; per stage: a "
            "plain reader of A's sidecar on b-mirror, each process's CPU time per record while the mirror "
            "caught up (1 / that is the stage's rate with a core of its own), and the share of that time the "
            "mirror's threads waited for a CPU (the machine's load)",
            (
                "link",
                "mirror",
                "sidecar read alone (over the row's paths)",
                "A's sidecar CPU µs/record",
                "mirror CPU µs/record",
                "B's gateway CPU µs/record",
                "mirror waiting for a CPU",
            ),
            rate_rows,
        ),
        promo_table,
    ]
    return _result(settings, progress, tables, targets + promo_targets, failures)


def _result(
    settings: Settings, progress: Progress, tables: list[Table], targets: list[Target], failures: list[str]
) -> Result:
    return Result(
        "mirror",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=tables,
        targets=targets,
        notes=failures,
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
        issue=35,
    )


def _at_least(goal: str, stat: Stat, bound: float) -> Target:
    return Target(goal, str(stat), stat.median >= bound)


def _at_most(goal: str, stat: Stat, bound: float) -> Target:
    return Target(goal, str(stat), stat.median <= bound)


class _Run:
    """One run on `sites`: fresh deployments at both sites, then lag, catch-up and promotion, in that order."""

    def __init__(self, sites: Sites, settings: Settings, link: Link, lag_count: int, burst: int) -> None:
        self.sites, self.settings, self.link = sites, settings, link
        self.lag_count, self.burst = lag_count, burst
        self.catchup_s = 5.0 if settings.quick else CATCHUP_S

    def __call__(self, _: int) -> dict[str, float]:
        with (
            tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=self.settings.tmp) as tmp,
            _site(self.sites, "a", Path(tmp) / "a") as a,
            _site(self.sites, "b", Path(tmp) / "b", "--mirror", STREAM) as b,
        ):
            mirror = _Mirror(self.sites, a, b.ingest, Path(tmp) / "mirror.log", self.link)
            try:
                out = self._lag(a, b, mirror)
                if not self.settings.lag_only:
                    out.update(self._catchup(a, b, mirror))
                    out.update(self._promotion(a, b, mirror))
            finally:
                mirror.stop()
                self.sites.heal_wan()
            return out

    def _lag(self, a: Deployment, b: Deployment, mirror: _Mirror) -> dict[str, float]:
        subs, readies = [], []
        try:
            for dep, host in ((a, "a-sub"), (b, "b-sub")):
                ready = MP.Queue()
                readies.append(ready)
                subs.append(self.sites.start(host, pipeline.subscribe, dep.for_host(host), dep.replay, self.lag_count,
                                             ready, pipeline.RATE_KBPS, False, True, 300.0))  # fmt: skip
            for ready in readies:
                if ready.get(timeout=pipeline.READY_S + 30) == "AWAIT_LIVE":
                    raise BenchError("a subscriber heard no heartbeat in 30 s: multicast is not flowing in the lab")
            wan0 = self._wan_bytes()
            self.sites.run("a-pub", pipeline.publish, a.ingest, self.lag_count, LAG_RATE, timeout=300)
            got = [sub.result(timeout=300) for sub in subs]
        finally:
            stop(*subs)
        out: dict[str, float] = {}
        for site, result in zip("ab", got, strict=True):
            if result["missing"] or result["disorder"]:
                raise BenchError(f"site {site}'s subscriber missed {result['missing']} records: {result['summary']}")
            out.update({f"{site}_{k}": v for k, v in percentiles(times(result["latencies"]), (50.0, 99.0)).items()})
        out["added_p99"] = out["b_p99"] - out["a_p99"]
        _wait_head(b.journal, self.lag_count, 60.0)
        out["wan_bytes"] = (self._wan_bytes() - wan0) / self.lag_count
        if self.link.tail:
            out["tail_share"] = mirror.tail_records() / self.lag_count * 100
        return out

    def _wan_bytes(self) -> int:
        """Bytes the router has sent into site B (every packet that crossed a-to-b)."""
        return ns.call_in_netns(self.sites.router.netns, tx_bytes, self.sites.router.ifname)

    def _catchup(self, a: Deployment, b: Deployment, mirror: _Mirror) -> dict[str, float]:
        mirror.stop()
        level = _head(b.journal)
        total = level + self.burst
        self.sites.run("a-pub", pipeline.publish, a.ingest, self.burst, 0.0, 0.0, 300.0, 1_000, timeout=330)
        _wait_head(a.journal, total, 60.0)
        read = self.sites.run("b-mirror", read_source, a.replay, level, total, self.catchup_s, self.link.paths,
                              timeout=self.catchup_s + 60)  # fmt: skip
        mirror.start()
        deadline = time.monotonic() + 60.0
        while (start := _head(b.journal)) == level:  # the mirror's process starting and its session opening
            mirror.check()
            if time.monotonic() > deadline:
                raise BenchError(f"the mirror did not start copying within 60 s: {mirror.tail()}")
            time.sleep(POLL_S)
        pids = dict(zip(STAGES, (_pid(a.sidecar), mirror.pid, b.gateway_pid), strict=True))
        cpu0, wait0 = {k: run_seconds(pid) for k, pid in pids.items()}, runqueue_seconds(mirror.pid)
        t0 = time.monotonic()
        end = t0 + self.catchup_s
        while (head := _head(b.journal)) < total and time.monotonic() < end:
            time.sleep(POLL_S)
        elapsed, records = time.monotonic() - t0, max(1, head - start)
        out = {k: (run_seconds(pid) - cpu0[k]) / records * 1e6 for k, pid in pids.items()}
        out["mirror_waiting"] = (runqueue_seconds(mirror.pid) - wait0) / elapsed * 100
        return {"mirror_rate": (head - start) / elapsed, "read_rate": read, **out}

    def _promotion(self, a: Deployment, b: Deployment, mirror: _Mirror) -> dict[str, float]:
        if self.link.wan is None:
            how = ["--force"]
        else:
            self.sites.cut_wan()
            how = ["--source", a.replay]
        done = self.sites.run("b-mirror", promote_and_publish, b.ingest, how, timeout=120)
        promoted = re.search(r"promoted at sequence (\d+)", done["stdout"])
        if done["code"] != 0 or promoted is None or done["seq"] != int(promoted[1]) + 1:
            raise BenchError(f"promotion failed (exit {done['code']}, first sequence {done['seq']}): {done['stderr']}")
        return {k: done[k] for k in ("promote_s", "first_publish_s", "cold_start_s")}


class _Promotion:
    """One run of a promotion row of its own (the module docstring): fresh A and B (one node, or etcd and two
    nodes), the mirror into B until it holds PROMOTION_HISTORY records, then the promotion and one publish."""

    def __init__(self, sites: Sites, settings: Settings, promotion: Promotion) -> None:
        self.sites, self.settings, self.promotion = sites, settings, promotion

    def __call__(self, _: int) -> dict[str, float]:
        with (
            tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=self.settings.tmp) as tmp,
            _site(self.sites, "a", Path(tmp) / "a") as a,
            _mirror_site(self.sites, Path(tmp), self.promotion.group) as (ingests, journals),
        ):
            mirror = _Mirror(self.sites, a, ingests, Path(tmp) / "mirror.log", Link(self.promotion.name))
            try:
                self.sites.run("a-pub", pipeline.publish, a.ingest, PROMOTION_HISTORY, 0.0, timeout=120)
                for journal in journals:
                    _wait_head(journal, PROMOTION_HISTORY, 60.0)
                if self.promotion.cut:  # the mirror runs on, as it would: A vanishes under it
                    done = self._after_cut(ingests, a.replay)
                else:
                    mirror.stop()
                    done = self.sites.run("b-mirror", promote_and_publish, ingests, ["--force"], timeout=120)
            finally:
                mirror.stop()
                self.sites.heal_wan()
        promoted = re.search(r"promoted at sequence (\d+)", done["stdout"])
        if done["code"] != 0 or promoted is None or done["seq"] != int(promoted[1]) + 1:
            raise BenchError(f"the promotion failed (exit {done['code']}, first sequence {done['seq']}): "
                             f"{done['stderr']}")  # fmt: skip
        return {k: v for k, v in done.items() if k.endswith("_s") and v is not None}

    def _after_cut(self, ingests: str, source: str) -> dict[str, Any]:
        """The command is ready on b-mirror (its `--help` timed) before the cut, and started as soon as the cut
        is in place."""
        ready, cut = MP.Queue(), MP.Queue()
        proc = self.sites.start("b-mirror", promote_and_publish, ingests, ["--source", source], ready, cut)
        try:
            ready.get(timeout=120)
            self.sites.cut_wan("drop")
            cut.put(time.monotonic())
            return dict(proc.result(timeout=120))
        finally:
            stop(proc)


@contextlib.contextmanager
def _mirror_site(sites: Sites, root: Path, group: bool) -> Iterator[tuple[str, list[Path]]]:
    """Site B serving the stream as a mirror: its ingest(s), comma-separated, and journal(s). One gateway and
    sidecar on b-gw, or etcd on b-etcd and a group's nodes on GROUP_NODES; stopped on exit."""
    if not group:
        with _site(sites, "b", root / "b", "--mirror", STREAM) as single:
            yield single.ingest, [single.journal]
        return
    b = sites.lab("b")
    etcd_proc, etcd = hagroup.start_etcd(b, root / "etcd", host="b-etcd")
    channel = f"udp://{b.group(2)}:{hagroup.MCAST_PORT}"
    options = (*hagroup.NODE_OPTIONS, "--mirror", STREAM)
    nodes = [hagroup.Node(b, root, name, etcd, channel, stream=STREAM, options=options, verbose=False)
             for name in GROUP_NODES]  # fmt: skip
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_ready()
        yield ",".join(node.ingest for node in nodes), [node.journal for node in nodes]
    finally:
        for node in nodes:
            node.kill9()
        etcd_proc.kill()
        etcd_proc.wait(10)


def read_source(replay: str, after: int, last: int, seconds: float, paths: int = 1) -> float:
    """In host b-mirror: the mirror's reading of A's sidecar (after `after`, over `paths` sessions, put back in
    order as the mirror does), and nothing else, until `last` or for at most `seconds`; records/s from the first
    batch."""
    reader = SourcePaths(replay, STREAM, paths=paths, after=after, features=("batch", "range"), timeout_s=30.0,
                         curve=None, ctx=zmq.Context.instance())  # fmt: skip
    try:
        head, t0, end = after, 0.0, time.monotonic() + 60.0
        while head < last and time.monotonic() < end:
            zmq.select(reader.socks, [], [], 0.05)
            reader.poll(time.monotonic())
            while (batch := reader.pop()) is not None:
                if not t0:
                    t0, first, end = time.monotonic(), batch.first_seq - 1, time.monotonic() + seconds
                head = batch.last_seq
    finally:
        reader.close()
    if not t0:
        raise BenchError(f"nothing came from the sidecar at {replay} within 60 s")
    return (head - first) / (time.monotonic() - t0)


def promote_and_publish(gateway: str, how: list[str], ready: Any = None, cut: Any = None) -> dict[str, Any]:
    """In host b-mirror: `zeps mirror promote` with `how` at `gateway` (B's ingest, or a group's, comma-separated),
    then one confirmed publish at B; the exit, what it printed, the first sequence published, the seconds from
    the command's start to its end and to that confirm, and for reference the wall time of `zeps mirror promote
    --help` on this host (the interpreter's start and the CLI's imports: what the command costs before it does
    anything). With queues `ready` and `cut`: says it is ready once `--help` was timed, and starts the command
    when `cut` brings the (monotonic) time the cut was made; the seconds from then to the confirm, too."""
    zeps = [sys.executable, "-m", "gateway.cli", "mirror", "promote"]
    t0 = time.monotonic()
    subprocess.run([*zeps, "--help"], capture_output=True, timeout=60, check=True)
    cold_s = time.monotonic() - t0
    cut_at = None
    if ready is not None and cut is not None:
        ready.put(True)
        cut_at = cut.get(timeout=120)
    t0 = time.monotonic()
    done = subprocess.run([*zeps, "--stream", STREAM, "--gateway", gateway, *how], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    promote_s, code = time.monotonic() - t0, done.returncode
    seq = None
    if code == 0:
        with Publisher(gateway.split(","), STREAM, confirm=True, timeout=30.0) as pub:
            pub.publish("key000", b"x" * 100)
            seq = pub.flush()
    confirmed = time.monotonic()
    return {"code": code, "stdout": done.stdout, "stderr": done.stderr, "seq": seq, "promote_s": promote_s,
            "first_publish_s": confirmed - t0, "from_cut_s": None if cut_at is None else confirmed - cut_at,
            "cold_start_s": cold_s}  # fmt: skip


class _Mirror:
    """`zeps mirror --paths N` on b-mirror, A's sidecar to B's ingest(s) (`to`); its stderr in a log file."""

    def __init__(self, sites: Sites, a: Deployment, to: str, log: Path, link: Link) -> None:
        self.sites, self.log = sites, log
        self.argv = [sys.executable, "-m", "gateway.cli", "mirror", "-v", "--log-every", "1s", "--source", a.replay,
                     "--to", to, "--stream", STREAM, "--paths", str(link.paths)]  # fmt: skip
        if link.tail:
            self.argv += ["--datagram-tail", link.tail]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = self.sites.popen("b-mirror", self.argv, stderr=log)

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"the mirror exited {self.proc.returncode}: {self.tail()}")

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(nothing on stderr)"

    def tail_records(self) -> int:
        """Records forwarded from the datagram tail so far (its last status line's count)."""
        counts = re.findall(r"tail_records=(\d+)", self.log.read_text(errors="replace"))
        return int(counts[-1]) if counts else 0

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@contextlib.contextmanager
def _site(sites: Sites, site: str, journal: Path, *extra: str) -> Iterator[Deployment]:
    """The gateway (PGM at pipeline.RATE_KBPS) and sidecar on host "{site}-gw"; stopped on exit."""
    dep = Deployment(sites.lab(site), journal, STREAM, host=f"{site}-gw",
                     gateway_args=[*pipeline.gateway_options(), *extra])  # fmt: skip
    try:
        yield dep
    finally:
        dep.close()


def _pid(proc: subprocess.Popen | None) -> int:
    assert proc is not None  # a Deployment starts both at once
    return proc.pid


def _head(journal: Path) -> int:
    return JournalReader(journal, STREAM).last_seq


def _wait_head(journal: Path, head: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _head(journal) < head:
        if time.monotonic() > deadline:
            raise BenchError(f"the journal {journal} holds {_head(journal):,} of {head:,} records after {timeout:g} s")
        time.sleep(POLL_S)


def tx_bytes(ifname: str) -> int:
    """In a namespace: the bytes `ifname` has sent (/proc/net/dev, the calling thread's namespace)."""
    for line in Path("/proc/thread-self/net/dev").read_text().splitlines():
        name, _, counts = line.partition(":")
        if name.strip() == ifname:
            return int(counts.split()[8])
    raise BenchError(f"no interface {ifname} in /proc/net/dev")
