"""Scenario 4, latency: publish -> delivery at 10,000 records/s over epgm, without loss and with 1% loss.

Host pub publishes paced records (publisher linger 1 ms, so a record waits at most 1 ms for its batch);
the gateway journals and multicasts them; a reconciling `Subscriber` on host sub takes them with
`next_batch()`. Latency is the subscriber's clock at delivery minus the record's publish time (the
publisher's clock: all lab hosts share the machine's clock). With loss, netlab drops 1% of the packets
arriving at host sub (multicast and the replay connection alike): PGM repairs some, the reconciler fills
the rest from the replay sidecar (the gap-fill path). Every record must arrive, in order.
"""

from __future__ import annotations

import functools
import time
from array import array

from gateway.bench import pipeline
from gateway.bench.runner import BenchError, Plot, Progress, Result, Settings, Stat, Table, Target, repeat
from gateway.deployment import Deployment
from netlab import MP
from netlab.impair import Impairment, clear, impair

TITLE = "Latency: publish -> delivery at 10,000 records/s, with and without 1% loss"
RATE = 10_000.0
LINGER_MS = 1.0
LOSSES = (0.0, 1.0)
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
TARGET_P99_MS = {0.0: 5.0, 1.0: 20.0}


def estimate(settings: Settings) -> float:
    return 15 + len(LOSSES) * settings.runs * (4 if settings.quick else 14)


def run(settings: Settings) -> Result:
    progress = Progress("latency")
    count = settings.size(100_000, 3_000)
    failures: list[str] = []
    stats: dict[float, dict[str, list[float]]] = {}
    with pipeline.deployed(["sub"], tmp=settings.tmp, options=pipeline.gateway_options()) as dep:
        for loss in LOSSES:
            if loss:
                impair(dep.lab, "sub", Impairment(loss_pct=loss), "in")
            try:
                stats[loss] = repeat(settings.runs, progress, f"{count:,} records at {RATE:,.0f}/s, {loss:g}% loss",
                                     lambda _, loss=loss: _once(dep, count), failures)  # fmt: skip
            finally:
                clear(dep.lab, "sub")
    columns = tuple(f"p{p:g}" for p in PERCENTILES)
    rows = []
    for loss in LOSSES:
        got = stats[loss]
        percentiles = (Stat.of(got.get(c), "ms", 2) for c in columns)
        rows.append(
            (f"{loss:g}% loss", *percentiles, Stat.of(got.get("max"), "ms", 1), Stat.of(got.get("from_replay")))
        )
    targets = []
    for loss, goal in TARGET_P99_MS.items():
        p99 = Stat.of(stats[loss].get("p99"), "ms", 2)
        targets.append(Target(f"p99 < {goal:g} ms with {loss:g}% loss", str(p99), p99.median < goal))
    return Result(
        "latency",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"publish -> delivery, {count:,} records per run, publisher linger {LINGER_MS:g} ms",
                ("loss", *columns, "max", "records from replay"),
                rows,
            )
        ],
        targets=targets,
        plots=[
            Plot(
                "latency",
                f"Publish -> delivery latency at {RATE:,.0f} records/s",
                "percentile",
                "ms",
                {
                    f"{loss:g}% loss": (list(PERCENTILES), [Stat.of(stats[loss].get(c)).median for c in columns])
                    for loss in LOSSES
                },
                logy=True,
            )
        ],
        notes=failures,
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
    )


def _once(dep: Deployment, count: int) -> dict[str, float]:
    lab, ready = dep.lab, MP.Queue()
    sub = lab.start("sub", functools.partial(pipeline.subscribe, dep.for_host("sub"), dep.replay, count, ready,
                                             latency=True))  # fmt: skip
    if ready.get(timeout=pipeline.READY_S + 30) == "AWAIT_LIVE":
        raise BenchError("the subscriber heard no heartbeat in 30 s: multicast is not flowing in the lab")
    lab.run("pub", functools.partial(pipeline.publish, linger_ms=LINGER_MS), dep.ingest, count, RATE, timeout=300)
    got = sub.result(timeout=300)
    if got["missing"] or got["disorder"]:
        raise BenchError(f"the reconciled subscriber missed {got['missing']} records: {got['summary']}")
    lat = array("q")
    lat.frombytes(got["latencies"])
    ms = sorted(x / 1e6 for x in lat)
    out = {f"p{p:g}": ms[min(len(ms) - 1, int(len(ms) * p / 100))] for p in PERCENTILES}
    return {**out, "max": ms[-1], "from_replay": got["summary"]["from_replay"]}
