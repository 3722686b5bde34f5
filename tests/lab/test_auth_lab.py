"""Hostile multicast in a namespace lab: a rogue host on the feed's group and port cannot inject records.

Real processes: the gateway (signing with a stream key, CURVE on ingest) and the replay sidecar (CURVE) on
"gw", a publisher on "pub", a keyed subscriber on "sub", a subscriber without the key on "plain", and on
"rogue" a second sender (gateway.tools.rogue: forged batches and heartbeats, replayed genuine messages) and scapy
junk to the same group and port; over epgm and norm. Figures are printed for docs/security.md (pytest -s).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from support.feedlab import STREAM, WAIT_S, expected, publish, subscribe

from gateway.journal import JournalReader
from gateway.mcast import Endpoint
from gateway.tools.deployment import Deployment, Keys
from gateway.tools.rogue import FORGED, attack
from netlab import packets
from netlab.procs import MP

pytestmark = pytest.mark.lab

COUNT = 20_000
RATE = 2_500.0  # records/s: the attack runs while the feed flows
TAIL = 1_000  # records published after the attack, so the keyed subscriber is still listening throughout
ROGUE_MESSAGES = 400
JUNK = 300
JUNK_SPORT = 4242


def subscribe_logged(multicast: list[str], replay: str, until: int, ready: Any, options: dict) -> dict[str, Any]:
    """feedlab.subscribe from the earliest record, with `options` and the warnings the subscriber logged."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("gateway").addHandler(handler)
    result = subscribe(multicast, replay, "earliest", until, ready, **options)
    result["warnings"] = seen
    return result


@pytest.mark.parametrize("transport", ["epgm", "norm", "udp"])
def test_rogue_sender_cannot_inject(make_lab, tmp_path: Path, transport: str) -> None:
    lab = make_lab(["gw", "pub", "sub", "plain", "rogue"])
    keys = Keys.create(tmp_path / "keys")
    dep = Deployment(lab, tmp_path / "journal", STREAM, transport=transport, keys=keys)
    feed = Endpoint.parse(dep.multicast[0])
    half = COUNT // 2
    try:
        ready = MP.Queue()
        keyed = lab.start("sub", subscribe_logged, dep.for_host("sub"), dep.replay, COUNT, ready,
                          {"stream_key": keys.stream_key(), "curve": dep.curve})  # fmt: skip
        plain = lab.start("plain", subscribe_logged, dep.for_host("plain"), dep.replay, half, ready,
                          {"curve": dep.curve})  # fmt: skip
        ready.get(timeout=WAIT_S)
        ready.get(timeout=WAIT_S)

        # 1. No rogue yet: a subscriber without the key takes the signed feed, unverified, and says so.
        assert lab.run("pub", publish, dep.ingest, 0, half, RATE, dep.curve, timeout=WAIT_S) == half
        unkeyed = plain.result(timeout=WAIT_S)

        # 2. The attack, while the feed goes on: a rogue PUB on the same group and port, and scapy junk.
        sniffer = packets.start_sniff(lab, "sub", seconds=WAIT_S, bpf=f"udp and src port {JUNK_SPORT}")
        publishing = lab.start("pub", publish, dep.ingest, half, COUNT - half - TAIL, RATE, dep.curve)
        rogue = lab.start("rogue", attack, dep.for_host("rogue")[0], STREAM, ROGUE_MESSAGES)
        junk = packets.inject(lab, "rogue", feed.group, feed.port, count=JUNK, size=200, sport=JUNK_SPORT, pps=200)
        sent = rogue.result(timeout=WAIT_S)
        publishing.result(timeout=WAIT_S)
        sniffer.stop()
        capture = sniffer.result()
        assert lab.run("pub", publish, dep.ingest, COUNT - TAIL, TAIL, RATE, dep.curve, timeout=WAIT_S) == COUNT
        got = keyed.result(timeout=WAIT_S)
    finally:
        problems = dep.close()
    assert not problems

    forged = sum(sent.get(kind, 0) for kind in FORGED)
    s = got["summary"]
    print(f"\nrogue sent {sent} ({forged} forged), junk datagrams {junk} (seen at sub: {capture.packets}); "
          f"keyed subscriber: {s}; unkeyed: {unkeyed['summary']}")  # fmt: skip

    # The keyed subscriber delivered exactly the published stream, and dropped the forgeries it saw.
    assert got["records"] == expected(1, COUNT)
    assert got["losses"] == []
    assert got["sources"].get("live:A", 0) > 0
    assert s["unauthenticated"] >= 0.9 * forged, "most forged messages should have reached the subscriber"
    if transport == "epgm":  # PGM checks its packets; over NORM the junk damages a few genuine ones (security.md)
        assert s["unauthenticated"] <= forged
    assert s["duplicates_dropped"] >= 1 and sent.get("replayed", 0) > 0  # replayed genuine batches: duplicates
    assert any("failed" in w or "dropped" in w for w in got["warnings"])
    assert got["state"] == "MERGED"  # no forged heartbeat made it chase a head that does not exist
    # The junk reached the subscriber's host (and died in PGM's own checks: it is not even counted).
    assert junk == JUNK and capture.packets >= JUNK

    # Without the key: the whole stream, live, unverified, with one warning that says so.
    assert unkeyed["records"] == expected(1, half)
    assert unkeyed["sources"].get("live:A", 0) > 0
    assert unkeyed["summary"]["unauthenticated"] == 0
    assert sum("NOT verified" in w for w in unkeyed["warnings"]) == 1

    assert JournalReader(tmp_path / "journal", STREAM).last_seq == COUNT
