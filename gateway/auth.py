"""Authentication: a shared stream key for multicast, ZeroMQ CURVE for TCP (docs/security.md).

Multicast cannot keep anyone on the LAN from sending to a group and port, so authenticity is checked per
message. With a stream key the gateway appends a third frame to every multicast message (batch or heartbeat):

    auth frame (24 bytes): magic b"ZA", version u8 = 1, pad u8, key id u32 LE, tag 16 bytes
    tag = HMAC-SHA256(key, b"zeps-mcast-v1\\0" + len(stream) u8 + stream + payload), first 16 bytes

The tag covers the stream name and the whole payload (batch header with its sequences, records; or the
heartbeat with its head and replay endpoint). It travels only on multicast: the journal and replay keep the
one batch format byte for byte (replay may cut and filter batches, which no tag could survive), and TCP is
protected by CURVE instead. The key id (derived from the key, so it needs no coordination) names which key
signed a message, so that subscribers can hold the old and the new key while a key is rotated.

Over TCP the servers (gateway ingest, replay sidecar) take a CURVE secret key and a directory of allowed
client public keys, checked by pyzmq's ZAP authenticator; refused handshakes are counted and logged. Clients
take their own key pair and the server's public key. Plain TCP stays available for labs and says so once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import itertools
import logging
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from gateway.mcast import McastError

log = logging.getLogger(__name__)

AUTH_MAGIC = b"ZA"
AUTH_VERSION = 1
AUTH = struct.Struct("<2sBxI16s")  # magic, version, pad, key id, tag: 24 bytes
TAG_BYTES = 16
KEY_BYTES = 32  # what `zeps keygen --stream-key` makes
MIN_KEY_BYTES, MAX_KEY_BYTES = 16, 64
_LABEL = b"zeps-mcast-v1\0"  # domain separation: this MAC means "a multicast message of ZEPS, version 1"
_KEY_ID_LABEL = b"zeps-key-id\0"


class AuthError(ValueError):
    """A key file or a key setting that cannot be used; the message names the file and the fix."""


class Unauthenticated(McastError):
    """A multicast message that failed the stream key check; `kind` says how (for counting and logs)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


# --- the stream key ----------------------------------------------------------------------------------


