"""Server processes for tests: the gateway and the replay sidecar as real processes on loopback."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from gateway.journal import JournalReader, JournalWriter
from gateway.tools import hagroup
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.batch import MAX_SEQ

STREAM = "orders"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayProcess:
    """`zeps gateway` in a subprocess, journaling only (no multicast), on free loopback ports."""

    def __init__(
        self,
        journal: Path,
        *extra: str,
        streams: tuple[str, ...] = (STREAM, "other"),
        wrap: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """`wrap`: a command prefix to run it under (strace, for tests/support/powerloss.py); `env`: its
        environment (default: this process's)."""
        self.ingest = f"tcp://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "gateway.cli", "gateway", "--journal", str(journal), "--ingest", self.ingest]
        for stream in streams:
            argv += ["--stream", stream]
        self.argv, self.env = [*wrap, *argv, *extra], env
        self.proc = subprocess.Popen(self.argv, stderr=subprocess.PIPE, text=True, env=env)
        self.wait_ready()

    def restart(self, ingest: str | None = None) -> None:
        """Start it again on the same journal (after kill9 or stop), on the same endpoint or on `ingest`."""
        if ingest is not None:
            self.argv[self.argv.index(self.ingest)] = self.ingest = ingest
        self.proc = subprocess.Popen(self.argv, stderr=subprocess.PIPE, text=True, env=self.env)
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the gateway answers PING (it has opened its journal and bound its sockets)."""
        sock = zeps_client(self.ingest)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, self.proc.communicate()[1]
                sock.send(P.encode(P.Ping()))
                if sock.poll(200):
                    assert isinstance(P.decode(sock.recv()), P.PingOk)
                    return
            raise TimeoutError(f"the gateway did not answer PING within {timeout} s")
        finally:
            sock.close()

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=20)
        assert self.proc.returncode in (0, -signal.SIGKILL), err
        return err


def journal_records(root: Path, stream: str = STREAM) -> list[tuple[int, str, bytes]]:
    return hagroup.journal_records(root, stream)


def journal_batches(root: Path, stream: str = STREAM) -> list[tuple[int, int, int]]:
    """(first_seq, last_seq, CRC32C) of every batch in the journal under `root`: its batch boundaries and bytes."""
    with JournalReader(root, stream).cursor(1) as cursor:
        out: list[tuple[int, int, int]] = []
        while (batch := cursor.next_batch()) is not None:
            out.append((batch.first_seq, batch.last_seq, batch.crc))
        return out


def assert_exactly_once(root: Path, bodies: list[bytes], stream: str = STREAM) -> None:
    """The journal holds every body once, in publish order, at contiguous sequences."""
    records = journal_records(root, stream)
    assert [seq for seq, _, _ in records] == list(range(1, len(records) + 1))
    got = [body for _, _, body in records]
    dups = [body for body, n in Counter(got).items() if n > 1]
    assert not dups, f"{len(dups)} records journaled twice, e.g. {dups[:3]}"
    assert got == bodies, f"{len(bodies) - len(got)} records missing or out of order"


def zeps_client(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    return sock


CTX = zmq.Context.instance()


@dataclass
class Sidecar:
    proc: subprocess.Popen
    endpoint: str
    metrics: str | None = None

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]


@contextlib.contextmanager
def start_sidecar(root: Path, *extra: str) -> Iterator[Sidecar]:
    """`zeps replay` on a free port (bound as :0, read back from its first stdout line); SIGTERM at the end."""
    cmd = [sys.executable, "-m", "gateway.cli", "replay", "--journal", str(root), "--bind", "tcp://127.0.0.1:0"]
    log = open(root.parent / f"replay-{os.getpid()}-{time.monotonic_ns()}.log", "w+b")  # noqa: SIM115
    proc = subprocess.Popen([*cmd, *extra], stdout=subprocess.PIPE, stderr=log)
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert sel.select(timeout=15), "zeps replay printed nothing within 15 s"
        line = proc.stdout.readline().decode()  # type: ignore[union-attr]
        match = re.search(r" at (tcp://\S+)", line)
        assert match, f"unexpected first line {line!r}; stderr: {log.seek(0) or log.read().decode()}"
        yield Sidecar(proc, match.group(1))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
            raise
        log.seek(0)
        stderr = log.read().decode()
        log.close()
        assert code == 0, f"zeps replay exited {code} on SIGTERM: {stderr}"
        assert "Traceback" not in stderr, stderr


class Side:
    """`zeps replay` on a fixed loopback port, so it can be killed and started again at the same address."""

    def __init__(self, root: Path, port: int, *extra: str) -> None:
        self.root, self.port, self.extra = root, port, extra
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.log = root.parent / f"replay-{port}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        argv = [sys.executable, "-m", "gateway.cli", "replay", "--journal", str(self.root), "--bind", self.endpoint]
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen([*argv, *self.extra], stdout=subprocess.PIPE, stderr=err)
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert sel.select(timeout=20), f"zeps replay printed nothing within 20 s: {self.stderr()}"
        assert "serving" in self.proc.stdout.readline().decode()  # type: ignore[union-attr]

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        assert "Traceback" not in self.stderr(), self.stderr()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def side(root: Path, *extra: str, port: int | None = None) -> Iterator[Side]:
    s = Side(root, port or free_port(), *extra)
    try:
        yield s
    finally:
        s.stop()


class SilentFirst:
    """A TCP forwarder on loopback to `target` (tcp://HOST:PORT) whose first connection is taken and never
    answered nor passed on: a lost segment of a fresh connection that is never retransmitted. `accepted`
    counts the connections it took."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self._target = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.05)  # the accept loop looks at `_stop` this often
        self.endpoint = f"tcp://127.0.0.1:{self._server.getsockname()[1]}"
        self.accepted = 0
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            self.accepted += 1
            self._socks.append(conn)
            if self.accepted == 1:
                continue  # held open, silent
            upstream = socket.create_connection(self._target, timeout=5)
            upstream.settimeout(None)
            self._socks.append(upstream)
            for source, sink in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_forward, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _forward(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from `source` to `sink` until either end closes."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Stream:
    """A JournalWriter that remembers every record and sealed batch it wrote."""

    def __init__(self, root: Path, name: str, **opts) -> None:
        self.name = name
        self.writer = JournalWriter.open(root, name, **opts)
        self.records: list[B.Record] = []
        self.batches: list[bytes] = []
        self._n = 0

    def write(self, batches: int, per_batch: int = 10, *, keys: int = 4, size: int = 100) -> None:
        for _ in range(batches):
            recs = []
            for _ in range(per_batch):
                i = self._n
                self._n += 1
                body = (b"%d:" % i + b"x" * size)[:size]
                recs.append((BASE_TS + i, b"k%d.%d" % (i % keys, i % 7), body))
            sealed = self.writer.append(B.Batch.parse(B.encode(0, recs)))
            self.batches.append(sealed)
            self.records.extend(B.Batch.parse(sealed).records())

    @property
    def head(self) -> int:
        return self.writer.last_seq

    def expected(self, after: int = 0, prefix: str = "", upto: int = MAX_SEQ) -> list[tuple]:
        return [record_tuple(r) for r in self.records if after < r.seq <= upto and r.key.startswith(prefix)]


def record_tuple(r: B.Record) -> tuple:
    return r.seq, r.key, bytes(r.body)


@dataclass
class Raw:
    """A DEALER speaking ZEPS frame by frame, with a credit window it tops up as it consumes."""

    endpoint: str
    window: int = 0
    sock: zmq.Socket = field(init=False)
    records: list[tuple] = field(default_factory=list)
    batches: list[B.Batch] = field(default_factory=list)
    events: list[P.Command] = field(default_factory=list)  # FETCH-END, TRIMMED, INVALID, ... in order
    consumed: int = 0

    def __post_init__(self) -> None:
        self.sock = CTX.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)

    def send(self, *cmds: P.Command) -> None:
        for cmd in cmds:
            self.sock.send(P.encode(cmd))

    def recv(self, timeout: float = 5.0) -> P.Command:
        assert self.sock.poll(int(timeout * 1000)), f"nothing from the sidecar within {timeout} s"
        frame = self.sock.recv()
        cmd = P.decode(frame)
        if isinstance(cmd, P.Deliver | P.DeliverBatch) and self.window:
            self.consumed += len(frame)
            if self.consumed >= self.window // 2:
                self.send(P.Credit(self.consumed))
                self.consumed = 0
        return cmd

    def quiet(self, timeout: float = 0.3) -> bool:
        """True if nothing arrives within `timeout` (a bounded check that the server stopped)."""
        return not self.sock.poll(int(timeout * 1000))

    def expect(self, kind: type[P.Command], timeout: float = 5.0) -> P.Command:
        cmd = self.recv(timeout)
        assert isinstance(cmd, kind), f"expected {kind.__name__}, got {cmd!r}"
        return cmd

    def attach(self, stream: str, features: tuple[str, ...] = ()) -> frozenset[str]:
        self.send(P.Attach(P.PROTOCOL, P.VERSION, stream))
        self.expect(P.AttachOk)
        if not features:
            return frozenset()
        self.send(P.Extend(features))
        return frozenset(self.expect(P.ExtendOk).features)  # type: ignore[attr-defined]

    def subscribe(self, pattern: str = "", latest: int = 0, window: int = 1 << 20) -> None:
        self.window = window
        self.send(P.Subscribe(pattern, latest))
        self.expect(P.SubscribeOk)
        if window:
            self.send(P.Credit(window))

    def take(self, cmd: P.Command) -> None:
        """File one received command under records / batches / events."""
        match cmd:
            case P.Deliver(sequence=seq, key=key, body=body):
                self.records.append((seq, key, bytes(body)))
            case P.DeliverBatch(batch=raw):
                batch = B.Batch.parse(bytes(raw))
                self.batches.append(batch)
                self.records.extend(record_tuple(r) for r in batch.records())
            case P.Ping():
                self.send(P.PingOk())
            case _:
                self.events.append(cmd)

    def pump(self, done: Callable[[Raw], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done(self):
            assert time.monotonic() < deadline, f"not done within {timeout} s: {len(self.records)} records"
            self.take(self.recv(max(0.01, deadline - time.monotonic())))

    def through(self, seq: int) -> Callable[[Raw], bool]:
        """done() for pump: the stream has been delivered through `seq` (by record or by batch coverage)."""
        return lambda c: (
            bool(c.batches and c.batches[-1].last_seq >= seq) or bool(c.records and c.records[-1][0] >= seq)
        )

    def close(self) -> None:
        self.sock.close()


BASE_TS = 1_700_000_000 * 10**9
