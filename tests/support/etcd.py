"""A real etcd for tests: one member on loopback, free ports, its own data directory, LAN-fast timers; or a
cluster of three as users run it, with TLS on client and peer URLs and client-certificate auth."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from support.certs import Certs
from support.servers import free_port

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class EtcdProcess:
    """`etcd` started by the test (Debian's etcd-server), stopped by its pid; restartable on the same ports."""

    def __init__(
        self,
        data_dir: Path,
        *,
        heartbeat_ms: int = 10,
        election_ms: int = 100,
        name: str = "test",
        certs: Certs | None = None,
        cluster: dict[str, int] | None = None,
    ) -> None:
        """`certs`: TLS on both URLs, clients and peers with a certificate of its CA (member `name`'s own);
        `cluster`: every member's name and peer port, this one's among them (default: this one alone)."""
        self.data_dir, self.name, self.certs = data_dir, name, certs
        scheme = "https" if certs is not None else "http"
        self.client_port = free_port()
        self.peer_port = cluster[name] if cluster is not None else free_port()
        peers = {m: f"{scheme}://127.0.0.1:{port}" for m, port in (cluster or {name: self.peer_port}).items()}
        self.url = f"{scheme}://127.0.0.1:{self.client_port}"
        self.argv = [
            ETCD, "--name", name, "--data-dir", str(data_dir / ("etcd" if name == "test" else f"etcd-{name}")),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peers[name], "--initial-advertise-peer-urls", peers[name],
            "--initial-cluster", ",".join(f"{m}={u}" for m, u in peers.items()),
            "--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_ms),
        ]  # fmt: skip
        if certs is not None:
            files = ["--cert-file", str(certs.cert(name)), "--key-file", str(certs.key(name)),
                     "--trusted-ca-file", str(certs.ca), "--client-cert-auth"]  # fmt: skip
            self.argv += [*files, *(f.replace("--", "--peer-", 1) if f.startswith("--") else f for f in files)]
        self.proc: subprocess.Popen[bytes] | None = None

    def _ask(self, path: str, body: bytes | None = None) -> bytes:
        """An HTTP request to this member (as a client of the cluster's CA, when it has TLS)."""
        ctx = None
        if self.certs is not None:
            ctx = ssl.create_default_context(cafile=self.certs.ca)
            ctx.load_cert_chain(self.certs.cert(self.name), self.certs.key(self.name))
        with urllib.request.urlopen(f"{self.url}{path}", data=body, timeout=0.5, context=ctx) as resp:
            return bytes(resp.read())

    def leads(self) -> bool:
        """Whether this member is the cluster's leader now (False if it does not answer)."""
        try:
            status = json.loads(self._ask("/v3/maintenance/status", b"{}"))
        except OSError:
            return False
        return bool(status.get("leader")) and status["leader"] == status["header"]["member_id"]

    @property
    def log(self) -> Path:
        return self.data_dir / ("etcd.log" if self.name == "test" else f"etcd-{self.name}.log")

    def start(self, timeout_s: float = 10.0, *, wait: bool = True) -> EtcdProcess:
        """Start it; with `wait`, until it is healthy (a member of a new cluster is only once a quorum is up)."""
        log = open(self.log, "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        return self.wait_healthy(timeout_s) if wait else self

    def wait_healthy(self, timeout_s: float = 10.0) -> EtcdProcess:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log}")
            try:
                if b'"true"' in self._ask("/health"):
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become healthy in {timeout_s} s; see {self.log}")

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


class EtcdCluster:
    """Three etcd members on loopback with TLS on client and peer URLs and client-certificate auth: the
    certificates `certs` has for m0, m1 and m2 (make_certs). Timers a little slower than one member's, so
    that a loaded test machine does not make it change leaders by itself."""

    NAMES = ("m0", "m1", "m2")

    def __init__(self, data_dir: Path, certs: Certs, *, heartbeat_ms: int = 25, election_ms: int = 250) -> None:
        cluster = {name: free_port() for name in self.NAMES}
        self.members = [EtcdProcess(data_dir, heartbeat_ms=heartbeat_ms, election_ms=election_ms, name=name,
                                    certs=certs, cluster=cluster) for name in self.NAMES]  # fmt: skip
        self.urls = [m.url for m in self.members]

    def start(self, timeout_s: float = 20.0) -> EtcdCluster:
        for member in self.members:
            member.start(wait=False)
        for member in self.members:
            member.wait_healthy(timeout_s)
        return self

    def leader(self, timeout_s: float = 10.0) -> EtcdProcess:
        """The member that leads (once one does)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for member in self.members:
                if member.proc is not None and member.leads():
                    return member
            time.sleep(0.05)
        raise RuntimeError(f"no etcd member leads after {timeout_s} s")

    def kill(self) -> None:
        for member in self.members:
            member.kill()
