"""Scenario 5, NORM: the throughput scenario over norm:// (gateway.transport.norm, libnorm at a fixed rate).

The same lab, publisher and reconciling subscriber as the throughput scenario; the gateway sends NORM at
`--rate-kbps` 300,000, the rate docs/norm.md recommends on such a machine (at most what the set rate gives
back: above it NORM falls short of its rate rather than losing data).
"""

from __future__ import annotations

import time

from gateway.bench import throughput
from gateway.bench.runner import BODY, Progress, Result, Settings, Stat, Table, Target

TITLE = "NORM: the throughput scenario over norm://"
RATE_KBPS = 300_000
WIRE_BYTES = BODY + 24.4  # per record on the wire: record header, key and the batch header's share


def estimate(settings: Settings) -> float:
    return 15 + settings.runs * (8 if settings.quick else 15)


def run(settings: Settings) -> Result:
    progress = Progress("norm")
    count = settings.size(1_000_000, 20_000)
    failures: list[str] = []
    got = throughput.zeps_runs(settings, progress, "norm", count, failures, rate_kbps=RATE_KBPS)
    rate = Stat.of(got.get("rate"), "records/s")
    ceiling = RATE_KBPS * 1000 / 8 / WIRE_BYTES
    return Result(
        "norm",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"{count:,} records, {BODY}-byte bodies, NORM rate {RATE_KBPS:,} kbit/s",
                (
                    "delivered",
                    "publisher",
                    "missing",
                    "records from replay",
                    "gateway CPU µs/record",
                    "subscriber CPU µs/record",
                ),
                [
                    (
                        rate,
                        Stat.of(got.get("publish_rate"), "records/s"),
                        Stat.of(got.get("missing")),
                        Stat.of(got.get("from_replay")),
                        Stat.of(got.get("gw_us"), digits=2),
                        Stat.of(got.get("sub_us"), digits=2),
                    )
                ],
            )
        ],
        targets=[
            Target(
                f"the set rate's ceiling, {ceiling:,.0f} records/s ({RATE_KBPS:,} kbit/s / {WIRE_BYTES:g} B)",
                f"{rate.median / ceiling:.0%} of it",
                None,
            )
        ],
        notes=[
            *failures,
            "Why NORM stops here: the gateway sends at a fixed rate (no congestion control), so the set rate is a hard "
            "ceiling; below it, libnorm's protocol thread works per 1,400-byte segment (about 80% of a core at the "
            "sender at 300 Mbit/s, docs/norm.md) on the same 2 cores as the Python publisher, gateway and "
            "subscriber. epgm's PGM engine costs less per packet, so epgm goes further on this machine.",
        ],
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
    )
