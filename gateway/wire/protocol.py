"""ZEPS wire codec, sans-IO: one command <-> the bytes of one ZeroMQ frame.

Grammar (the ZEPS protocol specification, commands 1-12, plus extensions 13-23)::

    frame    = %xAA %xA5 command-id fields     ; exactly one command per frame, nothing after it
    number-N = N octets, unsigned, network byte order (N = 1, 2, 4, 8)
    string   = number-1 length, then that many octets of UTF-8 text (ZEPS says VCHAR; widened to UTF-8)
    strings  = number-1 count, then that many strings          ; extension type
    chunk    = number-4 length, then that many octets

    id name            fields (s = string, N = number-N)       sender  feature
     1 ATTACH          protocol="ZEPS" version:2 stream:s      C
     2 ATTACH-OK                                               S
     3 SUBSCRIBE       pattern:s latest:8                      C
     4 SUBSCRIBE-OK                                            S
     5 CREDIT          credit:8 (bytes)                        C
     6 PUBLISH         key:s body:chunk                        C
     7 DELIVER         sequence:8 key:s body:chunk             S
     8 PING / 9 PING-OK                                        C, S
    10 DETACH                                                  C, S
    11 DETACH-OK                                               S
    12 INVALID         reason:s                                S
    13 EXTEND          features:strings                        C
    14 EXTEND-OK       features:strings (granted subset)       S
    15 SUBSCRIBE-TIME  pattern:s since_ns:8                    C       time
    16 FETCH           request_id:4 pattern:s first:8 last:8   C       range
    17 FETCH-END       request_id:4 first:8 last:8             S       range
    18 TRIMMED         requested:8 first_retained:8            S       range
    19 DELIVER-BATCH   batch:chunk                             S       batch
    20 PUBLISH-OK      sequence:8 count:4                      S       confirm
    21 PUBLISH-BATCH   batch:chunk                             C       batch
    22 SNAPSHOT        prefixes:strings                        C       snapshot
    23 SNAPSHOT-END    last:8 records:8                        S       snapshot
    24 REPLICA-ACK     node:s stream:s epoch:8 sequence:8 mac:chunk  C  (a follower gateway to its leader, HA)
    25 REPLICA-COMMIT  stream:s epoch:8 sequence:8 head:8            S  (the leader to its followers, HA)
    26 REPLICA-BATCH   stream:s epoch:8 batch:chunk                  S  (the leader to its followers, HA)
    27 MIRROR          source:s                                C       mirror
    28 MIRROR-OK       head:8 head_ts_ns:8                     S       mirror
    29 PROMOTE                                                 C       mirror
    30 PROMOTE-OK      head:8                                  S       mirror
    31 TAIL-UDP        port:2 token:8 mode:s                   C       datagram-tail

Extension negotiation: a peer that speaks only commands 1-12 never sees an id >= 13. After ATTACH-OK the
client may send EXTEND once, before any other command, naming the features it wants (FEATURES). The server
answers EXTEND-OK with the subset it grants (possibly empty); a server that does not know EXTEND answers
INVALID, which the client takes as "nothing granted". From then on each side sends a feature's commands
(Command.FEATURE) only if that feature was granted; receiving one that was not granted is answered with
INVALID. Without EXTEND the session is plain ZEPS 1-12.

Everything is table-driven: each command is a frozen dataclass whose field annotations carry the wire type
(Annotated[int, Wire.NUMBER_8], ...), and _TABLE maps id -> (name, class, feature, sender); adding a command
is one dataclass and one table line. decode() raises only ProtocolError, whose reason fits an INVALID string.
Chunk fields decode as zero-copy memoryview slices of the frame: bodies are the bulk of every frame and are
usually written straight to a journal or socket, so copying them would double the memory traffic. The slices
keep the frame alive and change if a mutable frame (bytearray) is changed; call bytes() to detach one.

Size: about 720 lines, kept whole: the command dataclasses, the command table and the codecs compiled from it
are one vocabulary, and its fast paths must accept exactly the frames the generic path does; a third of the
module is the 26 commands' declarations. The handshake is apart (gateway.wire.handshake).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, fields
from enum import StrEnum
from types import MappingProxyType
from typing import (
    Annotated,
    Any,
    ClassVar,
    Final,
    Literal,
    NamedTuple,
    TypeVar,
    cast,
    dataclass_transform,
    get_type_hints,
)

from gateway.errors import ProtocolError

SIGNATURE: Final = b"\xaa\xa5"
PROTOCOL: Final = "ZEPS"
VERSION: Final = 1
MAX_STRING: Final = 255
MAX_CHUNK: Final = 2**32 - 1

FEATURE_BATCH: Final = "batch"
FEATURE_CONFIRM: Final = "confirm"
FEATURE_RANGE: Final = "range"
FEATURE_TIME: Final = "time"
FEATURE_SNAPSHOT: Final = "snapshot"
FEATURE_PRODUCER: Final = "producer"  # PUBLISH-BATCH may carry FLAG_PRODUCER: the gateway drops re-sent records
# A sidecar of a replicated group's node serves committed records only (docs/ha.md); a session granted this is
# served to the journal's end: a follower gateway copying its leader's journal (the leader's commit waits for it).
FEATURE_UNCOMMITTED: Final = "uncommitted"
# A session granted this is a site mirror (docs/mirroring.md): its PUBLISH-BATCHes carry the source site's journal
# batches, sequences and times kept, and it may ask the stream's head (MIRROR) or promote the stream (PROMOTE).
FEATURE_MIRROR: Final = "mirror"
# A session granted this may ask for its subscription's live tail as datagrams too (TAIL-UDP, docs/mirroring.md):
# a site mirror across a lossy WAN. Sent only to the session's own peer address, rate-limited.
FEATURE_TAIL: Final = "datagram-tail"
FEATURES: Final = frozenset(
    {
        FEATURE_BATCH,
        FEATURE_CONFIRM,
        FEATURE_RANGE,
        FEATURE_TIME,
        FEATURE_SNAPSHOT,
        FEATURE_PRODUCER,
        FEATURE_UNCOMMITTED,
        FEATURE_MIRROR,
        FEATURE_TAIL,
    }
)

Buffer = bytes | bytearray | memoryview
Sender = Literal["client", "server", "both"]


def printable(text: str) -> str:
    """Escape everything outside printable ASCII and cut to MAX_STRING bytes, so the text fits a ZEPS string."""
    text = "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)
    return text if len(text) <= MAX_STRING else text[: MAX_STRING - 3] + "..."


def _show(value: object) -> str:
    """Short, printable repr of a peer-supplied value for an error reason (reasons travel back in INVALID)."""
    text = printable(repr(value))
    return text if len(text) <= 40 else text[:37] + "..."


class Wire(StrEnum):
    """Wire types of the grammar; the value is the grammar's own name."""

    NUMBER_1 = "number-1"
    NUMBER_2 = "number-2"
    NUMBER_4 = "number-4"
    NUMBER_8 = "number-8"
    STRING = "string"
    STRINGS = "strings"
    CHUNK = "chunk"


