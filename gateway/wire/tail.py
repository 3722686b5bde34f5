"""Tail datagrams: a sidecar session's live tail sent as datagrams too, with redundancy that repairs a loss
without a round trip (docs/mirroring.md, "The datagram tail"; docs/protocol.md, "Tail datagrams").

A site mirror across a lossy WAN reads the source over TCP, where a lost segment holds everything behind it
for a retransmission (a round trip at least, often TCP's 200 ms timer). TAIL-UDP asks the sidecar to send the
same records as unicast datagrams as well, each a piece of a journal batch in the one batch format, and to
send enough redundancy that a single loss is repaired at the receiver with nothing asked back (forward error
correction). The TCP subscription stays the reliable copy: whatever the datagrams still miss arrives there,
and the mirror merges both by sequence.

    data:    magic b"ZF", version u8 = 1, kind u8 = 3, token u64, index u32,
             of: first u64, last u64, crc u32 (the journal batch this one is, or is a part of),
             batch (to the datagram's end)
    parity:  magic b"ZF", version u8 = 1, kind u8 = 4, token u64, first index u32, count u8,
             count x u16 payload length, XOR of the count payloads (each zero-padded to the longest)

Numbers are big-endian. `token` is the mirror's random 64-bit number from TAIL-UDP: a datagram without it is
not this tail's (a blind forger does not know it; the batch's CRC is checked as well). `index` counts a
tail's data datagrams from 0. A data datagram's payload (what a parity covers) is `of` and the batch.

`of` names the journal batch: a batch that fits a datagram is sent whole (its coverage and CRC are `of`'s); a
larger one is sent in dense parts (`Batch.split`), each naming the whole one, so that the mirror can join the
parts back into the journal batch (`Batch.join`, checked against `of`'s CRC) and write into its site's gateway
the batches the source journaled, never a part (gateway.client.mirror_paths, rule 12).

Redundancy (`Redundancy.parse`, the `--datagram-tail` value):
- `repeat:N`: every data datagram is sent again N times, `spacing_s` apart (a burst loss rarely takes all);
  a loss costs the spacing; N + 1 times the bytes.
- `xor:K`: after every K data datagrams, one parity datagram over them (the group); a group still open
  `spacing_s` after its first datagram is closed with the parity of what it has. One loss in a group is
  rebuilt from the others and the parity; 1 + 1/K times the bytes; a loss costs up to the rest of its group.

`TailEncoder` (the sidecar's side) and `TailDecoder` (the mirror's) hold these rules without sockets or
clocks (`now` comes with every call). Malformed or foreign datagrams raise TailError / are counted.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import NamedTuple

from gateway.errors import BatchError, FillError
from gateway.wire import batch as B

MAGIC = b"ZF"
VERSION = 1
KIND_DATA = 3
KIND_PARITY = 4
HEAD = struct.Struct(">2sBBQI")  # magic, version, kind, token, index (data) / first index (parity): 16 bytes
OF = struct.Struct(">QQI")  # a data datagram's journal batch: first, last, CRC32C: 20 bytes
COUNT = struct.Struct(">B")
LENGTH = struct.Struct(">H")
SPACING_S = 0.005  # repeats' spacing; an open parity group's longest wait
MAX_REPEAT = 3
MAX_GROUP = 16
KEEP = 2048  # data datagrams the decoder remembers (for duplicates and for parity)


class TailError(FillError):
    """A datagram that is not one of this tail's (malformed, another token)."""


class Piece(NamedTuple):
    """A data datagram's batch, and the journal batch it is or is a part of: that batch's coverage and CRC."""

    batch: B.Batch
    first: int
    last: int
    crc: int

    @property
    def whole(self) -> bool:
        return (self.batch.first_seq, self.batch.last_seq) == (self.first, self.last)


def pieces(batch: B.Batch, room: int) -> list[bytes]:
    """`batch` (a journal batch) as data payloads of at most `room` bytes: whole, else its dense parts
    (`Batch.split`), each with `of`; none if a part would still not fit (BatchError if it cannot be cut)."""
    of = OF.pack(batch.first_seq, batch.last_seq, batch.crc)
    if OF.size + batch.nbytes <= room:
        return [of + batch.buf]
    parts = [of + part for _, part in batch.split(room - OF.size)]
    return parts if max(map(len, parts)) <= room else []


@dataclass(frozen=True)
class Redundancy:
    """`repeat:N` (N extra copies) or `xor:K` (one parity datagram per K data datagrams)."""

    kind: str
    n: int
    spacing_s: float = SPACING_S

    @classmethod
    def parse(cls, text: str) -> Redundancy:
        kind, _, n = text.partition(":")
        bounds = {"repeat": (1, MAX_REPEAT), "xor": (2, MAX_GROUP)}
        if kind not in bounds or not n.isdigit() or not bounds[kind][0] <= int(n) <= bounds[kind][1]:
            raise ValueError(
                f"datagram tail redundancy {text!r}: give repeat:N (N 1..{MAX_REPEAT}, each datagram sent N more "
                f"times) or xor:K (K 2..{MAX_GROUP}, one parity datagram per K), e.g. xor:4"
            )
        return cls(kind, int(n))

    def __str__(self) -> str:
        return f"{self.kind}:{self.n}"


def _xor_into(acc: bytearray, data: bytes | memoryview) -> None:
    if len(data) > len(acc):
        acc.extend(bytes(len(data) - len(acc)))
    n = len(data)
    acc[:n] = (int.from_bytes(acc[:n], "big") ^ int.from_bytes(data, "big")).to_bytes(n, "big")


