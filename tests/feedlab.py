"""A whole deployment in a namespace lab, for end-to-end tests: gateway and replay sidecar on host "gw",
publishers and subscribers on other hosts, all real processes. Functions run in lab hosts are module-level so
that `Lab.start` can pickle them by reference.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from gateway import protocol as P
from gateway.commands.publish import generated
from gateway.publisher import Publisher
from gateway.subscriber import DataLoss, Subscriber
from netlab import Lab

STREAM = "feed"
WAIT_S = 90.0
BODY = 100
KEYS = 100


def expected(first: int, last: int) -> list[tuple[int, bytes]]:
    """(seq, body) the generator publishes for sequences first..last of a fresh journal."""
    bodies = generated(last, BODY, KEYS, 0)
    return [(i + 1, body) for i, (_, body) in enumerate(bodies) if i + 1 >= first]


def publish(ingest: str, skip: int, count: int, rate: float) -> int | None:
    """Publish records skip..skip+count-1 of the generated load (confirmed); returns the last sequence."""
    with Publisher(ingest, STREAM, confirm=True, timeout=WAIT_S, batch_records=100) as pub:
        for i, (key, body) in enumerate(generated(skip + count, BODY, KEYS, 0)):
            if i < skip:
                continue
            pub.publish(key, body)
            if rate and i % 100 == 99:
                time.sleep(100 / rate)
        return pub.flush()


def subscribe(multicast: list[str], replay: str, start: Any, until: int, ready: Any = None) -> dict[str, Any]:
    """Run a Subscriber until sequence `until` is delivered; returns (seq, body) pairs and the summary."""
    got: list[tuple[int, bytes]] = []
    losses: list[tuple[int, int]] = []
    sources: dict[str, int] = {}
    with Subscriber(STREAM, multicast=multicast, replay=replay, start=start, progress_timeout=1.0) as sub:
        if ready is not None:
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
                sources[rec.source] = sources.get(rec.source, 0) + 1
        return {"records": got, "losses": losses, "sources": sources, "summary": sub.summary(), "state": sub.state}


class Deployment:
    """`zeps gateway` and `zeps replay` as processes on host "gw", restartable, stopped by `close()`."""

    def __init__(self, lab: Lab, journal: Path, feeds: int = 1, transport: str = "epgm") -> None:
        self.lab = lab
        self.journal = journal
        gw = lab.host("gw")
        self.ingest = f"tcp://{gw.ip}:5570"
        self.replay = f"tcp://{gw.ip}:5580"
        # Distinct ports per feed: on Linux a socket bound to a port receives every group joined on it, and
        # OpenPGM then accepts the other feed's packets too (A and B on one port cross-talk).
        self.multicast = [f"{transport}://{gw.ip};{lab.group(n)}:{5554 + n}" for n in range(1, feeds + 1)]
        self.gateway: subprocess.Popen | None = None
        self.sidecar: subprocess.Popen | None = None
        self.start_gateway()
        self.start_replay()

    def for_host(self, host: str) -> list[str]:
        """The multicast endpoints as a subscriber on `host` names them (its own interface address)."""
        ip = self.lab.host(host).ip
        return [f"{ep.split('://')[0]}://{ip};{ep.split(';')[1]}" for ep in self.multicast]

    def _zeps(self, *args: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "gateway.cli", *args]
        return self.lab.popen("gw", argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def start_gateway(self) -> None:
        args = ["gateway", "--stream", STREAM, "--journal", str(self.journal), "--ingest", self.ingest,
                "--replay-endpoint", self.replay, "--heartbeat-ms", "50"]  # fmt: skip
        for ep in self.multicast:
            args += ["--multicast", ep]
        self.gateway = self._zeps(*args)
        self._wait_ping(self.ingest, self.gateway)

    def start_replay(self) -> None:
        self.sidecar = self._zeps("replay", "--journal", str(self.journal), "--bind", self.replay)
        self._wait_ping(self.replay, self.sidecar)

    def kill9(self, which: str) -> None:
        proc = self.gateway if which == "gateway" else self.sidecar
        assert proc is not None
        proc.kill()
        proc.wait(10)

    def _wait_ping(self, endpoint: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
        self.lab.run("gw", wait_ping, endpoint, timeout, timeout=timeout + 5)
        assert proc.poll() is None, proc.communicate()[1]

    def close(self) -> list[str]:
        """Stop both with SIGTERM; return the stderr of any that did not exit cleanly."""
        problems = []
        for proc in (self.gateway, self.sidecar):
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode not in (0, -signal.SIGKILL):
                problems.append(f"exit {proc.returncode}: {err}")
        return problems


def wait_ping(endpoint: str, timeout: float) -> None:
    """Inside a lab host: until a ZEPS server at `endpoint` answers PING."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.send(P.encode(P.Ping()))
            if sock.poll(200):
                P.decode(sock.recv())
                return
        raise TimeoutError(f"nothing answered PING at {endpoint} within {timeout} s")
