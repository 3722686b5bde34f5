"""`zeps demo`: the whole system on a throw-away LAN, with a verdict a newcomer can read.

Four network-namespace hosts on one bridge: "gw" runs the gateway and the replay sidecar, "pub" publishes a
paced feed, "early" subscribes from the start behind 5% inbound packet loss, and "late" joins when a third of
the feed has gone by; later "early" is cut off the LAN for longer than PGM's own repair window, so only the
journal can fill what it missed. PGM's window is bytes, not seconds: its rate times its recovery interval. At
the default 100 Mbit/s x 2 s it would hold over a minute of this feed and repair any outage, so the demo sizes
it to the feed (`DemoPlan.tuning`: twice the feed's rate, half a second), and the verdict checks that the replay
path delivered what the window could not hold. Meanwhile a fifth host, "rogue", attacks the feed: a ZeroMQ PUB
of its own on the same group and port (forged batches and heartbeats, replayed genuine ones) and scapy junk. The
deployment is secured (docs/security.md): multicast signed with a stream key, CURVE on ingest and replay. Each
subscriber checks every record it receives against what was published, and the demo prints, per subscriber,
where the records came from, what it dropped, and whether the stream was complete, in order, and exactly once.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import DataLoss
from gateway.mcast import Endpoint, Tuning
from gateway.tools.deployment import Deployment, Keys
from gateway.tools.load import generated
from gateway.tools.rogue import FORGED, attack
from gateway.transport.curve import CurveClientKeys
from gateway.wire.streamkey import StreamKey
from netlab import Lab, packets
from netlab.impair import Impairment, heal, impair, partition

STREAM = "demo.ticks"
BODY, KEYS = 100, 50
RECORD_WIRE_BYTES = BODY + 32  # a record in a batch: body, key, length and time fields, its share of the header


@dataclass(frozen=True)
class DemoPlan:
    records: int = 60_000
    rate: float = 5_000.0  # records per second
    loss_pct: float = 5.0
    late_at: float = 1 / 3  # fraction of the feed published before the late subscriber joins
    outage_s: float = 3.0  # "early" is partitioned this long, a while after "late" joins
    rogue_messages: int = 400  # sent by the rogue PUB when "late" joins
    junk: int = 300  # scapy datagrams of random bytes to the feed's group and port
    timeout_s: float = 120.0
    recovery_ivl_ms: int = 500  # PGM keeps this long of data at its rate for repair

    @property
    def tuning(self) -> Tuning:
        """PGM sized to the feed: a rate of twice the feed's (room for repairs and heartbeats), so its window
        (rate x recovery interval) holds about a second of the feed, not a minute."""
        feed_kbps = self.rate * RECORD_WIRE_BYTES * 8 / 1000
        return Tuning(rate_kbps=max(1000, round(2 * feed_kbps)), recovery_ivl_ms=self.recovery_ivl_ms)

    @property
    def window_s(self) -> float:
        """Seconds of the feed that PGM's window holds."""
        return self.tuning.rate_kbps * 125 * self.tuning.recovery_ivl_ms / 1000 / (self.rate * RECORD_WIRE_BYTES)

    @property
    def beyond_window(self) -> int:
        """Records of the outage that PGM cannot repair, halved for the timing's slack: the journal's share."""
        return int(max(0.0, self.outage_s - self.window_s) * self.rate / 2)


def publish_feed(ingest: str, count: int, rate: float, curve: CurveClientKeys | None) -> int | None:
    """In host "pub": the generated feed, paced, every record confirmed as journaled."""
    with Publisher(ingest, STREAM, confirm=True, batch_records=50, curve=curve) as pub:
        start = time.monotonic()
        for i, (key, body) in enumerate(generated(count, BODY, KEYS, 0)):
            pub.publish(key, body)
            if i % 50 == 49:
                time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
        return pub.flush()


