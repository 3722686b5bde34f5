"""Discovery in a namespace lab: a gateway with a channel per stream, sidecars that announce, clients that name
a stream and an interface and nothing else. Functions run in lab hosts are module-level (Lab.start pickles them).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gateway.client.directory import LanDirectory, StreamInfo
from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import DataLoss
from gateway.mcast import address_of
from gateway.tools.deployment import wait_ping
from gateway.wire import announce as A
from gateway.wire.streamkey import StreamKey
from netlab import Lab

IF = "lab0"  # every lab host's interface
WAIT_S = 60.0
BODY = 64


def zeps(lab: Lab, host: str, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "gateway.cli", *args]
    return lab.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_gateway(
    lab: Lab, journal: Path, key: Path, channels: dict[str, str], transport: str = "udp"
) -> subprocess.Popen:
    """`zeps gateway` on "gw" serving the streams of `channels` (stream -> GROUP:PORT), each on its own."""
    gw = lab.host("gw")
    args = ["gateway", "--journal", str(journal), "--ingest", "tcp://*:5570", "--stream-key", str(key),
            "--replay-endpoint", f"tcp://{gw.ip}:5580", "--heartbeat-ms", "50", "--node", "gw"]  # fmt: skip
    for stream, where in channels.items():
        args += ["--stream", stream, "--multicast", f"{stream}={transport}://{IF};{where}"]
    proc = zeps(lab, "gw", *args)
    lab.run("gw", wait_ping, f"tcp://{gw.ip}:5570", 30.0)
    return proc


def start_sidecar(lab: Lab, host: str, journal: Path, key: Path, port: int) -> tuple[subprocess.Popen, str]:
    """`zeps replay` on `host`, announcing itself; (process, endpoint)."""
    endpoint = f"tcp://{lab.host(host).ip}:{port}"
    proc = zeps(lab, host, "replay", "--journal", str(journal), "--bind", endpoint, "--announce-interface", IF,
                "--stream-key", str(key), "--node", host)  # fmt: skip
    lab.run(host, wait_ping, endpoint, 30.0)
    return proc, endpoint


def bodies(stream: str, first: int, last: int) -> list[tuple[int, bytes]]:
    return [(i, f"{stream}-{i:08d}".encode().ljust(BODY, b".")) for i in range(first, last + 1)]


def publish_by_name(stream: str, first: int, last: int, key: StreamKey) -> int | None:
    """Publish records first..last of `stream`, finding its ingest by name; the last sequence confirmed."""
    with Publisher(None, stream, interface=IF, stream_key=key, confirm=True, timeout=WAIT_S) as pub:
        for _, body in bodies(stream, first, last):
            pub.publish("k", body)
        return pub.flush()


def subscribe_by_name(stream: str, until: int, key: StreamKey, ready: Any, milestone: int = 0) -> dict[str, Any]:
    """A Subscriber given only the stream and the interface, from the earliest record until `until`: what it
    delivered, the groups its host had joined meanwhile (`ip maddr`), and the replay endpoint it ended with.
    It says "up" on `ready` once running, and the state it is in once it has delivered `milestone`."""
    got: list[tuple[int, bytes]] = []
    losses: list[tuple[int, int]] = []
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("gateway").addHandler(handler)
    logging.getLogger("gateway").setLevel(logging.INFO)
    with Subscriber(stream, interface=IF, stream_key=key, start="earliest", progress_timeout=1.0) as sub:
        maddr = subprocess.run(["ip", "maddr", "show", "dev", IF], capture_output=True, text=True, check=True).stdout
        ready.put("up")
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and (not got or got[-1][0] < until):
            try:
                rec = sub.next(timeout=0.5)
            except DataLoss as exc:
                losses.append((exc.lo, exc.hi))
                continue
            if rec is not None:
                got.append((rec.seq, rec.body))
                if rec.seq == milestone:
                    ready.put(sub.state)
        return {"records": got, "losses": losses, "maddr": maddr, "replay": sub.replay_endpoint,
                "summary": sub.summary(), "reconnects": sub.stats.replay_reconnects, "log": said}  # fmt: skip


def streams_on(channel: str, seconds: float, ready: Any) -> dict[str, int]:
    """Messages per stream name on `channel` (TRANSPORT://GROUP:PORT) for `seconds`, whatever the stream."""
    import zmq

    from gateway.mcast import Endpoint, Tuning, open_sub

    transport, where = channel.split("://")
    endpoint = Endpoint.parse(f"{transport}://{address_of(IF)};{where}")
    seen: dict[str, int] = {}
    with zmq.Context() as ctx, open_sub(ctx, endpoint, Tuning(), [""]) as sock:  # every stream
        ready.put("up")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if sock.poll(100):
                name = bytes(sock.recv_multipart()[0]).decode()
                seen[name] = seen.get(name, 0) + 1
    return seen


def listen(key: StreamKey | None, seconds: float) -> dict[str, Any]:
    """What a LAN directory (with or without the key) makes of `seconds` of announcements."""
    with LanDirectory(IF, keys=[key] if key else []) as directory:
        infos = directory.listen(seconds)
        return {
            "streams": {i.name: _view(i) for i in infos},
            "dropped": dict(directory.dropped),
        }


def _view(info: StreamInfo) -> dict[str, Any]:
    return {"sidecars": info.sidecars, "named": info.named, "channels": [str(c) for c in info.channels]}


def rogue(sidecar: str, group: str, forger: StreamKey, seconds: float) -> int:
    """Announce stream "px" with a rogue sidecar and channel: unsigned, and signed with a key of the rogue's own,
    plus junk on the discovery port; returns the datagrams sent."""
    fake = A.Announcement(A.GATEWAY, 0x0BAD, "rogue", (A.StreamAd("px", 10**9, 0, (A.Channel("udp", group, 6000),)),),
                          ingest=sidecar, sidecar=sidecar, sent_ns=time.time_ns())  # fmt: skip
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(address_of(IF)))
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for data in (fake.encode(), fake.encode(forger), b"ZD\x01junk", b"\xff" * 40):
            sock.sendto(data, (A.DISCOVERY_GROUP, A.DISCOVERY_PORT))
            sent += 1
        time.sleep(0.05)
    sock.close()
    return sent
