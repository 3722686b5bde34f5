"""Late joiners by snapshot, end to end: real gateway and replay sidecar, multicast between lab hosts.

1,000,000 records over 10,000 keys, with deletes and TTLs, are journaled before anyone subscribes. A client
joining by snapshot and a client replaying everything from the first record must then hold the same
key -> value map (the model's), and agree record for record on the live data that follows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support.feedlab import STREAM, WAIT_S, deploy

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from netlab.procs import MP

pytestmark = pytest.mark.lab

KEYS = 10_000
HISTORY = 1_000_000
LIVE = 20_000
SHORT_TTL_S = 0.001  # long gone by the time anyone looks
LONG_TTL_S = 3600.0  # outlives the test


def record(i: int) -> tuple[str, bytes, float | None]:
    """Record i of the load: every key 100 times in a scrambled order; some deletes, short and long TTLs."""
    key = f"k{(i * 7919) % KEYS:05d}"
    if i % 17 == 5:
        return key, b"", None  # deletes the key
    ttl = SHORT_TTL_S if i % 13 == 7 else LONG_TTL_S if i % 11 == 3 else None
    return key, b"v%d" % i, ttl


def model(count: int) -> dict[str, bytes]:
    """The last value of every key after records 0..count-1, short TTLs expired."""
    values: dict[str, bytes] = {}
    for i in range(count):
        key, body, ttl = record(i)
        if body and ttl != SHORT_TTL_S:
            values[key] = body
        else:
            values.pop(key, None)
    return values


def publish(ingest: str, first: int, count: int, rate: float) -> int | None:
    """Records first..first+count-1, in PUBLISH-BATCHes of 1,000; confirmed; returns the last sequence."""
    with Publisher(ingest, STREAM, confirm=True, timeout=WAIT_S, batch_records=1000) as pub:
        for i in range(first, first + count):
            pub.publish(*record(i))
            if rate and i % 1000 == 999:
                time.sleep(1000 / rate)
        return pub.flush()


def join(multicast: list[str], replay: str, start: str, ready: Any) -> dict[str, Any]:
    """Subscribe from `start`; report the view once record HISTORY is handed out; then collect the live
    records up to HISTORY + LIVE and return them with the final view."""
    live: list[tuple[int, str, bytes, int]] = []
    began = time.monotonic()
    with Subscriber(STREAM, multicast=multicast, replay=replay, start=start, view=True) as sub:
        assert sub.view is not None
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            rec = sub.next(timeout=0.5)
            if rec is None:
                continue
            if rec.seq == HISTORY:
                ready.put((start, dict(sub.view), sub.summary(), time.monotonic() - began))
            elif rec.seq > HISTORY:
                live.append((rec.seq, rec.key, rec.body, rec.ttl_ms))
                if rec.seq == HISTORY + LIVE:
                    break
        return {"view": dict(sub.view), "live": live, "summary": sub.summary(), "state": sub.state}


@pytest.fixture
def deployment(make_lab, tmp_path: Path):
    lab = make_lab(["pub", "gw", "sub", "sub2"])
    dep = deploy(lab, tmp_path)
    yield dep
    assert not dep.close()


def test_snapshot_joiner_and_full_replayer_hold_the_same_map_and_agree_on_live(deployment) -> None:
    lab = deployment.lab
    began = time.monotonic()
    assert lab.run("pub", publish, deployment.ingest, 0, HISTORY, 0.0, timeout=WAIT_S) == HISTORY
    published = time.monotonic()
    ready = MP.Queue()
    snap = lab.start("sub", join, deployment.for_host("sub"), deployment.replay, "snapshot", ready)
    full = lab.start("sub2", join, deployment.for_host("sub2"), deployment.replay, "earliest", ready)
    at_history = {}
    for _ in range(2):
        start, view, summary, took = ready.get(timeout=WAIT_S)
        at_history[start] = (view, summary, took)
    want = model(HISTORY)
    assert len(want) > KEYS // 2  # deletes and expiries removed some keys, not most
    assert at_history["snapshot"][0] == want
    assert at_history["earliest"][0] == want
    # The snapshot joiner got about one record per live key, not a million.
    assert at_history["snapshot"][1]["from_snapshot"] <= KEYS
    assert at_history["earliest"][1]["from_replay"] + at_history["earliest"][1]["from_live"] >= HISTORY

    assert lab.run("pub", publish, deployment.ingest, HISTORY, LIVE, 20_000.0, timeout=WAIT_S) == HISTORY + LIVE
    got = {"snapshot": snap.result(timeout=WAIT_S), "earliest": full.result(timeout=WAIT_S)}
    expected_live = [
        (HISTORY + 1 + i, key, body, round(ttl * 1000) if ttl else 0)
        for i, (key, body, ttl) in ((i, record(HISTORY + i)) for i in range(LIVE))
    ]
    assert got["snapshot"]["live"] == expected_live
    assert got["earliest"]["live"] == expected_live
    assert got["snapshot"]["view"] == got["earliest"]["view"] == model(HISTORY + LIVE)
    assert got["snapshot"]["state"] == got["earliest"]["state"] == "MERGED"
    print(
        f"published {HISTORY:,} in {published - began:.1f} s; current after {at_history['snapshot'][2]:.1f} s "
        f"by snapshot, {at_history['earliest'][2]:.1f} s by full replay; snapshot joiner: "
        f"{got['snapshot']['summary']}; full replayer: {got['earliest']['summary']}"
    )
