"""`zeps doctor --etcd` against an etcd with TLS and client-certificate auth (the default recipe of docs/ha.md):
it checks the cluster with the client certificate the nodes will use, and says what to give when it has none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.certs import make_certs
from support.etcd import EtcdProcess


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "doctor", *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_doctor_checks_a_tls_etcd_with_the_client_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", ["test", "n0"])
    etcd = EtcdProcess(tmp_path, certs=certs)
    etcd.start()
    try:
        ok = doctor("--etcd", etcd.url, *certs.etcd_args("n0"))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.splitlines()[-1].startswith("ok   etcd") and "over TLS" in ok.stdout, ok.stdout

        bare = doctor("--etcd", etcd.url)  # no client certificate: etcd's TLS refuses us
        assert bare.returncode == 1 and bare.stdout.splitlines()[-1].startswith("FAIL etcd"), bare.stdout
        assert "refused TLS" in bare.stdout and "--etcd-ca" in bare.stdout and "--etcd-cert" in bare.stdout
    finally:
        etcd.stop()
    half = doctor("--etcd", etcd.url, "--etcd-ca", str(certs.ca))
    assert half.returncode == 2 and "--etcd-cert, --etcd-key" in half.stderr, half.stderr
    alone = doctor("--etcd-ca", str(certs.ca), "--etcd-cert", str(certs.cert("n0")), "--etcd-key", str(certs.key("n0")))
    assert alone.returncode == 2 and "give --etcd https://HOST:PORT too" in alone.stderr, alone.stderr
