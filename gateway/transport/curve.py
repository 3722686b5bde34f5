"""ZeroMQ CURVE for TCP: key files, the servers' guard and the clients' handshake (docs/security.md).

The servers (gateway ingest, replay sidecar) take a CURVE secret key and a directory of allowed client public
keys, checked by pyzmq's ZAP authenticator; refused handshakes are counted and logged. Clients take their own
key pair and the server's public key. Plain TCP stays available for labs and says so once. Multicast is signed
with a stream key instead (gateway.wire.streamkey).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from gateway.errors import AuthError

log = logging.getLogger(__name__)


# --- CURVE keys --------------------------------------------------------------------------------------


def create_curve_certificates(base: str | os.PathLike[str]) -> tuple[Path, Path]:
    """DIR/NAME -> (DIR/NAME.key, public; DIR/NAME.key_secret, owner-only), in ZeroMQ's certificate format."""
    base = Path(base)
    public, secret = base.with_name(base.name + ".key"), base.with_name(base.name + ".key_secret")
    for path in (public, secret):
        if path.exists():
            raise AuthError(f"{path} exists: remove it first, or choose another name")
    base.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    old = os.umask(0o077)  # zmq.auth writes with the process umask: the secret must never be readable
    try:
        zmq.auth.create_certificates(base.parent, base.name)
    finally:
        os.umask(old)
    public.chmod(0o644)
    return public, secret


def _load_cert(path: Path, what: str, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError):
        raise AuthError(
            f"{what} {path} is missing or not a ZeroMQ certificate: create one with `zeps keygen --curve DIR/NAME`"
        ) from None
    if secret and secret_key is None:
        raise AuthError(f"{what} {path} holds no secret key: pass NAME.key_secret, not the public NAME.key")
    for key in (public, secret_key):
        if key is not None and (len(key) != 40 or not _is_z85(key)):
            raise AuthError(f"{what} {path} holds a malformed key (expected 40 Z85 characters)")
    return public, secret_key


def _is_z85(key: bytes) -> bool:
    try:
        z85.decode(key)
    except (ValueError, KeyError):
        return False
    return True


@dataclass(frozen=True, slots=True, repr=False)
class CurveServerKeys:
    """A server's CURVE key pair and the directory of client public keys (*.key) it lets in.

    public, secret: the server's key pair (Z85 text); allow: the directory of the clients' public keys;
    clients: how many keys it held when loaded. Build it with `load(secret_file, allow_dir)`.
    """

    public: bytes
    secret: bytes
    allow: Path
    clients: int

    @classmethod
    def load(cls, secret_file: str | os.PathLike[str], allow_dir: str | os.PathLike[str]) -> CurveServerKeys:
        public, secret = _load_cert(Path(secret_file), "CURVE secret key file", secret=True)
        allow = Path(allow_dir)
        try:
            allowed = zmq.auth.load_certificates(allow)
        except OSError:
            raise AuthError(f"--curve-allow {allow} is not a directory of client public keys (*.key)") from None
        except ValueError as exc:
            raise AuthError(f"--curve-allow {allow}: {exc}") from None
        if not allowed:
            raise AuthError(f"no client public keys (*.key) in {allow}: copy each client's NAME.key there")
        assert secret is not None
        return cls(public, secret, allow, len(allowed))

    def __repr__(self) -> str:
        return f"CurveServerKeys(public={self.public.decode()}, allow={self.allow}, clients={self.clients})"


