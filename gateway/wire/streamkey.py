"""The stream key: a shared secret that signs every multicast message (docs/security.md).

Multicast cannot keep anyone on the LAN from sending to a group and port, so authenticity is checked per
message. With a stream key the gateway appends a third frame to every multicast message (batch or heartbeat):

    auth frame (24 bytes): magic b"ZA", version u8 = 1, pad u8, key id u32 LE, tag 16 bytes
    tag = HMAC-SHA256(key, b"zeps-mcast-v1\\0" + len(stream) u8 + stream + payload), first 16 bytes

The tag covers the stream name and the whole payload (batch header with its sequences, records; or the
heartbeat with its head and replay endpoint). It travels only on multicast: the journal and replay keep the
one batch format byte for byte (replay may cut and filter batches, which no tag could survive), and TCP is
protected by CURVE instead (gateway.transport.curve). The key id (derived from the key, so it needs no
coordination) names which key signed a message, so that subscribers can hold the old and the new key while a
key is rotated.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NoReturn

from gateway.errors import AuthError, McastError, Unauthenticated

log = logging.getLogger(__name__)

AUTH_MAGIC = b"ZA"
AUTH_VERSION = 1
AUTH = struct.Struct("<2sBxI16s")  # magic, version, pad, key id, tag: 24 bytes
TAG_BYTES = 16
KEY_BYTES = 32  # what `zeps keygen --stream-key` makes
MIN_KEY_BYTES, MAX_KEY_BYTES = 16, 64
_LABEL = b"zeps-mcast-v1\0"  # domain separation: this MAC means "a multicast message of ZEPS, version 1"
_KEY_ID_LABEL = b"zeps-key-id\0"


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
        write_new(Path(path), text, 0o600)

    def tag(self, stream: bytes | memoryview, payload: bytes | memoryview) -> bytes:
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

    def open(self, frames: Sequence[bytes | memoryview]) -> bytes | memoryview:
        """The payload of a message (stream name, payload[, authenticator]) that passes; else raise."""
        if len(frames) not in (2, 3):
            raise McastError(f"a multicast message has 2 or 3 frames, not {len(frames)}")
        stream, payload = frames[0], frames[1]
        auth = parse_auth(frames[2]) if len(frames) == 3 else None
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

    def _fail(self, kind: str, what: str) -> NoReturn:
        self._warn_once(kind, f"dropped {what} on the multicast feed of {self.stream}; further ones are counted")
        raise Unauthenticated(kind, what)

    def _warn_once(self, kind: str, text: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", text)


def parse_auth(frame: bytes | memoryview) -> tuple[int, bytes]:
    """(key id, tag) of an authenticator frame; anything else, a non-zero pad byte included, is malformed."""
    if len(frame) != AUTH.size:
        raise Unauthenticated("malformed", f"an authenticator of {len(frame)} bytes, expected {AUTH.size}")
    magic, version, key_id, tag = AUTH.unpack(frame)
    if magic != AUTH_MAGIC or version != AUTH_VERSION or frame[3] != 0:
        raise Unauthenticated("malformed", f"an authenticator with magic {magic!r} version {version} pad {frame[3]}")
    return key_id, tag


def write_new(path: Path, text: str, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise AuthError(f"{path} exists: remove it first, or choose another name") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