Number2 = Annotated[int, Wire.NUMBER_2]
Number4 = Annotated[int, Wire.NUMBER_4]
Number8 = Annotated[int, Wire.NUMBER_8]
String = Annotated[str, Wire.STRING]
Strings = Annotated[tuple[str, ...], Wire.STRINGS]
Chunk = Annotated[Buffer, Wire.CHUNK]


class Command:
    """Base of all commands; ID, NAME, FEATURE (None: base protocol) and SENDER are filled from _TABLE."""

    __slots__ = ()
    ID: ClassVar[int]
    NAME: ClassVar[str]
    FEATURE: ClassVar[str | None]
    SENDER: ClassVar[Sender]
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # every subclass is a dataclass (@_command)

    def __repr__(self) -> str:
        # Shared repr: the dataclass one would show chunk memoryviews as "<memory at 0x...>".
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, memoryview):
                text = repr(value.tobytes()) if value.nbytes <= 32 else f"<{value.nbytes} bytes>"
            else:
                text = repr(value)
            shown.append(f"{f.name}={text}")
        return f"{type(self).__name__}({', '.join(shown)})"


_C = TypeVar("_C", bound=Command)


@dataclass_transform(frozen_default=True)
def _command(cls: type[_C]) -> type[_C]:
    """Every command is a frozen, slotted dataclass with the shared repr (one decorator so types see it)."""
    return dataclass(frozen=True, slots=True, repr=False)(cls)