@dataclass(frozen=True, slots=True, repr=False)
class CurveClientKeys:
    """A client's CURVE key pair and the public key of the server it may talk to.

    public, secret: the client's key pair (Z85 text, as `zeps keygen --curve` writes it); server: the server's
    public key. Build it with `load(key_file, server_file)`.
    """

    public: bytes
    secret: bytes
    server: bytes

    @classmethod
    def load(cls, key_file: str | os.PathLike[str], server_file: str | os.PathLike[str]) -> CurveClientKeys:
        public, secret = _load_cert(Path(key_file), "CURVE key file", secret=True)
        server, server_secret = _load_cert(Path(server_file), "CURVE server key file", secret=False)
        if server_secret is not None:
            raise AuthError(
                f"CURVE server key file {server_file} holds the server's SECRET key: give clients the public "
                "NAME.key only, and keep NAME.key_secret on the server"
            )
        assert secret is not None
        return cls(public, secret, server)

    def apply(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE client of the server (before connect)."""
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server

    def __repr__(self) -> str:
        return f"CurveClientKeys(public={self.public.decode()}, server={self.server.decode()})"


def server_keys(secret_file: str | None, allow_dir: str | None) -> CurveServerKeys | None:
    """--curve-secret and --curve-allow, which go together; None for plain TCP."""
    if (secret_file is None) != (allow_dir is None):
        raise AuthError("--curve-secret FILE and --curve-allow DIR go together: give both, or neither (plain TCP)")
    return CurveServerKeys.load(secret_file, allow_dir) if secret_file and allow_dir else None


def client_keys(key_file: str | None, server_file: str | None) -> CurveClientKeys | None:
    """--curve-key and --curve-server, which go together; None for plain TCP."""
    if (key_file is None) != (server_file is None):
        raise AuthError("--curve-key FILE and --curve-server FILE go together: give both, or neither (plain TCP)")
    return CurveClientKeys.load(key_file, server_file) if key_file and server_file else None


# --- CURVE on server sockets -------------------------------------------------------------------------

_REFUSALS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_zap_lock = threading.Lock()
_zap: dict[zmq.Context, tuple[ThreadAuthenticator, int]] = {}  # one ZAP handler per context, shared
_domains = itertools.count(1)
_plain_warned = False
_monitors = itertools.count(1)  # Handshake monitor addresses


def refusal(event: int, value: int, *, client: bool, keyless: bool = False) -> tuple[int, str]:
    """A handshake failure (monitor event and value) in words, from the server's or the client's side, with
    how specific it is (2: certain; 0: libzmq gave no detail, as it does for the first attempt of any kind).
    A `keyless` client (plain TCP) fails a handshake only against a server that wants a mechanism."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        if client:
            return 2, "the server refused this client's CURVE key: add its NAME.key to the server's --curve-allow DIR"
        return 2, "client key not allowed (not in --curve-allow)"
    mismatch = event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    if mismatch or (client and keyless):
        # Certain only when libzmq says so: a keyless client's handshake also fails, with no detail, when the
        # server goes away in the middle of it (killed, restarting), which retrying outlives.
        if client:
            return 2 if mismatch else 0, (
                "security mismatch: the server requires CURVE and this client has no keys, or the reverse: "
                "give --curve-key and --curve-server, or neither"
            )
        return 2, "client without CURVE keys"
    if client:
        return 0, "CURVE handshake failed: does the server use CURVE, and is --curve-server its public key?"
    return 0, "CURVE handshake failed (a client with the wrong server key or none, or not ZeroMQ)"


class TcpGuard:
    """CURVE on a process's server sockets (or plain TCP, said once), counting and logging refused clients.

    `secure(sock)` before bind. Refusals are seen on socket monitors, drained by one thread per socket, and
    reported through `on_refused()` (a metrics counter); the log gets the first one, then at most one line a
    minute with the count, so a client retrying with a bad key cannot flood it.
    """

    LOG_EVERY_S = 60.0

    def __init__(self, ctx: zmq.Context, keys: CurveServerKeys | None, on_refused: Callable[[], None]) -> None:
        self.ctx = ctx
        self.keys = keys
        self.on_refused = on_refused
        self.domain = f"zeps-{next(_domains)}"
        self._watchers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._refused = 0  # since the last log line
        self._logged_at = float("-inf")
        self._zap = False

    def secure(self, sock: zmq.Socket, what: str) -> None:
        """Require CURVE and an allowed client key on `sock` (call before bind); plain: warn once per process."""
        global _plain_warned
        if self.keys is None:
            if not _plain_warned:
                _plain_warned = True
                log.warning("plain TCP: no authentication (use --curve-secret FILE --curve-allow DIR)")
            return
        if not self._zap:
            self._zap = True
            _zap_acquire(self.ctx).configure_curve(domain=self.domain, location=str(self.keys.allow))
        sock.curve_server = True
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.zap_domain = self.domain.encode()
        monitor = sock.get_monitor_socket(_REFUSALS)
        watcher = threading.Thread(target=self._watch, args=(monitor, what), name=f"curve-{what}", daemon=True)
        watcher.start()
        self._watchers.append(watcher)

    def _watch(self, monitor: zmq.Socket, what: str) -> None:
        try:
            while not self._stop.is_set():
                if not monitor.poll(100):
                    continue
                event = recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                    return
                self._refuse(what, refusal(event["event"], event["value"], client=False)[1])
        finally:
            monitor.close(linger=0)

    def _refuse(self, what: str, reason: str) -> None:
        self.on_refused()
        with self._lock:
            self._refused += 1
            now = time.monotonic()
            if now - self._logged_at < self.LOG_EVERY_S:
                return
            count, self._refused, self._logged_at = self._refused, 0, now
        log.warning("%s: refused %d connection(s): %s", what, count, reason)

    def close(self) -> None:
        self._stop.set()
        for watcher in self._watchers:
            watcher.join(timeout=1.0)
        if self._zap:
            self._zap = False
            _zap_release(self.ctx)


def _zap_acquire(ctx: zmq.Context) -> ThreadAuthenticator:
    with _zap_lock:
        auth, users = _zap.get(ctx, (None, 0))
        if auth is None:
            auth = ThreadAuthenticator(ctx)
            auth.start()
        _zap[ctx] = (auth, users + 1)
        return auth


def _zap_release(ctx: zmq.Context) -> None:
    with _zap_lock:
        auth, users = _zap.pop(ctx)
        if users > 1:
            _zap[ctx] = (auth, users - 1)
        else:
            auth.stop()


# --- CURVE on client sockets -------------------------------------------------------------------------


class Handshake:
    """Watches a client socket's handshakes, so that a server that does not answer can be explained.

    A refused CURVE handshake looks like silence to a ZeroMQ client (it retries for ever); the monitor
    says why, at once. Start before connect; `close()` once the server has answered, or keep it open with
    `watch_drops` to learn (`dropped`) when an established connection ends: a killed or silent server.
    With `watch_connects`, `unreachable` says a TCP connect failed since the last handshake (nothing listens
    there): a client with other servers to try need not wait for its deadline. libzmq reports a retry after
    any ended connection (a refused handshake too), so only a retry with no connection since the one before
    counts.
    """

    SLICE_S = 0.05  # how often a wait for the first answer looks at the monitor
    CONCLUSIVE = 3  # failed attempts after which even an unexplained refusal ends the wait

    def __init__(self, sock: zmq.Socket, *, watch_drops: bool = False, watch_connects: bool = False) -> None:
        self.sock = sock
        events = _REFUSALS | zmq.EVENT_HANDSHAKE_SUCCEEDED | (zmq.EVENT_DISCONNECTED if watch_drops else 0)
        events |= zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED if watch_connects else 0
        # An address of its own: pyzmq's default names it after the socket's fd, which a new socket may reuse
        # while a closed one's monitor is still bound ("Address already in use").
        self.monitor: zmq.Socket | None = sock.get_monitor_socket(events, f"inproc://zeps.handshake.{next(_monitors)}")
        self.established = False  # a handshake succeeded
        self.dropped = False  # an established connection ended (with watch_drops); refusals end none
        self.unreachable = False  # a connect failed since the last handshake (with watch_connects)
        self._connected = False  # a TCP connection was made since the last retry
        self.connected = False  # a TCP connection was made at all (with watch_connects)
        self.keyless = sock.get(zmq.MECHANISM) == zmq.NULL
        self.failure: str | None = None
        self.certainty = -1  # of `failure`: the most specific reason seen is kept
        self.failed = 0

    def poll(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for input on the socket; False if none came, and at once if the
        server refused the handshake (`explain()` says why)."""
        if self.monitor is None:
            return bool(self.sock.poll(max(0, int(timeout * 1000))))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if self.sock.poll(max(0, int(min(left, self.SLICE_S) * 1000))):
                return True
            if left <= 0 or (self.explain() and (self.certainty > 0 or self.failed >= self.CONCLUSIVE)):
                return False

    def explain(self) -> str | None:
        """Why the server has not answered, if a handshake failed (the latest, unless one succeeded since)."""
        while self.monitor is not None and self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.failure, self.certainty, self.failed = None, -1, 0
                self.established, self.unreachable = True, False
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.dropped = self.established
            elif event["event"] == zmq.EVENT_CONNECTED:
                self._connected = self.connected = True
            elif event["event"] == zmq.EVENT_CONNECT_RETRIED:
                self.unreachable = self.unreachable or not self._connected
                self._connected = False
            elif event["event"] & _REFUSALS:
                self.failed += 1
                certainty, reason = refusal(event["event"], event["value"], client=True, keyless=self.keyless)
                if certainty >= self.certainty:
                    self.failure, self.certainty = reason, certainty
        return self.failure

    def close(self) -> None:
        if self.monitor is not None:
            if not self.sock.closed:
                self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
