"""Discovery in a namespace lab: clients that name a stream and their interface, and nothing else.

Real processes: on "gw" a gateway serving two streams, each on a channel (udp group) of its own, signing with a
stream key, and a replay sidecar that announces itself; publishers and subscribers on other hosts find the
ingest, the channels and the sidecar from the announcements alone. A rogue host's announcements are ignored by
keyed clients; a sidecar that moves to another host is followed.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from support.discoverylab import (
    IF,
    WAIT_S,
    bodies,
    listen,
    publish_by_name,
    rogue,
    start_gateway,
    start_sidecar,
    streams_on,
    subscribe_by_name,
    zeps,
)

from gateway.wire import announce as A
from gateway.wire.streamkey import StreamKey
from netlab.procs import MP

pytestmark = pytest.mark.lab

COUNT = 2_000


def _stop(*procs) -> list[str]:
    problems = []
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        if proc.returncode != 0:
            problems.append(f"exit {proc.returncode}: {err}")
    return problems


@pytest.mark.parametrize("transport", ["udp", "epgm"])
def test_a_subscriber_names_one_stream_and_joins_only_its_group(make_lab, tmp_path: Path, transport: str) -> None:
    lab = make_lab(["gw", "pub", "sub"])
    key = StreamKey.generate()
    key.save(tmp_path / "stream.key")
    px, tr = f"{lab.group(11)}:5011", f"{lab.group(12)}:5012"
    gateway = start_gateway(lab, tmp_path / "journal", tmp_path / "stream.key", {"px": px, "tr": tr}, transport)
    sidecar, replay = start_sidecar(lab, "gw", tmp_path / "journal", tmp_path / "stream.key", 5580)
    try:
        ready = MP.Queue()
        sub = lab.start("sub", subscribe_by_name, "px", COUNT, key, ready)
        raw = lab.start(
            "pub", streams_on, f"{transport}://{px}", 8.0, ready
        )  # every message on px's channel, whatever its stream
        ready.get(timeout=WAIT_S)
        ready.get(timeout=WAIT_S)
        assert lab.run("pub", publish_by_name, "px", 1, COUNT, key, timeout=WAIT_S) == COUNT
        assert lab.run("pub", publish_by_name, "tr", 1, 500, key, timeout=WAIT_S) == 500
        got = sub.result(WAIT_S + 30)
        on_px = raw.result(WAIT_S)
        listing = zeps(lab, "sub", "streams", "--interface", IF, "--json", "--stream-key", str(tmp_path / "stream.key"))
        out, err = listing.communicate(timeout=30)
    finally:
        problems = _stop(gateway, sidecar)
    assert got["records"] == bodies("px", 1, COUNT), "\n".join(got["log"])
    assert not got["losses"]
    assert got["replay"] == replay
    assert set(on_px) == {"px"} and on_px["px"] > 0, on_px  # the gateway sends tr only on tr's channel
    joined = got["maddr"]
    assert lab.group(11) in joined and A.DISCOVERY_GROUP in joined
    assert lab.group(12) not in joined, joined  # tr's group: never joined, so IGMP snooping can keep it away
    rows = {row["stream"]: row for row in map(json.loads, out.splitlines())}
    assert listing.returncode == 0, err
    assert sorted(rows) == ["px", "tr"]
    assert rows["px"]["channels"] == [f"{transport}://{px}"] and rows["tr"]["channels"] == [f"{transport}://{tr}"]
    assert rows["px"]["sidecar"] == replay
    assert rows["px"]["ingest"] == f"tcp://{lab.host('gw').ip}:5570"
    assert rows["px"]["head"] == COUNT and rows["tr"]["head"] == 500
    assert "gateway gw" in rows["px"]["nodes"] and "sidecar gw" in rows["px"]["nodes"]
    assert not problems, problems


def test_a_rogue_announcement_is_ignored_with_a_stream_key(make_lab, tmp_path: Path) -> None:
    lab = make_lab(["gw", "sub", "rogue"])
    key = StreamKey.generate()
    key.save(tmp_path / "stream.key")
    gateway = start_gateway(lab, tmp_path / "journal", tmp_path / "stream.key", {"px": f"{lab.group(11)}:5011"})
    sidecar, replay = start_sidecar(lab, "gw", tmp_path / "journal", tmp_path / "stream.key", 5580)
    evil = f"tcp://{lab.host('rogue').ip}:5580"
    try:
        attack = lab.start("rogue", rogue, evil, lab.group(99), StreamKey.generate(), 5.0)
        keyed = lab.start("sub", listen, key, 3.0)
        plain = lab.start("sub", listen, None, 3.0)
        keyed_view, plain_view = keyed.result(30), plain.result(30)
        assert attack.result(30) > 0
    finally:
        problems = _stop(gateway, sidecar)
    # Without the key the rogue is heard (so it did reach the subscriber's host) ...
    assert evil in plain_view["streams"]["px"]["named"]
    # ... with it, only the gateway and its sidecar count; the rest is counted and dropped.
    channels = [f"udp://{lab.group(11)}:5011"]
    assert keyed_view["streams"]["px"] == {"sidecars": (replay,), "named": (replay,), "channels": channels}
    assert keyed_view["dropped"].get("unsigned", 0) > 0 and keyed_view["dropped"].get("unknown-key", 0) > 0
    assert keyed_view["dropped"].get("malformed", 0) > 0
    assert not problems, problems


@pytest.mark.parametrize("stop", ["sigterm", "kill"])
def test_subscribers_follow_a_sidecar_that_moves(make_lab, tmp_path: Path, stop: str) -> None:
    """A subscriber losing one datagram in five fills the holes from the sidecar over a connection that stays
    open. The sidecar is stopped (its clients are told) or killed (a connection to it never fails by itself: the
    subscriber leaves it once it is no longer announced) and restarted on another host: the next holes are
    filled from there."""
    lab = make_lab(["gw", "pub", "sub", "spare"])
    key = StreamKey.generate()
    key.save(tmp_path / "stream.key")
    journal, keyfile = tmp_path / "journal", tmp_path / "stream.key"
    port = 5011
    gateway = start_gateway(lab, journal, keyfile, {"px": f"{lab.group(11)}:{port}"})
    sidecar, first_at = start_sidecar(lab, "gw", journal, keyfile, 5580)
    loss = f"INPUT -p udp --dport {port} -m statistic --mode nth --every 5 --packet 0 -j DROP".split()
    moved = None

    def lossy(first: int, last: int) -> None:
        assert lab.popen("sub", ["iptables", "-I", *loss]).wait(10) == 0
        lab.run("pub", publish_by_name, "px", first, last, key, timeout=WAIT_S)
        assert lab.popen("sub", ["iptables", "-D", *loss]).wait(10) == 0

    try:
        ready = MP.Queue()
        sub = lab.start("sub", subscribe_by_name, "px", COUNT, key, ready, 100)
        ready.get(timeout=WAIT_S)
        lab.run("pub", publish_by_name, "px", 1, 100, key, timeout=WAIT_S)
        ready.get(timeout=WAIT_S)  # caught up; MERGED with the next heartbeat
        time.sleep(0.5)
        lossy(101, COUNT // 2)  # holes filled by the first sidecar
        if stop == "kill":
            sidecar.kill()
            sidecar.communicate(timeout=30)
        else:
            assert not _stop(sidecar)
        moved, moved_at = start_sidecar(lab, "spare", journal, keyfile, 5590)
        lossy(COUNT // 2 + 1, COUNT)  # holes filled by the moved one
        got = sub.result(WAIT_S + 30)
    finally:
        problems = _stop(gateway, *([moved] if moved else []))
    assert got["records"] == bodies("px", 1, COUNT), "\n".join(got["log"])
    assert not got["losses"]
    assert got["summary"]["from_replay"] > 0, got["summary"]
    assert got["replay"] == moved_at != first_at
    assert got["reconnects"] >= 1, "\n".join(got["log"])  # it left the first sidecar
    assert not problems, problems