@_command
class Attach(Command):
    protocol: String
    version: Number2
    stream: String

    def __post_init__(self) -> None:
        # Checked on construction so that neither encode nor decode can produce another protocol name.
        if self.protocol != PROTOCOL:
            raise ProtocolError(f"ATTACH protocol must be {PROTOCOL!r}, got {_show(self.protocol)}")


@_command
class AttachOk(Command):
    pass


@_command
class Subscribe(Command):
    pattern: String
    latest: Number8


@_command
class SubscribeOk(Command):
    pass


@_command
class Credit(Command):
    credit: Number8


@_command
class Publish(Command):
    key: String
    body: Chunk


@_command
class Deliver(Command):
    sequence: Number8
    key: String
    body: Chunk


@_command
class Ping(Command):
    pass


@_command
class PingOk(Command):
    pass


@_command
class Detach(Command):
    pass


@_command
class DetachOk(Command):
    pass


@_command
class Invalid(Command):
    reason: String


@_command
class Extend(Command):
    features: Strings


@_command
class ExtendOk(Command):
    features: Strings


@_command
class SubscribeTime(Command):
    pattern: String
    since_ns: Number8


@_command
class Fetch(Command):
    request_id: Number4
    pattern: String
    first: Number8
    last: Number8


@_command
class FetchEnd(Command):
    request_id: Number4
    first: Number8
    last: Number8


@_command
class Trimmed(Command):
    requested: Number8
    first_retained: Number8


@_command
class DeliverBatch(Command):
    batch: Chunk


@_command
class PublishOk(Command):
    sequence: Number8
    count: Number4


@_command
class PublishBatch(Command):
    batch: Chunk


@_command
class Snapshot(Command):
    prefixes: Strings  # key prefixes (subtrees); none: every key


@_command
class SnapshotEnd(Command):
    last: Number8  # the snapshot is the last record of every key as of this sequence
    records: Number8  # records the snapshot held


@_command
class ReplicaAck(Command):
    """A follower gateway (docs/ha.md) has written `stream` through `sequence`, copied from the leader of `epoch`,
    and made it as durable as its --fsync says through `durable`; `mac` proves it is a node of the group
    (gateway.replication.follower.ack_mac)."""

    node: String
    stream: String
    epoch: Number8
    sequence: Number8
    durable: Number8
    mac: Chunk


@_command
class ReplicaCommit(Command):
    """The leader of `epoch` (docs/ha.md) has committed `stream` through `sequence`: a follower may let its
    sidecar serve that far (gateway.journal.committed). `head`: the leader's journal ends there; it pushed every
    batch up to it before this command, so a follower level with it that holds less missed a push."""

    stream: String
    epoch: Number8
    sequence: Number8
    head: Number8


@_command
class ReplicaBatch(Command):
    """The leader of `epoch` (docs/ha.md) journaled `batch` of `stream` (the journal's bytes), pushed to the
    followers level with it, so that their copy skips the leader's sidecar. `committed`: its commit point of
    `stream` as it pushed, taken as from a REPLICA-COMMIT (which it then sends less often)."""

    stream: String
    epoch: Number8
    committed: Number8
    batch: Chunk


@_command
class Mirror(Command):
    """This session mirrors its stream from another site (docs/mirroring.md): where does the stream's journal end
    here? Answered with MIRROR-OK, or INVALID (not a mirror stream here; promoted). `source`: the source
    sidecar the mirror reads, which the gateway lists in its announcements (the directory's "mirror of")."""

    source: String = ""


@_command
class MirrorOk(Command):
    """The mirror stream's journal ends at `head`, in a batch of journal time `head_ts_ns` (0: empty): the next
    mirror batch must start at head + 1, and the source's batch holding `head` must have that time (else the two
    journals are different histories: a fork)."""

    head: Number8
    head_ts_ns: Number8


@_command
class Promote(Command):
    """Make this mirror stream the primary (docs/mirroring.md): publishers accepted, mirror batches never again."""


@_command
class PromoteOk(Command):
    """The stream was promoted at `head` (now, or before): publishes continue at head + 1."""

    head: Number8