class StreamKey:
    """A secret shared by the gateway and its subscribers; signs and checks multicast messages.

    Anyone holding it can sign, so it proves "sent by a holder of the key", not "sent by the gateway".
    """

    __slots__ = ("_mac", "id", "secret")

    def __init__(self, secret: bytes) -> None:
        if not MIN_KEY_BYTES <= len(secret) <= MAX_KEY_BYTES:
            raise AuthError(f"a stream key has {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, not {len(secret)}")
        self.secret = bytes(secret)
        (self.id,) = struct.unpack_from("<I", hashlib.sha256(_KEY_ID_LABEL + self.secret).digest())
        self._mac = hmac.new(self.secret, _LABEL, "sha256")  # copied per message: the key is set up once

    @classmethod
    def generate(cls) -> StreamKey:
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> StreamKey:
        """Read a key file: comment lines (#) and one line of hex or base64. Errors say what to do."""
        path = Path(path)
        try:
            text = path.read_text(encoding="ascii")
        except FileNotFoundError:
            raise AuthError(
                f"stream key file {path} not found: create it with `zeps keygen --stream-key {path}`"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthError(f"stream key file {path} cannot be read ({exc}): it must be a text file") from None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if len(lines) != 1:
            raise AuthError(f"stream key file {path} must hold one line of hex or base64, found {len(lines)} lines")
        try:
            key = cls(_decode_secret(lines[0]))
        except AuthError as exc:
            raise AuthError(f"stream key file {path}: {exc}; make a new one with `zeps keygen --stream-key`") from None
        if os.stat(path).st_mode & 0o077:
            log.warning("stream key file %s can be read by other users: chmod 600 %s", path, path)
        return key

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a new key file readable by its owner only; never overwrites."""
        text = f"# zeps stream key {self.id:08x} (HMAC-SHA256): keep it secret\n{self.secret.hex()}\n"
        _write_new(Path(path), text, 0o600)

    def tag(self, stream: bytes, payload: bytes | memoryview) -> bytes:
        mac = self._mac.copy()
        mac.update(bytes((len(stream),)))
        mac.update(stream)
        mac.update(payload)
        return mac.digest()[:TAG_BYTES]

    def frames(self, stream: bytes, payload: bytes) -> tuple[bytes, bytes, bytes]:
        """The multicast message for `payload`: stream name, payload, authenticator."""
        return stream, payload, AUTH.pack(AUTH_MAGIC, AUTH_VERSION, self.id, self.tag(stream, payload))

    def __repr__(self) -> str:
        return f"StreamKey(id={self.id:08x})"  # never the secret

    def __reduce__(self) -> tuple[type[StreamKey], tuple[bytes]]:
        return StreamKey, (self.secret,)  # picklable (lab processes), though an HMAC object is not


def _decode_secret(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        pass
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise AuthError("the key is neither hex nor base64") from None


def message(key: StreamKey | None, stream: bytes, payload: bytes) -> tuple[bytes, ...]:
    """The frames of a multicast message: signed with `key`, or (stream, payload) without one."""
    return key.frames(stream, payload) if key is not None else (stream, payload)


class Verifier:
    """Checks multicast messages of one stream against the keys held (two while a key is rotated).

    With keys, only a message whose tag checks out with one of them is let through: unsigned, forged and
    mangled messages raise Unauthenticated. Without keys, signed and unsigned messages pass alike (a
    subscriber without the key cannot check; it says so once). Each kind of failure is logged once.
    """

    def __init__(self, stream: str, keys: Iterable[StreamKey] = ()) -> None:
        self.stream = stream
        self.keys = {key.id: key for key in keys}
        self._warned: set[str] = set()

    def open(self, frames: Sequence[bytes]) -> bytes:
        """The payload of a message (stream name, payload[, authenticator]) that passes; else raise."""
        if len(frames) not in (2, 3):
            raise McastError(f"a multicast message has 2 or 3 frames, not {len(frames)}")
        stream, payload = frames[0], frames[1]
        auth = _parse_auth(frames[2]) if len(frames) == 3 else None
        if not self.keys:
            if auth is not None:
                self._warn_once(
                    "unverified",
                    f"the multicast feed of {self.stream} is signed (key {auth[0]:08x}) but no stream key is "
                    "configured here: its messages are NOT verified; give --stream-key FILE",
                )
            return payload
        if auth is None:
            self._fail("unsigned", "an unsigned message (a rogue sender, or a gateway without --stream-key)")
        key_id, tag = auth
        key = self.keys.get(key_id)
        if key is None:
            held = ", ".join(f"{k:08x}" for k in self.keys)
            self._fail("unknown-key", f"a message signed with key {key_id:08x}, not one held here ({held})")
        if not hmac.compare_digest(key.tag(stream, payload), tag):
            self._fail("bad-tag", f"a message whose tag does not match key {key_id:08x} (forged or damaged)")
        return payload

    def _fail(self, kind: str, what: str) -> None:
        self._warn_once(kind, f"dropped {what} on the multicast feed of {self.stream}; further ones are counted")
        raise Unauthenticated(kind, what)

    def _warn_once(self, kind: str, text: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", text)


def _parse_auth(frame: bytes) -> tuple[int, bytes]:
    if len(frame) != AUTH.size:
        raise Unauthenticated("malformed", f"an authenticator of {len(frame)} bytes, expected {AUTH.size}")
    magic, version, key_id, tag = AUTH.unpack(frame)
    if magic != AUTH_MAGIC or version != AUTH_VERSION:
        raise Unauthenticated("malformed", f"an authenticator with magic {magic!r} version {version}")
    return key_id, tag


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
    """A server's CURVE key pair and the directory of client public keys (*.key) it lets in."""

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
    """A client's CURVE key pair and the public key of the server it may talk to."""

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
        if client:
            return 2, (
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
    says why, at once. Start before connect; `close()` once the server has answered.
    """

    SLICE_S = 0.05  # how often a wait for the first answer looks at the monitor
    CONCLUSIVE = 3  # failed attempts after which even an unexplained refusal ends the wait

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.monitor: zmq.Socket | None = sock.get_monitor_socket(_REFUSALS | zmq.EVENT_HANDSHAKE_SUCCEEDED)
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


def _write_new(path: Path, text: str, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise AuthError(f"{path} exists: remove it first, or choose another name") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
