"""A real etcd for tests: one member on loopback, free ports, its own data directory, LAN-fast timers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from support.servers import free_port

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class EtcdProcess:
    """`etcd` started by the test (Debian's etcd-server), stopped by its pid; restartable on the same ports."""

    def __init__(self, data_dir: Path, *, heartbeat_ms: int = 10, election_ms: int = 100) -> None:
        self.data_dir = data_dir
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.argv = [
            ETCD, "--name", "test", "--data-dir", str(data_dir / "etcd"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"test={peer}",
            "--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_ms),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> EtcdProcess:
        log = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.data_dir / 'etcd.log'}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=0.5) as resp:
                    if b'"true"' in resp.read():
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become healthy in {timeout_s} s; see {self.data_dir / 'etcd.log'}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
