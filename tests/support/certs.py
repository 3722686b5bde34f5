"""A group's certificates for tests, made as users make them (`zeps keygen --tls-ca`, `--tls-node`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.transport.tls import PeerTls, make_ca, make_node

LOOPBACK = ["127.0.0.1", "localhost"]  # in every node's certificate: etcd's clients check the host they reach


@dataclass(frozen=True)
class Certs:
    """A CA and node certificates under `dir`: `ca.crt`, and `NAME.crt` with `NAME.key` per node."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def peer_tls(self, name: str) -> PeerTls:
        return PeerTls.load(self.cert(name), self.key(name), self.ca)

    def gateway_args(self, name: str) -> list[str]:
        """`zeps gateway` options for node `name`'s peer link."""
        return ["--peer-tls-cert", str(self.cert(name)), "--peer-tls-key", str(self.key(name)),
                "--peer-tls-ca", str(self.ca)]  # fmt: skip

    def etcd_args(self, name: str) -> list[str]:
        """`zeps gateway`/`zeps ha status` options for an etcd client as `name`."""
        return ["--etcd-ca", str(self.ca), "--etcd-cert", str(self.cert(name)), "--etcd-key", str(self.key(name))]


def make_certs(dir: Path, names: list[str]) -> Certs:
    """A new CA in `dir` and a certificate for each of `names`, valid for loopback too."""
    ca = make_ca(dir / "ca")
    for name in names:
        make_node(dir / name, ca, LOOPBACK)
    return Certs(dir)
