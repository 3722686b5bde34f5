"""A gateway and its replay sidecar as real processes on one host of a netlab LAN (demo and tests).

Both are started with `python -m gateway.cli`, restartable (kill -9 included), and stopped with SIGTERM.
Multicast feeds get distinct ports: on Linux a socket bound to a port receives every group joined on that
port, and OpenPGM then accepts the other feed's packets too, so A and B on one port would cross-talk.
With `Keys`, the deployment is secured: multicast signed with a stream key, CURVE on ingest and replay.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq

from gateway.transport.curve import CurveClientKeys, create_curve_certificates
from gateway.wire import protocol as P
from gateway.wire.streamkey import StreamKey
from netlab import Lab


@dataclass(frozen=True)
class Keys:
    """A stream key and CURVE key pairs (the servers', one allowed client's) in one directory."""

    dir: Path

    @classmethod
    def create(cls, directory: Path) -> Keys:
        keys = cls(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        StreamKey.generate().save(keys.stream_key_file)
        create_curve_certificates(directory / "server")
        public, _ = create_curve_certificates(directory / "client")
        (directory / "allow").mkdir(mode=0o700)
        shutil.copy(public, directory / "allow")
        return keys

    @property
    def stream_key_file(self) -> Path:
        return self.dir / "stream.key"

    def server_args(self) -> list[str]:
        return ["--curve-secret", str(self.dir / "server.key_secret"), "--curve-allow", str(self.dir / "allow")]

    def stream_key(self) -> StreamKey:
        return StreamKey.load(self.stream_key_file)

    def client(self) -> CurveClientKeys:
        return CurveClientKeys.load(self.dir / "client.key_secret", self.dir / "server.key")


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
        gateway_args: Sequence[str] = (),
        keys: Keys | None = None,
    ) -> None:
        self.lab = lab
        self.gateway_args = list(gateway_args)  # more `zeps gateway` options
        self.keys = keys
        self.curve = keys.client() if keys else None  # what clients of this deployment need
        self.journal = journal
        self.stream = stream
        self.host = host
        gw = lab.host(host)
        self.ingest = f"tcp://{gw.ip}:5570"
        self.replay = f"tcp://{gw.ip}:5580"
        self.multicast = [f"{transport}://{gw.ip};{lab.group(n)}:{5554 + n}" for n in range(1, feeds + 1)]
        self.gateway: subprocess.Popen | None = None
        self.sidecar: subprocess.Popen | None = None
        self.stderr: dict[str, str] = {}  # what each one wrote to stderr, once closed
        self.start_gateway()
        self.start_replay()

    @property
    def gateway_pid(self) -> int:
        """The gateway's pid (it is started on construction)."""
        assert self.gateway is not None
        return self.gateway.pid

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
        if self.keys:
            args += ["--stream-key", str(self.keys.stream_key_file), *self.keys.server_args()]
        self.gateway = self._zeps(*args, *self.gateway_args)
        self._wait_ping(self.ingest, self.gateway)

    def start_replay(self) -> None:
        secured = [*self.keys.server_args(), "--stream-key", str(self.keys.stream_key_file)] if self.keys else []
        self.sidecar = self._zeps("replay", "--journal", str(self.journal), "--bind", self.replay, *secured)
        self._wait_ping(self.replay, self.sidecar)

    def kill9(self, which: str) -> None:
        proc = self.gateway if which == "gateway" else self.sidecar
        assert proc is not None
        proc.kill()
        proc.wait(10)

    def _wait_ping(self, endpoint: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
        self.lab.run(self.host, wait_ping, endpoint, timeout, self.curve, timeout=timeout + 5)
        assert proc.poll() is None, proc.communicate()[1]

    def close(self) -> list[str]:
        """Stop both with SIGTERM; return the stderr of any that did not exit cleanly (`stderr` keeps each one's)."""
        problems = []
        for name, proc in (("gateway", self.gateway), ("sidecar", self.sidecar)):
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            self.stderr[name] = err
            if proc.returncode not in (0, -signal.SIGKILL):
                problems.append(f"exit {proc.returncode}: {err}")
        return problems


def wait_ping(endpoint: str, timeout: float, curve: CurveClientKeys | None = None) -> None:
    """Inside a lab host: until a ZEPS server at `endpoint` answers PING."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(sock)
        sock.connect(endpoint)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.send(P.encode(P.Ping()))
            if sock.poll(200):
                P.decode(sock.recv())
                return
        raise TimeoutError(f"nothing answered PING at {endpoint} within {timeout} s")
