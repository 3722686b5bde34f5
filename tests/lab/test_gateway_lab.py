"""The gateway in a namespace lab: publisher host -> gateway host -> two subscriber hosts, over epgm and norm.

Every record must arrive at both subscribers, checked by sequence and content. The subscribers here read the
raw multicast (no replay), so this proves the gateway's own path: batching, journaling, multicast, heartbeats.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from gateway.client.publisher import Publisher
from gateway.journal import JournalReader, verify_root
from gateway.mcast import Endpoint, Tuning, open_sub
from gateway.tools.load import generated
from gateway.wire.batch import Batch
from gateway.wire.heartbeat import Heartbeat, parse_payload
from netlab import Lab
from netlab.procs import MP

pytestmark = pytest.mark.lab

STREAM = "md.test"
COUNT = 20_000
WAIT_S = 60.0


def subscribe(endpoint: str, count: int, ready: Any) -> dict[str, Any]:
    """Collect (seq, key, body) from the multicast until `count` records or the deadline; heartbeats counted."""
    with zmq.Context() as ctx, open_sub(ctx, Endpoint.parse(endpoint), Tuning(), [STREAM]) as sock:
        records: list[tuple[int, bytes, bytes]] = []
        heads: list[int] = []
        deadline = time.monotonic() + WAIT_S
        while len(records) < count and time.monotonic() < deadline:
            if not sock.poll(100):
                continue
            name, payload = sock.recv_multipart()
            assert name == STREAM.encode()
            item = parse_payload(payload)
            if isinstance(item, Heartbeat):
                if not heads:
                    ready.put(endpoint)
                heads.append(item.head)
            else:
                assert isinstance(item, Batch)
                records.extend((seq, k.tobytes(), v.tobytes()) for seq, _, k, v in item.raw())
        # Stay for a few heartbeats: the head must then announce the last record.
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            if sock.poll(50):
                item = parse_payload(sock.recv_multipart()[1])
                if isinstance(item, Heartbeat):
                    heads.append(item.head)
        return {"records": records, "heads": heads}


def publish(ingest: str, count: int, rate: float) -> int | None:
    with Publisher(ingest, STREAM, confirm=True, timeout=WAIT_S) as pub:
        for key, body in generated(count, 100, 100, rate):
            pub.publish(key, body)
        return pub.flush()


def start_gateway(lab: Lab, journal: Path, multicast: str, extra: list[str]) -> subprocess.Popen:
    gw = lab.host("gw")
    argv = [
        sys.executable,
        "-m",
        "gateway.cli",
        "gateway",
        "--stream",
        STREAM,
        "--journal",
        str(journal),
        "--ingest",
        f"tcp://{gw.ip}:5570",
        "--multicast",
        multicast,
        "--heartbeat-ms",
        "50",
        *extra,
    ]
    return lab.popen(gw, argv, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(
    ("transport", "rate", "extra"),
    [
        ("epgm", 0.0, ["--rate-kbps", "100000"]),
        # NORM goes through libnorm at a fixed rate with backpressure (docs/norm.md): an unpaced burst is fine.
        ("norm", 0.0, ["--rate-kbps", "100000"]),
        # udp:// cuts batches into datagrams and paces them; whatever a receiver drops, replay fills.
        ("udp", 0.0, ["--rate-kbps", "100000"]),
    ],
)
def test_every_record_reaches_both_subscribers(make_lab, tmp_path: Path, transport, rate, extra) -> None:
    lab = make_lab(["pub", "gw", "sub1", "sub2"])
    gw = lab.host("gw")
    group = f"{lab.group(1)}:5555"
    proc = start_gateway(lab, tmp_path, f"{transport}://{gw.ifname};{group}", extra)
    try:
        ready = MP.Queue()
        subs = [
            lab.start(h, subscribe, f"{transport}://{lab.host(h).ip};{group}", COUNT, ready) for h in ("sub1", "sub2")
        ]
        for _ in subs:
            ready.get(timeout=WAIT_S)  # both hear heartbeats: they are joined before the first record
        last = lab.run("pub", publish, f"tcp://{gw.ip}:5570", COUNT, rate, timeout=WAIT_S)
        assert last == COUNT
        expected = [(i + 1, key.encode(), body) for i, (key, body) in enumerate(generated(COUNT, 100, 100, 0))]
        for sub in subs:
            got = sub.result(timeout=WAIT_S)
            assert len(got["records"]) == COUNT
            for want, have in zip(expected, got["records"], strict=True):
                assert have == want
            assert got["heads"][-1] == COUNT
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert JournalReader(tmp_path, STREAM).last_seq == COUNT
    assert verify_root(tmp_path).clean