@_command
class TailUdp(Command):
    """Send this session's live tail as datagrams too (gateway.wire.tail), to UDP `port` at the session's own peer
    address (never another: no reflection), each carrying `token`; `mode` is the redundancy ("repeat:N",
    "xor:K"). Not answered; an unknown mode is refused with INVALID. The TCP subscription stays the reliable copy."""

    port: Number2
    token: Number8
    mode: String


# id, wire name, class, feature that must be granted first (None: base protocol/negotiation), sender.
# Ids 32+ are free.
_TABLE: Final[tuple[tuple[int, str, type[Command], str | None, Sender], ...]] = (
    (1, "ATTACH", Attach, None, "client"),
    (2, "ATTACH-OK", AttachOk, None, "server"),
    (3, "SUBSCRIBE", Subscribe, None, "client"),
    (4, "SUBSCRIBE-OK", SubscribeOk, None, "server"),
    (5, "CREDIT", Credit, None, "client"),
    (6, "PUBLISH", Publish, None, "client"),
    (7, "DELIVER", Deliver, None, "server"),
    (8, "PING", Ping, None, "both"),
    (9, "PING-OK", PingOk, None, "both"),
    (10, "DETACH", Detach, None, "both"),
    (11, "DETACH-OK", DetachOk, None, "server"),
    (12, "INVALID", Invalid, None, "server"),
    (13, "EXTEND", Extend, None, "client"),
    (14, "EXTEND-OK", ExtendOk, None, "server"),
    (15, "SUBSCRIBE-TIME", SubscribeTime, FEATURE_TIME, "client"),
    (16, "FETCH", Fetch, FEATURE_RANGE, "client"),
    (17, "FETCH-END", FetchEnd, FEATURE_RANGE, "server"),
    (18, "TRIMMED", Trimmed, FEATURE_RANGE, "server"),
    (19, "DELIVER-BATCH", DeliverBatch, FEATURE_BATCH, "server"),
    (20, "PUBLISH-OK", PublishOk, FEATURE_CONFIRM, "server"),
    (21, "PUBLISH-BATCH", PublishBatch, FEATURE_BATCH, "client"),
    (22, "SNAPSHOT", Snapshot, FEATURE_SNAPSHOT, "client"),
    (23, "SNAPSHOT-END", SnapshotEnd, FEATURE_SNAPSHOT, "server"),
    (24, "REPLICA-ACK", ReplicaAck, None, "client"),
    (25, "REPLICA-COMMIT", ReplicaCommit, None, "server"),
    (26, "REPLICA-BATCH", ReplicaBatch, None, "server"),
    (27, "MIRROR", Mirror, FEATURE_MIRROR, "client"),
    (28, "MIRROR-OK", MirrorOk, FEATURE_MIRROR, "server"),
    (29, "PROMOTE", Promote, FEATURE_MIRROR, "client"),
    (30, "PROMOTE-OK", PromoteOk, FEATURE_MIRROR, "server"),
    (31, "TAIL-UDP", TailUdp, FEATURE_TAIL, "client"),
)

# --- generic field codecs, compiled per (command, field) at import so errors name both -------------------

_Reader = Callable[[memoryview, int], tuple[object, int]]
_Writer = Callable[[list[Buffer], object], None]
_U8, _U32 = struct.Struct(">B"), struct.Struct(">I")
_NUMBER_SIZES: Final = {Wire.NUMBER_1: 1, Wire.NUMBER_2: 2, Wire.NUMBER_4: 4, Wire.NUMBER_8: 8}
_UINT: Final = {1: _U8, 2: struct.Struct(">H"), 4: _U32, 8: struct.Struct(">Q")}


def _truncated(cmd: str, what: str, need: int, left: int) -> ProtocolError:
    return ProtocolError(f"truncated {cmd}: {what} needs {need} bytes, {left} left")