def run_subscriber(
    multicast: list[str],
    replay: str,
    count: int,
    timeout_s: float,
    ready: Any,
    key: StreamKey,
    curve: CurveClientKeys | None,
    tuning: Tuning,
) -> dict[str, Any]:
    """In a subscriber host: receive from the start until record `count`, checking each against the feed."""
    logging.getLogger("gateway.transport.curve").setLevel(
        logging.ERROR
    )  # the rogue's messages are counted in the table
    want = generated(count, BODY, KEYS, 0)
    report: dict[str, Any] = {"out_of_order": 0, "wrong_content": 0, "lost_reported": 0, "last_seq": 0}
    with Subscriber(
        STREAM, multicast=multicast, replay=replay, start="earliest", stream_key=key, curve=curve, tuning=tuning
    ) as sub:
        ready.put("up")
        deadline = time.monotonic() + timeout_s
        expect = 1
        while expect <= count and time.monotonic() < deadline:
            try:
                rec = sub.next(timeout=0.5)
            except DataLoss as exc:
                report["lost_reported"] += exc.hi - exc.lo + 1
                continue
            if rec is None:
                continue
            if rec.seq != expect:
                report["out_of_order"] += 1
            if rec.body != next(want)[1]:
                report["wrong_content"] += 1
            expect = rec.seq + 1
            report["last_seq"] = rec.seq
        report.update(sub.summary())
        report["state"] = sub.state
    return report


def run(plan: DemoPlan = DemoPlan(), say=print) -> bool:
    """Run the demo; return True when every subscriber received the whole feed, in order, exactly once."""
    if os.geteuid() != 0:
        raise PermissionError("zeps demo builds network namespaces and needs root: run it as root (sudo)")
    from netlab.procs import MP

    hosts = ["gw", "pub", "early", "late", "rogue"]
    with tempfile.TemporaryDirectory(prefix="zeps-demo-") as tmp, Lab(hosts) as lab:
        say(f"LAN up: {', '.join(f'{h.name}={h.ip}' for h in lab.hosts)} (bridge {lab.bridge})")
        keys = Keys.create(Path(tmp) / "keys")
        tuning = plan.tuning
        pgm = ["--rate-kbps", str(tuning.rate_kbps), "--recovery-ivl-ms", str(tuning.recovery_ivl_ms)]
        dep = Deployment(lab, Path(tmp) / "journal", STREAM, keys=keys, gateway_args=pgm)
        key, curve = keys.stream_key(), dep.curve
        say(f"gw: gateway (ingest {dep.ingest}, multicast {dep.multicast[0]}) and replay sidecar ({dep.replay})")
        say(f"gw: PGM at {tuning.rate_kbps:,} kbit/s (twice the feed) with a {tuning.recovery_ivl_ms} ms recovery "
            f"interval: its repair window holds about {plan.window_s:.1f} s of the feed")  # fmt: skip
        say(f"gw: multicast signed with stream key {key.id:08x}; CURVE on ingest and replay")
        try:
            impair(lab, "early", Impairment(loss_pct=plan.loss_pct), direction="in")
            say(f"early: subscribes from the start, behind {plan.loss_pct:g}% inbound packet loss")
            ready = MP.Queue()
            early = lab.start("early", run_subscriber, dep.for_host("early"), dep.replay, plan.records,
                              plan.timeout_s, ready, key, curve, tuning)  # fmt: skip
            ready.get(timeout=60)
            seconds = plan.records / plan.rate
            say(f"pub: publishing {plan.records:,} records of {BODY} bytes over {KEYS} keys at {plan.rate:,.0f}/s "
                f"(~{seconds:.0f} s)")  # fmt: skip
            feed = lab.start("pub", publish_feed, dep.ingest, plan.records, plan.rate, curve)
            time.sleep(seconds * plan.late_at)
            say(f"late: joins now, about {int(plan.records * plan.late_at):,} records behind, from the beginning")
            late = lab.start("late", run_subscriber, dep.for_host("late"), dep.replay, plan.records,
                             plan.timeout_s, ready, key, curve, tuning)  # fmt: skip
            outage_at = time.monotonic() + seconds * 0.2
            rogue = lab.start("rogue", attack, dep.for_host("rogue")[0], STREAM, plan.rogue_messages)
            group = Endpoint.parse(dep.multicast[0])
            junk = packets.inject(lab, "rogue", group.group, group.port, count=plan.junk, size=200, pps=500)
            say(f"rogue: a ZeroMQ PUB of its own on {group.group}:{group.port} (forged batches and heartbeats, "
                f"replayed genuine ones), and {junk} datagrams of scapy junk")  # fmt: skip
            time.sleep(max(0.0, outage_at - time.monotonic()))
            say(f"early: cut off the LAN for {plan.outage_s:g} s, longer than PGM's window (~{plan.window_s:.1f} s of "
                "the feed) can repair: only the journal can fill the rest")  # fmt: skip
            partition(lab, "early")
            time.sleep(plan.outage_s)
            heal(lab, "early")
            say("early: back on the LAN")
            last = feed.result(timeout=plan.timeout_s)
            say(f"pub: done, {plan.records:,} records confirmed journaled (last sequence {last})")
            sent = rogue.result(timeout=plan.timeout_s)
            say("waiting for the subscribers to finish ...")
            reports = {"early": early.result(timeout=plan.timeout_s), "late": late.result(timeout=plan.timeout_s)}
        finally:
            problems = dep.close()
    for problem in problems:
        say(f"gw: {problem}")
    forged = sum(sent.get(kind, 0) for kind in FORGED)
    say(f"rogue: sent {forged} forged messages, {sent.get('replayed', 0)} replayed genuine ones, {junk} junk datagrams")
    return _verdict(plan, reports, say) and not problems


