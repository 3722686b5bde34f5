"""A gateway and its replay sidecar as real processes on one host of a netlab LAN (demo and tests).

Both are started with `python -m gateway.cli`, restartable (kill -9 included), and stopped with SIGTERM.
Multicast feeds get distinct ports: on Linux a socket bound to a port receives every group joined on that
port, and OpenPGM then accepts the other feed's packets too, so A and B on one port would cross-talk.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import zmq

from gateway import protocol as P
from netlab import Lab


class Deployment:
    """`zeps gateway` and `zeps replay` as processes on one lab host, restartable, stopped by `close()`."""

    def __init__(
        self,
        lab: Lab,
        journal: Path,
        stream: str,
        *,
        feeds: int = 1,
        transport: str = "epgm",
        host: str = "gw",
        options: Sequence[str] = (),
    ) -> None:
        """`options`: more `zeps gateway` options, e.g. ("--rate-kbps", "500000")."""
        self.lab = lab
        self.journal = journal
        self.stream = stream
        self.host = host
        self.options = list(options)
        gw = lab.host(host)
        self.ingest = f"tcp://{gw.ip}:5570"
        self.replay = f"tcp://{gw.ip}:5580"
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
        return self.lab.popen(self.host, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def start_gateway(self) -> None:
        args = ["gateway", "--stream", self.stream, "--journal", str(self.journal), "--ingest", self.ingest,
                "--replay-endpoint", self.replay, "--heartbeat-ms", "50"]  # fmt: skip
        for ep in self.multicast:
            args += ["--multicast", ep]
        self.gateway = self._zeps(*args, *self.options)
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
        self.lab.run(self.host, wait_ping, endpoint, timeout, timeout=timeout + 5)
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
