"""CURVE on TCP, with real processes on loopback: `zeps gateway` and `zeps replay` with a server key and allowed
client keys. The well-keyed client works; a client without keys, with a key not allowed, or with the wrong
server key gets nothing, is told why, and the server counts the refusal. Plain mode says so, once.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zmq

from gateway.client.publisher import Publisher
from gateway.client.replay_client import history
from gateway.client.subscriber import Subscriber
from gateway.errors import PublishError, ReplayError
from gateway.journal import JournalReader
from gateway.tools.deployment import Keys, wait_ping
from gateway.transport.curve import CurveClientKeys, create_curve_certificates
from gateway.wire import protocol as P

STREAM = "orders"
COUNT = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A `zeps` server process on loopback with its Prometheus endpoint."""

    proc: subprocess.Popen
    endpoint: str
    metrics: str
    stderr: str | None = field(default=None, init=False)

    @classmethod
    def start(cls, command: str, endpoint_option: str, *args: str, curve: CurveClientKeys | None) -> Server:
        endpoint, metrics = f"tcp://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "gateway.cli", command, endpoint_option, endpoint, "--metrics", metrics, *args]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_ping(endpoint, 30.0, curve)
        except TimeoutError:
            proc.kill()
            raise AssertionError(proc.communicate()[1]) from None
        return cls(proc, endpoint, metrics)

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as page:
            for line in page.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[-1])
        return 0.0

    def stop(self) -> str:
        """SIGTERM (once); its stderr, after checking that it exited cleanly."""
        if self.stderr is None:
            self.proc.send_signal(signal.SIGTERM)
            self.stderr = self.proc.communicate(timeout=30)[1]
        assert self.proc.returncode == 0, self.stderr
        return self.stderr


@dataclass
class Secured:
    keys: Keys
    journal: Path
    gateway: Server
    replay: Server
    rogue: CurveClientKeys  # a key pair not allowed, for the right server
    wrong_server: CurveClientKeys  # an allowed key pair, with someone else's server key

    def client_options(self) -> list[str]:
        """The well-keyed client's options on the command line."""
        keys = self.keys.dir
        return ["--curve-key", str(keys / "client.key_secret"), "--curve-server", str(keys / "server.key")]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    keys = Keys.create(tmp_path / "keys")
    _, rogue_secret = create_curve_certificates(tmp_path / "rogue" / "rogue")
    other_public, _ = create_curve_certificates(tmp_path / "other" / "server")
    journal = tmp_path / "journal"
    journal.mkdir()
    curve = keys.client()
    gateway = Server.start("gateway", "--ingest", "--stream", STREAM, "--journal", str(journal), *keys.server_args(),
                           curve=curve)  # fmt: skip
    replay = Server.start("replay", "--bind", "--journal", str(journal), *keys.server_args(), curve=curve)
    try:
        yield Secured(
            keys,
            journal,
            gateway,
            replay,
            CurveClientKeys.load(rogue_secret, keys.dir / "server.key"),
            CurveClientKeys.load(keys.dir / "client.key_secret", other_public),
        )
    finally:
        gateway.stop()
        replay.stop()


def test_curve_ingest(secured: Secured) -> None:
    gw = secured.gateway
    with Publisher(gw.endpoint, STREAM, confirm=True, curve=secured.keys.client()) as pub:
        for i in range(COUNT):
            pub.publish("k", b"%d" % i)
        assert pub.flush() == COUNT

    refusals = {
        "security mismatch: the server requires CURVE": None,
        "refused this client's CURVE key: add its NAME.key to the server's --curve-allow DIR": secured.rogue,
        "CURVE handshake failed: does the server use CURVE, and is --curve-server its public key?": (
            secured.wrong_server
        ),
    }
    for reason, curve in refusals.items():
        started = time.monotonic()
        with pytest.raises(PublishError) as refused:
            Publisher(gw.endpoint, STREAM, timeout=10.0, curve=curve)
        assert reason in refused.value.reason
        assert time.monotonic() - started < 5.0  # told at once, not after the timeout

    # A bare ZeroMQ client without keys gets nothing at all, not even a PING-OK.
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(gw.endpoint)
        sock.send(P.encode(P.Ping()))
        assert not sock.poll(1000)

    # The command line, as an operator would run it.
    cli = [sys.executable, "-m", "gateway.cli", "publish", "--ingest", gw.endpoint, "--stream", STREAM, "--count",
           "10", "--confirm"]  # fmt: skip
    good = subprocess.run([*cli, *secured.client_options()], capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and f"last sequence {COUNT + 10}" in good.stderr, good.stderr
    bare = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 1 and "give --curve-key and --curve-server" in bare.stderr

    assert gw.metric('zeps_gateway_rejected_messages_total{kind="auth"}') >= 5
    err = gw.stop()
    assert "refused" in err and "plain TCP" not in err
    assert JournalReader(secured.journal, STREAM).last_seq == COUNT + 10


def test_curve_replay(secured: Secured) -> None:
    with Publisher(secured.gateway.endpoint, STREAM, confirm=True, curve=secured.keys.client()) as pub:
        for i in range(COUNT):
            pub.publish("k", b"%d" % i)
        pub.flush()
    rp = secured.replay
    records = list(history(rp.endpoint, STREAM, curve=secured.keys.client()))
    assert [r.body for r in records] == [b"%d" % i for i in range(COUNT)]

    for curve in (None, secured.rogue, secured.wrong_server):
        with pytest.raises(ReplayError, match="CURVE"):
            list(history(rp.endpoint, STREAM, timeout=10.0, curve=curve))

    # The subscriber's replay connections (no multicast here: replay alone, history then the live tail).
    with Subscriber(STREAM, replay=rp.endpoint, start="earliest", curve=secured.keys.client()) as sub:
        got = [sub.next(timeout=10.0) for _ in range(COUNT)]
    assert [r.body for r in got if r is not None] == [b"%d" % i for i in range(COUNT)]

    # The command line, as an operator would run it.
    cli = [sys.executable, "-m", "gateway.cli", "history", "--replay", rp.endpoint, "--stream", STREAM]
    good = subprocess.run([*cli, *secured.client_options()], capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and len(good.stdout.splitlines()) == COUNT, good.stderr
    bare = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 1 and "give --curve-key and --curve-server" in bare.stderr
    half = subprocess.run([*cli, *secured.client_options()[:2]], capture_output=True, text=True, timeout=60)
    assert half.returncode == 2 and "go together" in half.stderr
    sub = subprocess.run([sys.executable, "-m", "gateway.cli", "subscribe", "--replay", rp.endpoint, "--stream", STREAM,
                          "--from", "earliest", "--count", str(COUNT), "--summary-only", "--stream-key",
                          str(secured.keys.stream_key_file), *secured.client_options()],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert sub.returncode == 0 and f"records={COUNT}," in sub.stderr and "unauthenticated=0" in sub.stderr

    assert rp.metric('zeps_replay_rejected_messages_total{kind="auth"}') >= 4


def test_plain_tcp_says_so_once(tmp_path: Path) -> None:
    gw = Server.start("gateway", "--ingest", "--stream", STREAM, "--journal", str(tmp_path),
                      "--ingest-pub", f"tcp://127.0.0.1:{free_port()}", curve=None)  # fmt: skip
    try:
        with Publisher(gw.endpoint, STREAM, confirm=True) as pub:
            pub.publish("k", b"plain")
            assert pub.flush() == 1
    finally:
        err = gw.stop()
    assert err.count("plain TCP: no authentication (use --curve-secret FILE --curve-allow DIR)") == 1
    assert "WARNING" in err
