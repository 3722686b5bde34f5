"""Recovery: publish -> delivery at 10,000 records/s under random and burst loss, on every transport.

The latency scenario's pipeline (host pub publishes paced 100-byte records with a 1 ms publisher linger, the
gateway journals and multicasts them, a reconciling `Subscriber` on host sub takes them) under loss of the
packets arriving at host sub, multicast and the replay connection alike: random loss of 0.1%, 1% and 5%, and
1% lost in bursts of 1,000 packets on average (the Gilbert model). epgm:// runs through
`gateway.transport.pgm` here (ZEPS_PGM_ENGINE=openpgm: OpenPGM with NAK timers for a LAN), udp:// fills every
gap from the replay sidecar (by datagram at its fill port, FETCH over TCP as the fallback), norm:// repairs on
the multicast with libnorm. Each with one feed and with A/B
feeds (two groups, the subscriber takes the first copy of each batch). Every record must arrive once, in
order; "records from replay" counts those the sidecar filled. The wire columns count packets on the gateway
host's interface during each run: the repairs sent (PGM RDATA, NORM data segments sent again, fill-datagram
answers from the sidecar's fill port) and the requests for them (PGM NAKs, NORM_NACKs, fill requests).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

from gateway.bench import latency, norm, pipeline
from gateway.bench.runner import Progress, Result, Settings, Stat, Table, Target, repeat
from gateway.mcast import PGM_ENGINE_ENV
from gateway.tools.deployment import Deployment
from netlab.impair import Impairment, clear, impair
from netlab.packets import Sniffer, start_sniff

TITLE = "Recovery: publish -> delivery at 10,000 records/s under loss, every transport"
LOSSES: dict[str, Impairment] = {
    "0%": Impairment(),
    "0.1%": Impairment(loss_pct=0.1),
    "1%": Impairment(loss_pct=1.0),
    "5%": Impairment(loss_pct=5.0),
    "1% in bursts of 1,000": Impairment(loss_pct=1.0, loss_burst=1000),
}
TRANSPORTS = ("epgm", "udp", "norm")
Case = tuple[str, str, int]  # (transport, loss, feeds)
CASES: tuple[Case, ...] = tuple((t, loss, feeds) for t in TRANSPORTS for feeds in (1, 2) for loss in LOSSES)
COLUMNS = ("p50", "p99", "p99.9")
# Which packets repair a loss, and which ask for a repair, as BPF filters on host gw's interface. PGM's type
# byte follows its two ports (udp[12]: RDATA 0x05, NAK 0x08). Fill datagrams go to and from the sidecar's fill
# port, the replay endpoint's port (gateway.tools.deployment, like the feeds' ports). NORM's type is the low
# nibble of its first byte (DATA 2, NACK 4); libnorm sets no repair flag and repairs a stream by sending data
# segments again, so its repairs are the NORM_DATA packets whose object and FEC payload id were sent before.
_FEEDS = "udp portrange 5555-5556"
WIRE: dict[str, tuple[str, str]] = {
    "epgm": (f"{_FEEDS} and udp[12] == 0x05", f"{_FEEDS} and udp[12] == 0x08"),
    "norm": (f"{_FEEDS} and udp[8] & 0x0f == 2", f"{_FEEDS} and udp[8] & 0x0f == 4"),
    "udp": ("udp src port 5580", "udp dst port 5580"),
}
TARGET_P99_MS = {"0%": 5.0, "1%": 10.0, "5%": 20.0}  # one feed


def estimate(settings: Settings) -> float:
    return 30 + len(CASES) * settings.runs * (4 if settings.quick else 16)


def run(settings: Settings, cases: Sequence[Case] = CASES) -> Result:
    # epgm:// through gateway.transport.pgm in every process of the lab (they inherit the environment).
    with mock.patch.dict(os.environ, {PGM_ENGINE_ENV: "openpgm"}):
        return _run(settings, cases)


def _run(settings: Settings, cases: Sequence[Case]) -> Result:
    progress = Progress("recovery")
    count = settings.size(100_000, 3_000)
    failures: list[str] = []
    stats: dict[Case, dict[str, list[float]]] = {}
    for transport, feeds in dict.fromkeys((c[0], c[2]) for c in cases):
        rate_kbps = norm.RATE_KBPS if transport == "norm" else pipeline.RATE_KBPS
        options = pipeline.gateway_options(rate_kbps)
        with pipeline.deployed(["sub"], tmp=settings.tmp, feeds=feeds, transport=transport, options=options) as dep:
            for case in (c for c in cases if (c[0], c[2]) == (transport, feeds)):
                stats[case] = _measure(dep, case, count, settings, progress, failures)
    rows = [(_label(*c), *(Stat.of(stats[c].get(k), "ms", 2) for k in (*COLUMNS, "max")),
             *(Stat.of(stats[c].get(k)) for k in ("from_replay", "repairs", "requests"))) for c in cases]  # fmt: skip
    targets = []
    for case in (c for c in cases if c[2] == 1 and c[1] in TARGET_P99_MS):
        goal, p99 = TARGET_P99_MS[case[1]], Stat.of(stats[case].get("p99"), "ms", 2)
        targets.append(Target(f"p99 <= {goal:g} ms: {_label(*case)}", str(p99), p99.median <= goal))
    return Result(
        "recovery",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"publish -> delivery, {count:,} records per run, publisher linger {latency.LINGER_MS:g} ms",
                ("case", *COLUMNS, "max", "records from replay", "repairs on the wire", "repair requests"),
                rows,
            )
        ],
        targets=targets,
        notes=failures,
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
        issue=19,
    )


def _measure(
    dep: Deployment, case: Case, count: int, settings: Settings, progress: Progress, failures: list[str]
) -> dict[str, list[float]]:
    loss = LOSSES[case[1]]
    if not loss.is_clear:
        impair(dep.lab, "sub", loss, "in")
    try:
        return repeat(settings.runs, progress, f"{_label(*case)}, {count:,} records",
                      lambda _: _once(dep, case[0], count, settings.tmp), failures)  # fmt: skip
    finally:
        clear(dep.lab, "sub")


def _once(dep: Deployment, transport: str, count: int, tmp: Path) -> dict[str, float]:
    """One latency run, with the repairs and repair requests it cost counted on the wire."""
    with tempfile.TemporaryDirectory(prefix="zeps-wire-", dir=tmp) as where:
        pcap = Path(where, "data.pcap") if transport == "norm" else None
        sniffers: list[Sniffer] = []
        try:
            for bpf, into in zip(WIRE[transport], (pcap, None), strict=True):
                sniffers.append(start_sniff(dep.lab, dep.host, seconds=600, bpf=bpf, pcap=into))
            measured = latency.once(dep, count)
        finally:
            for sniffer in sniffers:
                sniffer.stop()
        repairs, requests = (sniffer.result().packets for sniffer in sniffers)
        if pcap is not None:
            repairs = _sent_again(pcap)
    return {**measured, "repairs": repairs, "requests": requests}


def _sent_again(pcap: Path) -> int:
    """NORM_DATA packets in `pcap` that repeat an earlier one's sender, instance, object and FEC payload id."""
    from scapy.layers.inet import UDP
    from scapy.utils import PcapReader

    seen: set[bytes] = set()
    again = 0
    with PcapReader(str(pcap)) as frames:
        for frame in frames:
            data = bytes(frame[UDP].payload)
            key = data[4:10] + data[13:20]  # source id, instance id; FEC id, object id, FEC payload id
            again += key in seen
            seen.add(key)
    return again


def _label(transport: str, loss: str, feeds: int) -> str:
    return f"{transport}, {loss} loss" + (", A/B feeds" if feeds == 2 else "")