class TailEncoder:
    """The sidecar's side: `push(payload, now)` -> datagrams to send now; `due(now)` -> the repeats and parity whose
    time has come; `next_due` says when (None: nothing waits)."""

    def __init__(self, token: int, redundancy: Redundancy) -> None:
        self.token, self.redundancy = token, redundancy
        self.index = 0
        self._later: deque[tuple[float, bytes]] = deque()  # (when, datagram): repeats, in time order
        self._group: list[bytes | memoryview] = []  # xor: this group's payloads
        self._group_first = 0
        self._group_at = 0.0

    def push(self, payload: bytes | memoryview, now: float) -> list[bytes]:
        datagram = HEAD.pack(MAGIC, VERSION, KIND_DATA, self.token, self.index) + payload
        self.index += 1
        r = self.redundancy
        out = [datagram]
        if r.kind == "repeat":
            for i in range(1, r.n + 1):
                self._later.append((now + i * r.spacing_s, datagram))
            return out + self.due(now)
        if not self._group:
            self._group_first, self._group_at = self.index - 1, now
        self._group.append(payload)
        if len(self._group) >= r.n:
            out.append(self._parity())
        return out

    @property
    def next_due(self) -> float | None:
        if self._later:
            return self._later[0][0]
        if self._group:
            return self._group_at + self.redundancy.spacing_s
        return None

    def due(self, now: float) -> list[bytes]:
        out: list[bytes] = []
        while self._later and self._later[0][0] <= now:
            out.append(self._later.popleft()[1])
        if self._group and now >= self._group_at + self.redundancy.spacing_s:
            out.append(self._parity())
        return out

    def _parity(self) -> bytes:
        group, self._group = self._group, []
        acc = bytearray()
        for payload in group:
            _xor_into(acc, payload)
        lengths = b"".join(LENGTH.pack(len(p)) for p in group)
        head = HEAD.pack(MAGIC, VERSION, KIND_PARITY, self.token, self._group_first) + COUNT.pack(len(group))
        return head + lengths + bytes(acc)


@dataclass
class DecoderStats:
    data: int = 0  # data datagrams used (first copies)
    duplicates: int = 0  # copies of data datagrams already had
    parities: int = 0
    rebuilt: int = 0  # data datagrams rebuilt from a parity
    rejected: int = 0  # malformed, another token, a bad batch


class TailDecoder:
    """The mirror's side: `receive(datagram)` -> the pieces it makes available (a data datagram's, and any
    rebuilt from a parity), each once; foreign or malformed datagrams are counted in `stats.rejected`."""

    def __init__(self, token: int, stats: DecoderStats | None = None) -> None:
        """`stats`: counts to add to (kept across tails by the caller)."""
        self.token = token
        self.stats = stats if stats is not None else DecoderStats()
        self._have: OrderedDict[int, bytes] = OrderedDict()  # index -> payload, the last KEEP
        self._parity: OrderedDict[int, tuple[list[int], bytes]] = OrderedDict()  # first -> (lengths, xor)

    def receive(self, data: bytes) -> list[Piece]:
        try:
            magic, version, kind, token, index = HEAD.unpack_from(data)
        except struct.error:
            self.stats.rejected += 1
            return []
        if magic != MAGIC or version != VERSION or token != self.token or kind not in (KIND_DATA, KIND_PARITY):
            self.stats.rejected += 1
            return []
        if kind == KIND_DATA:
            if index in self._have:
                self.stats.duplicates += 1
                return []
            out = self._add(index, data[HEAD.size :])
            return out + self._repair_around(index)
        return self._add_parity(index, data)

    def _add(self, index: int, payload: bytes) -> list[Piece]:
        try:
            piece = Piece(B.Batch.parse(payload[OF.size :]), *OF.unpack_from(payload))
        except (BatchError, struct.error):
            self.stats.rejected += 1
            return []
        batch = piece.batch
        if not piece.first <= batch.first_seq <= batch.last_seq <= piece.last or (
            piece.whole and batch.crc != piece.crc
        ):
            self.stats.rejected += 1  # a batch that is not what its `of` says
            return []
        self._have[index] = payload
        if len(self._have) > KEEP:
            self._have.popitem(last=False)
        self.stats.data += 1
        return [piece]

    def _add_parity(self, first: int, data: bytes) -> list[Piece]:
        at = HEAD.size
        if len(data) < at + 1:
            self.stats.rejected += 1
            return []
        (count,) = COUNT.unpack_from(data, at)
        at += 1
        if not 1 <= count <= MAX_GROUP or len(data) < at + 2 * count:
            self.stats.rejected += 1
            return []
        lengths = [LENGTH.unpack_from(data, at + 2 * i)[0] for i in range(count)]
        at += 2 * count
        if len(data) - at != max(lengths):
            self.stats.rejected += 1
            return []
        self.stats.parities += 1
        self._parity[first] = (lengths, data[at:])
        if len(self._parity) > KEEP // 2:
            self._parity.popitem(last=False)
        return self._repair(first)

    def _repair_around(self, index: int) -> list[Piece]:
        """A data datagram came late: a parity held for its group may now rebuild the group's one missing."""
        for first in self._parity:
            if first <= index < first + len(self._parity[first][0]):
                return self._repair(first)
        return []

    def _repair(self, first: int) -> list[Piece]:
        lengths, xor = self._parity[first]
        missing = [first + i for i in range(len(lengths)) if first + i not in self._have]
        if len(missing) != 1:
            if not missing:
                del self._parity[first]
            return []
        acc = bytearray(xor)
        for i in range(len(lengths)):
            if first + i != missing[0]:
                _xor_into(acc, self._have[first + i])
        del self._parity[first]
        out = self._add(missing[0], bytes(acc[: lengths[missing[0] - first]]))
        self.stats.rebuilt += len(out)
        self.stats.data -= len(out)
        return out