def _number_codec(cmd: str, field: str, size: int) -> tuple[_Reader, _Writer]:
    unpack_from, pack = _UINT[size].unpack_from, _UINT[size].pack

    def read(mv: memoryview, off: int) -> tuple[object, int]:
        if off + size > len(mv):
            raise _truncated(cmd, f"{field} number-{size}", size, len(mv) - off)
        return unpack_from(mv, off)[0], off + size

    def write(out: list[Buffer], value: object) -> None:
        try:
            out.append(pack(value))
        except struct.error:
            limit = 256**size - 1
            raise ProtocolError(f"{cmd} field '{field}' must be an int in 0..{limit}, got {_show(value)}") from None

    return read, write


def _read_string(mv: memoryview, off: int, cmd: str, field: str) -> tuple[str, int]:
    if off >= len(mv):
        raise _truncated(cmd, f"{field} string length", 1, 0)
    start = off + 1
    end = start + mv[off]
    if end > len(mv):
        raise _truncated(cmd, f"{field} string", end - start, len(mv) - start)
    try:
        return mv[start:end].tobytes().decode(), end
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"invalid UTF-8 in {cmd} string field '{field}' at byte {exc.start}") from None


def _write_string(out: list[Buffer], value: object, cmd: str, field: str) -> None:
    if not isinstance(value, str):
        raise ProtocolError(f"{cmd} field '{field}' must be str, got {type(value).__name__}")
    try:
        data = value.encode()
    except UnicodeEncodeError:
        raise ProtocolError(f"{cmd} field '{field}' is not encodable as UTF-8: {_show(value)}") from None
    if len(data) > MAX_STRING:
        raise ProtocolError(f"{cmd} field '{field}' is {len(data)} bytes, max {MAX_STRING}")
    out.append(_U8.pack(len(data)))
    out.append(data)


def _string_codec(cmd: str, field: str) -> tuple[_Reader, _Writer]:
    def read(mv: memoryview, off: int) -> tuple[object, int]:
        return _read_string(mv, off, cmd, field)

    def write(out: list[Buffer], value: object) -> None:
        _write_string(out, value, cmd, field)

    return read, write


def _strings_codec(cmd: str, field: str) -> tuple[_Reader, _Writer]:
    def read(mv: memoryview, off: int) -> tuple[object, int]:
        if off >= len(mv):
            raise _truncated(cmd, f"{field} strings count", 1, 0)
        values = []
        pos = off + 1
        for i in range(mv[off]):
            value, pos = _read_string(mv, pos, cmd, f"{field}[{i}]")
            values.append(value)
        return tuple(values), pos

    def write(out: list[Buffer], value: object) -> None:
        if not isinstance(value, tuple | list):
            raise ProtocolError(f"{cmd} field '{field}' must be a tuple of str, got {type(value).__name__}")
        if len(value) > MAX_STRING:
            raise ProtocolError(f"{cmd} field '{field}' has {len(value)} strings, max {MAX_STRING}")
        out.append(_U8.pack(len(value)))
        for i, item in enumerate(value):
            _write_string(out, item, cmd, f"{field}[{i}]")

    return read, write


def _chunk_codec(cmd: str, field: str) -> tuple[_Reader, _Writer]:
    def read(mv: memoryview, off: int) -> tuple[object, int]:
        if off + 4 > len(mv):
            raise _truncated(cmd, f"{field} chunk length", 4, len(mv) - off)
        start = off + 4
        end = start + _U32.unpack_from(mv, off)[0]
        if end > len(mv):
            raise _truncated(cmd, f"{field} chunk", end - start, len(mv) - start)
        return mv[start:end], end

    def write(out: list[Buffer], value: object) -> None:
        try:
            size = memoryview(cast(Buffer, value)).nbytes  # memoryview() is the check
        except TypeError:
            raise ProtocolError(f"{cmd} field '{field}' must be bytes-like, got {type(value).__name__}") from None
        if size > MAX_CHUNK:
            raise ProtocolError(f"{cmd} field '{field}' is {size} bytes, max {MAX_CHUNK}")
        out.append(_U32.pack(size))
        out.append(cast(Buffer, value))

    return read, write


class CommandSpec(NamedTuple):
    """One row of the command table, with the field list read from the dataclass annotations."""

    id: int
    name: str
    cls: type[Command]
    fields: tuple[tuple[str, Wire], ...]
    feature: str | None
    sender: Sender


class _Compiled(NamedTuple):
    spec: CommandSpec
    header: bytes
    readers: tuple[_Reader, ...]
    writers: tuple[tuple[str, _Writer], ...]


