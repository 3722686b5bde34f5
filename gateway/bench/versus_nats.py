"""The latency scenario's comparison: ZEPS against NATS core and NATS JetStream, in the same kind of lab, in the
same run, at 1,000, 10,000 and 100,000 records/s.

Three hosts each time (pub, gw, sub). ZEPS: the gateway and sidecar on gw over udp://, default settings but the
benchmark's publisher linger, a reconciling `Subscriber` on sub. NATS: nats-server (with JetStream) on gw,
nats-py at both ends: core NATS (a plain subscription to every subject), then JetStream (a file stream, an
ordered push consumer of its new messages). The same pacing (ten records, then a sleep up to the schedule), the
same 100-byte payload (a NATS body starts with its publish time). Latency is each system's subscriber clock at
delivery minus the publish time (one machine, one clock). The ratios are ZEPS over NATS: below 1, ZEPS is faster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from gateway.bench import BenchError, nats, pipeline
from gateway.bench.runner import PERCENTILES, Progress, Settings, Stat, Table, Target, percentiles, repeat, stop, times
from gateway.tools.deployment import Deployment
from netlab import MP, Lab

RATES = (1_000.0, 10_000.0, 100_000.0)
SECONDS = 10.0  # of records per run at each rate (quick: 0.3 s)
SYSTEMS = ("ZEPS udp://", "NATS core", "NATS JetStream")
COLUMNS = ("p50", "p99", "p99.9")
Stats = dict[tuple[str, float], dict[str, list[float]]]
ZepsRun = Callable[[Deployment, int, float], dict[str, float]]  # (deployment, records, rate) -> percentiles in ms


def count(settings: Settings, rate: float) -> int:
    return int(rate * (0.3 if settings.quick else SECONDS))


def measure(settings: Settings, progress: Progress, failures: list[str], zeps: ZepsRun) -> Stats:
    """Every system at every rate, `settings.runs` times each (ZEPS with `zeps`): percentiles in ms."""
    stats: Stats = {}
    options = pipeline.gateway_options(pipeline.RATE_KBPS)
    with pipeline.deployed(["sub"], tmp=settings.tmp, transport="udp", options=options) as dep:
        for rate in RATES:
            n = count(settings, rate)
            stats[SYSTEMS[0], rate] = repeat(settings.runs, progress, f"{SYSTEMS[0]} at {rate:,.0f}/s, {n:,} records",
                                             functools.partial(_zeps_once, zeps, dep, n, rate), failures)  # fmt: skip
    with Lab(["pub", "gw", "sub"]) as lab, nats.server(settings.tmp, lab) as (url, _):
        for system, jetstream in zip(SYSTEMS[1:], (False, True), strict=True):
            if jetstream:  # after the core runs: a stream would store their messages too
                lab.run("pub", nats.create_stream, url)
            for rate in RATES:
                n = count(settings, rate)
                stats[system, rate] = repeat(settings.runs, progress, f"{system} at {rate:,.0f}/s, {n:,} records",
                                             functools.partial(nats_once, lab, url, n, rate, jetstream),
                                             failures)  # fmt: skip
    return stats


def _zeps_once(zeps: ZepsRun, dep: Deployment, n: int, rate: float, run: int) -> dict[str, float]:
    del run  # every run alike
    return zeps(dep, n, rate)


def nats_once(lab: Lab, url: str, n: int, rate: float, jetstream: bool, run: int) -> dict[str, float]:
    """One NATS run in `lab` (core, or JetStream): its latency percentiles and the share received; also the
    peer of scripts/latency_hops.py."""
    del run
    ready = MP.Queue()
    deadline = n / rate + 30
    sub = lab.start("sub", functools.partial(nats.latencies, url, n, ready, jetstream, deadline))
    try:
        ready.get(timeout=nats.READY_S)
        lab.run("pub", functools.partial(nats.publish, stamped=True, stored=jetstream), url, n, rate, timeout=300)
        got = sub.result(timeout=deadline + 10)
    finally:
        stop(sub)
    if not got["records"]:
        raise BenchError(f"the NATS subscriber got none of {n} messages")
    return {**percentiles(times(got["latencies"]), PERCENTILES), "received": got["records"] / n * 100}


def tables(stats: Stats) -> list[Table]:
    rows = []
    for rate in RATES:
        for system in SYSTEMS:
            got = stats.get((system, rate), {})
            cells = [str(Stat.of(got[c], "ms", 2)) if got.get(c) else "failed" for c in COLUMNS]
            received = str(Stat.of(got["received"], "%", 1)) if got.get("received") else "100.0 % (checked)"
            rows.append((f"{rate:,.0f}/s", system, *cells, received))
    ratios = []
    for rate in RATES:
        cells = [_ratio(stats, rate, peer, c) for peer in SYSTEMS[1:] for c in ("p50", "p99")]
        ratios.append((f"{rate:,.0f}/s", *cells))
    peers = tuple(f"/ {peer.split()[-1]} {c}" for peer in SYSTEMS[1:] for c in ("p50", "p99"))
    return [
        Table(
            "ZEPS, NATS core and NATS JetStream, publish -> delivery (ms), nats-py at both ends",
            ("rate", "system", *COLUMNS, "received"),
            rows,
        ),
        Table("ZEPS over NATS: latency ratios (below 1: ZEPS is faster)", ("rate", *peers), ratios),
    ]


def targets(stats: Stats) -> list[Target]:
    """Issue 32's: at 10,000/s p99.9 under 2 ms, p50 at most NATS core's and p99 at most 1.5x; at 1,000 and
    100,000/s no worse than JetStream at p50 and p99."""
    goals: list[tuple[str, float, str, str, float]] = [
        ("p50 <= NATS core p50 at 10,000/s", 10_000.0, "NATS core", "p50", 1.0),
        ("p99 <= 1.5x NATS core p99 at 10,000/s", 10_000.0, "NATS core", "p99", 1.5),
    ]
    goals += [(f"{c} <= JetStream {c} at {r:,.0f}/s", r, "NATS JetStream", c, 1.0) for r in (1_000.0, 100_000.0)
              for c in ("p50", "p99")]  # fmt: skip
    out = []
    ours = stats.get((SYSTEMS[0], 10_000.0), {}).get("p99.9")
    p999 = Stat.of(ours, "ms", 2) if ours else None
    out.append(Target("p99.9 < 2 ms at 10,000/s", str(p999 or "n/a"), None if p999 is None else p999.median < 2.0, 32))
    for goal, rate, peer, column, bound in goals:
        ratio = _median_ratio(stats, rate, peer, column)
        measured, met = ("n/a", None) if ratio is None else (f"ratio {ratio:.2f}", ratio <= bound)
        out.append(Target(goal, measured, met, 32))
    return out


def _median_ratio(stats: Stats, rate: float, peer: str, column: str) -> float | None:
    ours, theirs = stats.get((SYSTEMS[0], rate), {}).get(column), stats.get((peer, rate), {}).get(column)
    if not ours or not theirs:
        return None
    return Stat.of(ours).median / Stat.of(theirs).median


def _ratio(stats: Stats, rate: float, peer: str, column: str) -> str:
    ratio = _median_ratio(stats, rate, peer, column)
    return "n/a" if ratio is None else f"{ratio:.2f}"


def run(settings: Settings, progress: Progress, failures: list[str], zeps: ZepsRun) -> tuple[list[Table], list[Target]]:
    """The comparison's tables and targets (a failed system shows as "failed", its ratios as n/a)."""
    stats = measure(settings, progress, failures, zeps)
    return tables(stats), targets(stats)
