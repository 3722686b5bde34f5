"""Every exception the library raises, under one base: `except ZepsError` catches them all.

Each message names the cause and the fix, so a command line can print it as one line. The classes also
derive from the builtin that their callers caught before this family existed (ValueError for bad input,
RuntimeError for a failure at run time), so existing `except ValueError` code keeps working.

This module sits below every layer (it imports nothing of ours), so any layer may raise these. The upper
layers' own errors live with them and derive from ZepsError too: gateway.bench.BenchError,
gateway.spark.SparkUnavailable.
"""

from __future__ import annotations

from pathlib import Path


class ZepsError(Exception):
    """The base of every exception the library raises."""


# --- bad input: values, files, settings (ValueError) -----------------------------------------------------


class ConfigError(ZepsError, ValueError):
    """Settings that cannot work together; the message says which and how to fix them."""


class BatchError(ZepsError, ValueError):
    """A batch that does not parse or does not check out; `reason` says what and where."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProtocolError(ZepsError, ValueError):
    """A frame (or a value to encode) breaks the ZEPS grammar; `reason` says which rule and where.

    gateway.wire.protocol shows a peer's values escaped and cut (its `printable`), so the reason is printable
    ASCII that a server can send back in INVALID.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AuthError(ZepsError, ValueError):
    """A key file or a key setting that cannot be used; the message names the file and the fix."""


class McastError(ZepsError, ValueError):
    """A bad endpoint, or a multicast payload that is neither a valid batch nor a valid heartbeat."""


class Unauthenticated(McastError):
    """A multicast message that failed the stream key check; `kind` says how (for counting and logs), `reason`
    says it in words."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


class UdpError(McastError):
    """A datagram that is not a well-formed message."""


class FillError(ZepsError, ValueError):
    """A datagram at a fill port (gateway.wire.fill) that is not a well-formed, authentic fill request or answer."""


# --- failures at run time (RuntimeError) -----------------------------------------------------------------


class NormError(ZepsError, RuntimeError):
    """libnorm is missing or refused a setting; the message names the call and what to check."""


class PgmError(ZepsError, RuntimeError):
    """libpgm (OpenPGM) is missing or refused a setting; the message names the call and what to check."""


class PublishError(ZepsError, RuntimeError):
    """The gateway refused something, or did not answer in time; `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadRecord(PublishError, ValueError):
    """publish() was given a record it cannot send (type, size, TTL): raised there, nothing queued is touched."""


class BadRecordType(BadRecord, TypeError):
    """publish() was given a key, body or TTL of the wrong type: a TypeError too, as Python code expects."""


class BufferFull(PublishError):
    """The Publisher's memory budget stayed full of unconfirmed records until the caller's deadline."""


class ReplayError(ZepsError, RuntimeError):
    """The server refused something, went away, or did not answer in time; `reason` says which and the fix."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ReplayRefused(ReplayError):
    """The server refused this client for a reason retrying cannot fix (unknown stream, protocol version, CURVE
    key or server key, a corrupt journal at the server): raised to the application at once, never retried."""


class NotGranted(ReplayRefused):
    """The server does not grant an extension the request needs."""


class Closed(ZepsError, RuntimeError):
    """A client used after its close(): nothing more will come through it; create a new one."""


class DataLoss(ZepsError, RuntimeError):
    """Sequences lo..hi are gone for good (the journal no longer holds them); iterate again to go on.

    reason: why (retention, a trimmed range, a corrupt journal at the server)."""

    def __init__(self, lo: int, hi: int, reason: str) -> None:
        super().__init__(f"records {lo}..{hi} are lost ({reason}): the journal no longer retains them")
        self.lo, self.hi, self.reason = lo, hi, reason


class MirrorError(ZepsError, RuntimeError):
    """A site mirror cannot go on without a gap or a fork (records gone at the source, a promoted or non-mirror
    target, a gateway without mirroring); the message says which records or why, and the fix."""


class DiscoveryError(ZepsError, RuntimeError):
    """Nothing announced what a client looked for within its deadline; the message says where it listened."""


class SlowConsumer(ZepsError, RuntimeError):
    """The application fell further behind the live feed than `max_lag` allows (lag_policy="raise")."""


class CoordinatorError(ZepsError, RuntimeError):
    """The coordinator (etcd) refused a request or did not answer in time; the message names it and the fix."""


# --- the journal -------------------------------------------------------------------------------------------


class JournalError(ZepsError, RuntimeError):
    """Anything the journal refuses to do; the message names the cause and the fix."""


class JournalCorrupt(JournalError):
    """Bytes in a segment that are not a valid batch, or a broken sequence, where data follows.

    path: the segment file; offset: the byte where the damage starts; reason: what is wrong there; fix: what to
    do (the message ends with it)."""

    def __init__(self, path: Path, offset: int, reason: str, fix: str) -> None:
        super().__init__(f"journal corrupt: {path} at byte {offset}: {reason}. {fix}")
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalLocked(JournalError):
    """Another process is the writer of this stream: `message` says which stream and how to find the process,
    `pid` is that process (None when the lock does not say)."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


class NotAJournal(JournalError):
    """A path that does not hold what the caller said it would (journal root or stream directory)."""


class JournalTrimmed(JournalError):
    """Sequences a reader asked for are no longer in the journal (retention, or removal by hand).

    `stream` is the stream's name; `seq` the first sequence that could not be delivered; `first_retained` the
    first one that can.
    A cursor that raises this has moved on to `first_retained` when that exists, so calling it again
    continues from there: skipping the loss is the caller's decision, never the journal's.
    """

    def __init__(self, stream: str, seq: int, first_retained: int) -> None:
        super().__init__(
            f"stream {stream!r}: sequence {seq} is no longer in the journal (removed by retention or by hand); "
            f"the first retained sequence is {first_retained}: resume from there, or from a snapshot"
        )
        self.seq = seq
        self.first_retained = first_retained