def _compile(spec: CommandSpec) -> _Compiled:
    readers, writers = [], []
    for name, wire in spec.fields:
        if wire is Wire.STRING:
            read, write = _string_codec(spec.name, name)
        elif wire is Wire.STRINGS:
            read, write = _strings_codec(spec.name, name)
        elif wire is Wire.CHUNK:
            read, write = _chunk_codec(spec.name, name)
        else:
            read, write = _number_codec(spec.name, name, _NUMBER_SIZES[wire])
        readers.append(read)
        writers.append((name, write))
    return _Compiled(spec, SIGNATURE + bytes([spec.id]), tuple(readers), tuple(writers))


def _spec(row: tuple[int, str, type[Command], str | None, Sender]) -> CommandSpec:
    cmd_id, name, cls, feature, sender = row
    hints = get_type_hints(cls, include_extras=True)
    wires = tuple((f.name, hints[f.name].__metadata__[0]) for f in fields(cls))
    cls.ID, cls.NAME, cls.FEATURE, cls.SENDER = cmd_id, name, feature, sender
    return CommandSpec(cmd_id, name, cls, wires, feature, sender)


COMMANDS: Final[Mapping[int, CommandSpec]] = MappingProxyType({row[0]: _spec(row) for row in _TABLE})
_BY_ID: Final = {cmd_id: _compile(spec) for cmd_id, spec in COMMANDS.items()}
_BY_CLASS: Final = {c.spec.cls: c for c in _BY_ID.values()}
_ONE_CHUNK: Final = frozenset(c.spec.cls for c in _BY_ID.values() if [w for _, w in c.spec.fields] == [Wire.CHUNK])

# --- fast paths for the per-record commands; they handle well-formed input only and hand anything odd to
# the generic path, which then produces the exact error, so both paths accept exactly the same frames. ---

_SEQ_LEN = struct.Struct(">QB")
_DELIVER_HEAD = struct.Struct(">2sBQB")
_PUBLISH_HEAD = struct.Struct(">2sBB")
_PUBLISH_OK = struct.Struct(">2sBQI")
_FAST_ERRORS = (struct.error, IndexError, UnicodeError, AttributeError, TypeError, ValueError)


def _decode_deliver(mv: memoryview) -> Command:
    sequence, key_len = _SEQ_LEN.unpack_from(mv, 3)
    key_end = 12 + key_len
    body_start = key_end + 4
    if body_start + _U32.unpack_from(mv, key_end)[0] != len(mv):
        raise ValueError
    return Deliver(sequence, mv[12:key_end].tobytes().decode(), mv[body_start:])


def _decode_publish(mv: memoryview) -> Command:
    key_end = 4 + mv[3]
    body_start = key_end + 4
    if body_start + _U32.unpack_from(mv, key_end)[0] != len(mv):
        raise ValueError
    return Publish(mv[4:key_end].tobytes().decode(), mv[body_start:])


def _decode_publish_batch(mv: memoryview) -> Command:
    if 7 + _U32.unpack_from(mv, 3)[0] != len(mv):
        raise ValueError
    return PublishBatch(mv[7:])


def _nbytes(body: Buffer) -> int:
    """Byte size of a chunk; len() of a memoryview counts items, which differ from bytes for non-"B" formats."""
    return len(body) if type(body) is bytes else memoryview(body).nbytes


def _encode_deliver(cmd: Deliver) -> bytes:
    key, body = cmd.key.encode(), cmd.body
    head = _DELIVER_HEAD.pack(SIGNATURE, 7, cmd.sequence, len(key))
    return b"".join((head, key, _U32.pack(_nbytes(body)), body))


def _encode_publish(cmd: Publish) -> bytes:
    key, body = cmd.key.encode(), cmd.body
    head = _PUBLISH_HEAD.pack(SIGNATURE, 6, len(key))
    return b"".join((head, key, _U32.pack(_nbytes(body)), body))


def _encode_publish_ok(cmd: PublishOk) -> bytes:
    return _PUBLISH_OK.pack(SIGNATURE, 20, cmd.sequence, cmd.count)


