"""Soak: an hour at 20,000 records/s with loss and periodic faults, the RSS of every long-lived process
sampled (issue #34): does anything grow after the first minutes?

A namespace lab (gateway.bench.pipeline.deployed): the gateway and its replay sidecar on host gw, a paced
confirming Publisher on host pub (`publish_many` in batches of BATCH, so Python keeps up; its bodies are
"record-N"), and two reconciling Subscribers on host sub, each on the multicast group with the sidecar for
fills, reading from the earliest record. 1% random loss on everything reaching host sub (netlab impair).
Every fault cycle (5 minutes; a shorter run has one cycle): the sidecar killed -9 and restarted, the
gateway killed -9 and restarted (the publisher re-sends what was not confirmed, the gateway drops what it
already journaled), and the second subscriber SIGSTOPped for 8 s. VmRSS (/proc/PID/status) of the gateway,
sidecar, publisher and both subscribers every SAMPLE_S seconds. At the end the publisher stops, and each
subscriber reads up to the last confirmed sequence N: it must have had 1..N exactly once, in order, record
i with body "record-i" (checked as it goes, in constant memory: the checker must not be what grows).

Per process: RSS after the warm-up (2 minutes), at the end, the trend after the warm-up (gateway.bench.rss_trend:
the Theil-Sen slope, robust to a transient spike; for the restarted gateway and sidecar the incarnation that
rises most, each after its own warm-up), and the peak.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from gateway.bench import BenchError, pipeline
from gateway.bench.memory import RATE_KBPS as PGM_RATE_KBPS
from gateway.bench.rss_trend import NOISE_MIB, SLOPE_MIB_PER_H, Trend, worst_trend
from gateway.bench.runner import STREAM, Plot, Progress, Result, Settings, Table, Target, stop
from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import DataLoss
from gateway.tools.deployment import Deployment
from gateway.tools.hagroup import take_target
from netlab import MP, Impairment, impair

TITLE = "Soak: an hour at 20,000 records/s with 1% loss and periodic kills and pauses; RSS of every process"
RATE = 20_000.0  # records a second the publisher offers, unless --rate says otherwise
BATCH = 200  # records per publish_many
LOSS_PCT = 1.0
CYCLE_S = 300.0  # one sidecar kill, one gateway kill and one pause per cycle
PAUSE_S = 8.0
WARMUP_S = 120.0
SAMPLE_S = 5.0
DRAIN_S = 120.0  # after the publisher stops: for the subscribers to reach its last sequence
SUBSCRIBERS = ("subscriber A", "subscriber B (paused)")


def estimate(settings: Settings) -> float:
    return 40 + _duration(settings) + DRAIN_S / 4


def _duration(settings: Settings) -> float:
    return 20.0 if settings.quick else settings.soak_minutes * 60


@dataclass
class Samples:
    """RSS samples: {process: [(seconds into the run, pid, MiB)]}; a restarted process has several pids."""

    series: dict[str, list[tuple[float, int, float]]] = field(default_factory=lambda: defaultdict(list))

    def take(self, t: float, pids: dict[str, int]) -> None:
        for name, pid in pids.items():
            if (mib := vm_rss_mib(pid)) is not None:
                self.series[name].append((t, pid, mib))

    def row(self, name: str, warmup: float) -> tuple[str, int, float, float, Trend | None, float]:
        """(process, incarnations, MiB after warm-up, at the end, the trend of the incarnation that rises most
        (gateway.bench.rss_trend), peak)."""
        samples = self.series[name]
        warm = next((mib for t, _, mib in samples if t >= warmup), samples[-1][2])
        incarnations = len({pid for _, pid, _ in samples})
        peak = max(mib for _, _, mib in samples)
        return name, incarnations, warm, samples[-1][2], worst_trend(samples, warmup), peak


def vm_rss_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB (from /proc/PID/status), None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def run(settings: Settings) -> Result:
    progress = Progress("soak")
    transport, rate, duration = settings.transport, settings.rate or RATE, _duration(settings)
    cycle = min(CYCLE_S, duration)
    pause = min(PAUSE_S, cycle / 5)
    warmup = min(WARMUP_S, duration / 4)
    progress(f"{transport}://, {rate:,.0f} records/s for {duration / 60:.1f} min, faults every {cycle:.0f} s")
    options = pipeline.gateway_options(PGM_RATE_KBPS)
    with pipeline.deployed(["sub"], tmp=settings.tmp, transport=transport, options=options) as dep:
        impair.impair(dep.lab, "sub", Impairment(loss_pct=LOSS_PCT))
        samples, faults, pub, subs = _soak(dep, rate, duration, cycle, pause, progress)
        problems = dep.close()
    problems += [f"{name}: {p}" for name, got in zip(SUBSCRIBERS, subs, strict=True) for p in got["problems"]]
    rows = [samples.row(name, warmup) for name in ("gateway", "replay sidecar", "publisher", *SUBSCRIBERS)]
    flat = all(tr is None or tr.flat for *_, tr, _ in rows)
    achieved = pub["records"] / pub["seconds"]
    return Result(
        "soak",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"RSS in MiB over {duration / 60:.1f} min, {transport}://",
                ("process", "incarnations", f"after {warmup:.0f} s", "at the end", "trend after warm-up", "peak"),
                [(n, k, f"{w:.1f}", f"{e:.1f}", _trend_cell(tr), f"{p:.1f}") for n, k, w, e, tr, p in rows],
            ),
            Table(
                "records",
                ("target rate /s", "achieved /s", "published", "confirmed head", *SUBSCRIBERS, "faults"),
                [
                    (
                        f"{rate:,.0f}",
                        f"{achieved:,.0f}",
                        f"{pub['records']:,}",
                        f"{pub['head']:,}",
                        *(f"{got['records']:,} ({got['gaps_filled']:,} gaps filled)" for got in subs),
                        ", ".join(f"{what} x{n}" for what, n in Counter(faults).items()),
                    )
                ],
            ),
        ],
        targets=[
            Target(
                f"RSS flat: trend after the warm-up at most {SLOPE_MIB_PER_H:g} MiB/hour "
                f"(or under {NOISE_MIB:g} MiB over a short run)",
                ", ".join(f"{n} {_trend_cell(tr)}" for n, _, _, _, tr, _ in rows),
                flat,
            ),
            Target("every subscriber got 1..N exactly once, in order", f"{len(problems)} problems", not problems),
        ],
        plots=[
            Plot(
                "soak",
                f"RSS under a {duration / 60:.0f}-minute soak, {transport}://",
                "seconds",
                "RSS MiB",
                {n: ([t for t, _, _ in s], [m for _, _, m in s]) for n, s in samples.series.items()},
            )
        ],
        notes=problems,
        runs=1,
        seconds=time.monotonic() - progress.start,
        issue=34,
    )


def _trend_cell(tr: Trend | None) -> str:
    if tr is None:
        return "too short to judge"
    return f"{tr.slope_mib_per_h:+.1f} MiB/h ({tr.rise_mib:+.1f} MiB over {tr.span_s / 60:.1f} min)"


def _soak(
    dep: Deployment, rate: float, duration: float, cycle: float, pause: float, progress: Progress
) -> tuple[Samples, list[str], dict[str, Any], list[dict[str, Any]]]:
    """The load, the faults and the sampling for `duration`; then the drain. Every process it starts is
    stopped before it returns, however it returns."""
    lab, samples, faults = dep.lab, Samples(), []
    ready, until = MP.Queue(), [MP.Queue() for _ in SUBSCRIBERS]
    stopping = MP.Event()
    limit = duration + DRAIN_S + 60
    subs = [
        lab.start("sub", subscribe, dep.for_host("sub"), dep.replay, ready, q, limit) for q in until
    ]  # fmt: skip
    pub = None
    try:
        for _ in subs:
            ready.get(timeout=pipeline.READY_S)
        pub = lab.start("pub", publish, dep.ingest, rate, stopping, limit)
        plan = [(cycle * 0.2, "sidecar kill -9"), (cycle * 0.5, "gateway kill -9"), (cycle * 0.8, f"pause {pause:g} s")]
        start = next_sample = time.monotonic()
        resume: float | None = None
        n = 0
        while (now := time.monotonic()) - start < duration:
            t = now - start
            if now >= next_sample:
                samples.take(t, _pids(dep, pub, subs))
                next_sample += SAMPLE_S if duration > 60 else 1.0
                if len(samples.series["publisher"]) % 12 == 1:
                    progress(f"{t:.0f}/{duration:.0f} s: RSS " + ", ".join(
                        f"{k} {v[-1][2]:.0f}" for k, v in samples.series.items()) + " MiB")  # fmt: skip
            if resume is not None and now >= resume:
                os.kill(subs[1].pid, signal.SIGCONT)
                resume = None
            at, what = plan[n % len(plan)]
            if t >= (n // len(plan)) * cycle + at:
                faults.append(what)
                progress(f"fault: {what} at {t:.0f} s")
                if what.startswith("pause"):
                    os.kill(subs[1].pid, signal.SIGSTOP)
                    resume = time.monotonic() + pause
                else:
                    which = what.split()[0]
                    dep.kill9(which)
                    (dep.start_replay if which == "sidecar" else dep.start_gateway)()
                n += 1
            time.sleep(0.1)
        if resume is not None:
            os.kill(subs[1].pid, signal.SIGCONT)
        stopping.set()
        published = pub.result(timeout=DRAIN_S)
        progress(f"published {published['records']:,}, confirmed to {published['head']:,}; draining")
        for q in until:
            q.put(published["head"])
        got = [s.result(timeout=DRAIN_S + 30) for s in subs]
    except Exception as exc:
        raise BenchError(f"the soak failed: {type(exc).__name__}: {exc}") from exc
    finally:
        stopping.set()
        for s in subs:
            if s.is_alive():
                os.kill(s.pid, signal.SIGCONT)  # a paused one must be able to end
        stop(*subs, *([pub] if pub is not None else []))
    return samples, faults, published, got


def _pids(dep: Deployment, pub: Any, subs: list[Any]) -> dict[str, int]:
    assert dep.gateway is not None and dep.sidecar is not None
    return {"gateway": dep.gateway.pid, "replay sidecar": dep.sidecar.pid, "publisher": pub.pid,
            **{name: s.pid for name, s in zip(SUBSCRIBERS, subs, strict=True)}}  # fmt: skip


def publish(ingest: str, rate: float, stop_event: Any, limit_s: float) -> dict[str, Any]:
    """In host pub: "record-1", "record-2", ... confirmed, BATCH at a time paced at `rate`/s, until `stop_event`
    (or `limit_s`); the records published, the last sequence confirmed, and the seconds it took."""
    n = 0
    start = time.monotonic()
    deadline = start + limit_s
    with Publisher(ingest, STREAM, confirm=True, timeout=30.0) as pub:
        while not stop_event.is_set() and time.monotonic() < deadline:
            bodies = [b"record-%d" % i for i in range(n + 1, n + BATCH + 1)]
            pub.publish_many(["k"] * BATCH, bodies)
            n += BATCH
            ahead = start + n / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        seconds = time.monotonic() - start
        head = pub.flush()
    return {"records": n, "head": head or 0, "seconds": seconds}


def subscribe(multicast: list[str], replay: str, ready: Any, until: Any, limit_s: float) -> dict[str, Any]:
    """In host sub: a reconciling Subscriber from the earliest record until the sequence put on `until`,
    checking as it goes (constant memory) that record i is sequence i with body "record-i"."""
    problems: list[str] = []
    expect = 1
    losses = 0
    target: int | None = None
    with Subscriber(STREAM, multicast=multicast, replay=replay, start="earliest") as sub:
        ready.put("up")
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and (target is None or expect <= target):
            target, deadline = take_target(until, target, deadline, DRAIN_S)
            try:
                delivery = sub.next_batch(timeout=0.2)
            except DataLoss as exc:
                losses += 1
                if len(problems) < 5:
                    problems.append(f"loss reported: {exc.lo}..{exc.hi}")
                continue
            if delivery is None:
                continue
            for seq, _, _, body in delivery.raw():
                if (seq != expect or body != b"record-%d" % seq) and len(problems) < 5:
                    problems.append(f"sequence {seq} (body {bytes(body)[:20]!r}) where {expect} was due")
                expect = seq + 1
        summary = sub.summary()
    if target is None or expect != target + 1:
        problems.append(f"got up to {expect - 1}, the publisher's last confirmed sequence is {target}")
    return {"records": expect - 1, "losses": losses, "problems": problems, "gaps_filled": summary["gaps_filled"]}
