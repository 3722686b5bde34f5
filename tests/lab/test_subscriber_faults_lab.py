"""The subscriber keeps its multicast feed drained whatever happens around it: real gateway, sidecar and epgm
between lab hosts. libzmq 4.3.4 aborts a process whose PGM SUB pipe fills (docs/client.md); these are the two
ways that happened: junk on the group while the subscriber could not get its sidecar, and an application
that stops reading at a high rate. Every record must still arrive once, in order, and nothing may crash.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from support.feedlab import STREAM, WAIT_S, _Tally, check_all, deploy, publish

from gateway.client.subscriber import Subscriber
from gateway.errors import DataLoss
from gateway.mcast import Endpoint, Tuning, open_pub
from gateway.tools.deployment import Deployment
from netlab.procs import MP

pytestmark = pytest.mark.lab


@pytest.fixture
def deployment(make_lab, tmp_path: Path):
    lab = make_lab(["pub", "gw", "sub", "rogue"])
    dep = deploy(lab, tmp_path)
    yield dep
    assert not dep.close()


def flood_junk(endpoint: str, seconds: float, rate: float, size: int = 1000) -> int:
    """In a lab host: messages of `size` random bytes under the stream's name (so every subscriber's SUB takes
    them in) on the feed's group, at `rate` a second for `seconds`; returns how many. Small messages travel
    many to a PGM packet: what makes libzmq's receiver abort when its pipe is full."""
    sent = 0
    with zmq.Context() as ctx:
        pub = open_pub(ctx, Endpoint.parse(endpoint), Tuning())
        try:
            start = time.monotonic()
            while (elapsed := time.monotonic() - start) < seconds:
                pub.send_multipart([STREAM.encode(), os.urandom(size)])
                sent += 1
                time.sleep(max(0.0, sent / rate - elapsed))
        finally:
            pub.close()
    return sent


def subscribe_pausing(
    multicast: list[str],
    replay: str,
    start: Any,
    until: int,
    ready: Any,
    pause_after: int,
    pause_s: float,
    **options: Any,
) -> dict[str, Any]:
    """A Subscriber (with `options`) that stops calling for `pause_s` seconds once it has `pause_after` records."""
    tally = _Tally(until)
    paused = False
    with Subscriber(STREAM, multicast=multicast, replay=replay, start=start, progress_timeout=1.0, **options) as sub:
        ready.put("up")
        while tally.running():
            if not paused and len(tally.got) >= pause_after:
                paused = True
                time.sleep(pause_s)  # the application is busy elsewhere; the feed keeps coming
            try:
                tally.take(sub.next(timeout=0.5))
            except DataLoss as exc:
                tally.losses.append((exc.lo, exc.hi))
        return tally.result(sub)


def test_sidecar_down_10s_at_start_with_junk_flooding_the_group(deployment: Deployment) -> None:
    lab = deployment.lab
    deployment.kill9("replay")
    ready = MP.Queue()
    sub = lab.start("sub", functools.partial(subscribe_pausing, pause_after=10**9, pause_s=0),
                    deployment.for_host("sub"), deployment.replay, "earliest", 20_000, ready)  # fmt: skip
    ready.get(timeout=WAIT_S)
    junk = lab.start("rogue", flood_junk, deployment.for_host("rogue")[0], 10.0, 2000.0)
    lab.run("pub", publish, deployment.ingest, 0, 20_000, 2_000.0, timeout=WAIT_S)
    assert junk.result(timeout=WAIT_S) > 5_000
    deployment.start_replay()
    result = sub.result(timeout=WAIT_S)
    check_all(result, 20_000)
    assert result["summary"]["rejected_packets"] > 1_000, result["summary"]
    assert result["summary"]["replay_retries"] > 0, result["summary"]


def test_an_application_that_stops_reading_for_10s_at_a_high_rate(deployment: Deployment) -> None:
    lab = deployment.lab
    ready = MP.Queue()
    count = 600_000
    # A small queue (8 MiB), so that it overflows during the pause: what it drops must come from replay.
    pausing = functools.partial(subscribe_pausing, pause_after=1, pause_s=10.0, buffer_limit_bytes=8 << 20)
    sub = lab.start("sub", pausing, deployment.for_host("sub"), deployment.replay, "earliest", count, ready)
    ready.get(timeout=WAIT_S)
    junk = lab.start("rogue", flood_junk, deployment.for_host("rogue")[0], 10.0, 20_000.0, 20)
    began = time.monotonic()
    assert lab.run("pub", publish, deployment.ingest, 0, count, 100_000.0, timeout=WAIT_S) == count
    assert junk.result(timeout=WAIT_S) > 5_000
    publishing_s = time.monotonic() - began
    result = sub.result(timeout=WAIT_S)
    check_all(result, count)
    summary = result["summary"]
    assert summary["feed_dropped"] > 0 and summary["from_replay"] > 0, (publishing_s, summary)


def test_a_pgm_feed_left_unread_never_aborts_the_process(deployment: Deployment) -> None:
    """No drain at all, the application away for 5 s at 100,000 records/s with small junk flooding the group:
    libzmq's PGM receiver aborted the process when its pipe filled (pgm_receiver.cpp:131). The SUB's pipe has
    no high-water mark (gateway.mcast), so it cannot fill: the backlog waits there, and all of it arrives."""
    lab = deployment.lab
    ready = MP.Queue()
    count = 400_000
    pausing = functools.partial(subscribe_pausing, pause_after=1, pause_s=5.0, drain=False)
    sub = lab.start("sub", pausing, deployment.for_host("sub"), deployment.replay, "earliest", count, ready)
    ready.get(timeout=WAIT_S)
    junk = lab.start("rogue", flood_junk, deployment.for_host("rogue")[0], 5.0, 20_000.0, 20)
    assert lab.run("pub", publish, deployment.ingest, 0, count, 100_000.0, timeout=WAIT_S) == count
    assert junk.result(timeout=WAIT_S) > 5_000
    check_all(sub.result(timeout=WAIT_S), count)