_FAST_DECODE: Final[dict[int, Callable[[memoryview], Command]]] = {
    7: _decode_deliver,
    6: _decode_publish,
    21: _decode_publish_batch,  # a Publisher's every batch
}
_FAST_ENCODE: Final[dict[type[Command], Callable[..., bytes]]] = {
    Deliver: _encode_deliver,
    Publish: _encode_publish,
    PublishOk: _encode_publish_ok,  # the gateway's confirm: per batch, one per record from many small publishers
}

# --- public codec ------------------------------------------------------------------------------------------


def is_zeps(frame: Buffer) -> bool:
    """True if the frame starts with the ZEPS signature; servers drop other frames silently."""
    return frame[:2] == SIGNATURE


def encode(cmd: Command) -> bytes:
    """The frame for cmd; ProtocolError naming the field if a value does not fit its wire type."""
    fast = _FAST_ENCODE.get(type(cmd))
    if fast is not None:
        try:
            return fast(cmd)
        except _FAST_ERRORS:
            pass  # the generic path below names the offending field
    compiled = _BY_CLASS.get(type(cmd))
    if compiled is None:
        raise TypeError(f"encode() takes a ZEPS command such as Ping(), got {type(cmd).__name__}")
    out: list[Buffer] = [compiled.header]
    for name, write in compiled.writers:
        write(out, getattr(cmd, name))
    return b"".join(out)


def head_of(cls: type[Command], chunk_size: int) -> bytes:
    """The frame of `cls`, a command whose one field is a chunk of `chunk_size` bytes, up to that chunk: a sender
    that builds the chunk in its own buffer writes this in front and sends the same bytes encode() would."""
    compiled = _BY_CLASS[cls]
    if cls not in _ONE_CHUNK:
        raise TypeError(f"{cls.__name__} is not a command of one chunk field")
    if not 0 <= chunk_size <= MAX_CHUNK:
        raise ProtocolError(f"{compiled.spec.name} chunk of {chunk_size} bytes, max {MAX_CHUNK}")
    return compiled.header + _U32.pack(chunk_size)


def decode(frame: Buffer) -> Command:
    """The command in one frame; ProtocolError for anything but exactly one well-formed command.

    Chunk fields are memoryview slices of frame (see module docstring); everything else is a copy.
    """
    mv = memoryview(frame)
    if mv.format != "B":
        mv = mv.cast("B")
    size = len(mv)
    if size < 2 or mv[0] != 0xAA or mv[1] != 0xA5:
        raise ProtocolError("bad signature")
    if size == 2:
        raise ProtocolError("truncated frame: signature but no command id")
    fast = _FAST_DECODE.get(mv[2])
    if fast is not None:
        try:
            return fast(mv)
        except _FAST_ERRORS:
            pass  # the generic path below produces the precise error
    return _decode_generic(mv)


def _decode_generic(mv: memoryview) -> Command:
    compiled = _BY_ID.get(mv[2])
    if compiled is None:
        raise ProtocolError(f"unknown command {mv[2]}")
    values = []
    off = 3
    for read in compiled.readers:
        value, off = read(mv, off)
        values.append(value)
    if off != len(mv):
        raise ProtocolError(f"trailing {len(mv) - off} bytes after {compiled.spec.name}")
    return compiled.spec.cls(*values)


RETRY_LATER = "retry later"  # ends the reason of an INVALID that a client may retry (with backoff); others are final


def invalid(reason: str) -> bytes:
    """An INVALID frame for any reason text, made printable and cut to fit, so sending it cannot fail."""
    return encode(Invalid(printable(reason)))


def validate_stream_name(name: str) -> str:
    """Return name if it can be a stream (and journal directory) name, else ProtocolError saying why."""
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"stream name must be a non-empty str, got {_show(name)}")
    if len(name.encode("utf-8", "replace")) > MAX_STRING:
        raise ProtocolError(f"stream name is {len(name.encode('utf-8', 'replace'))} bytes, max {MAX_STRING}")
    if not all("!" <= c <= "~" and c != "/" for c in name):
        raise ProtocolError(f"stream name must be printable ASCII without spaces or '/', got {_show(name)}")
    if name in (".", ".."):
        raise ProtocolError(f"stream name must not be {name!r}, it is a directory alias")
    return name