def _verdict(plan: DemoPlan, reports: dict[str, dict[str, Any]], say) -> bool:
    published = plan.records
    rows = [
        ("published", lambda r: published),
        ("delivered", lambda r: r["delivered"]),
        ("  from live multicast", lambda r: r["from_live"]),
        ("  from replay (TCP)", lambda r: r["from_replay"]),
        ("gaps detected", lambda r: r["gaps_detected"]),
        ("gaps filled", lambda r: r["gaps_filled"]),
        ("duplicates dropped", lambda r: r["duplicates_dropped"]),
        ("rogue messages dropped", lambda r: r["unauthenticated"]),
        ("out of order", lambda r: r["out_of_order"]),
        ("wrong content", lambda r: r["wrong_content"]),
        ("reported lost", lambda r: r["lost_reported"]),
    ]
    names = list(reports)
    say("")
    say(f"{'':24}" + "".join(f"{n:>12}" for n in names))
    for label, get in rows:
        say(f"{label:24}" + "".join(f"{get(reports[n]):>12,}" for n in names))
    ok = True
    say("")
    for name, r in reports.items():
        complete = (
            r["delivered"] == published
            and r["last_seq"] == published
            and not (r["out_of_order"] or r["wrong_content"] or r["lost_reported"])
        )
        ok &= complete
        verdict = "COMPLETE: every record, in order, exactly once" if complete else "INCOMPLETE"
        say(f"{name}: {verdict} (final state {r['state']})")
        intact = "stream intact" if complete else "stream NOT intact"
        say(f"{name}: rogue packets dropped: {r['unauthenticated']:,} (the junk died in PGM's checks), {intact}")
    filled = reports["early"]["from_replay"]
    journal_filled = filled >= plan.beyond_window
    ok &= journal_filled
    say(f"early: the journal filled the outage: {filled:,} records over replay (at least {plan.beyond_window:,} "
        f"expected: {plan.outage_s:g} s cut off, PGM's window ~{plan.window_s:.1f} s)" if journal_filled else
        f"early: the outage was NOT filled from the journal: {filled:,} records over replay, at least "
        f"{plan.beyond_window:,} expected")  # fmt: skip
    say("")
    say("VERDICT: PASS" if ok else "VERDICT: FAIL")
    return ok
