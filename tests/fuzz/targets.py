"""Fuzz targets: one per decoder that takes bytes from the network or the disk.

Each target takes one input (bytes) and holds its decoder to its contract: a value, or the error the decoder
documents (ProtocolError, BatchError, McastError, FillError, UdpError, JournalError), never anything else;
where an encoder exists, what was decoded encodes back to what decodes the same (round trip). Where a decoder
has a compiled twin (the batch loops, the APDU reassembler), both run and must agree. Anything else, an
uncaught exception or a failed assertion, is a crash for the fuzzer (run.py, atheris) and a failed test for
the corpus replay (tests/unit/test_fuzz_corpus.py).

Inputs that hold several pieces (APDUs, socket reads) are cut with `pieces`: a length byte, then that many bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from gateway.errors import BatchError, FillError, JournalCorrupt, JournalError, McastError, ProtocolError
from gateway.journal import JournalReader, JournalWriter, verify_root
from gateway.journal.committed import MARK_NAME, CommittedMark, read_mark
from gateway.journal.epochs import EPOCHS_NAME, read_epochs, start_epoch
from gateway.journal.layout import HEAD_NAME, idx_path, read_head, seg_path
from gateway.journal.writer import Durability
from gateway.transport import _pgm_loop
from gateway.transport.udp import decode_message
from gateway.wire import announce, fill
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire import record_loops as loops
from gateway.wire.apdu import Reassembler, packetise
from gateway.wire.framing import encode_message
from gateway.wire.heartbeat import Heartbeat, parse_payload
from gateway.wire.length_prefixed import HEADER_SIZE, Deframer, header
from gateway.wire.streamkey import StreamKey, Verifier

Target = Callable[[bytes], None]

KEY = StreamKey(bytes(range(32)))  # a fixed key: signed seeds stay valid across runs
KEYS = {KEY.id: KEY}
STREAM = "s"
MAX_FRAME = 4096  # the peer link's deframer limit in the target: small, so the limit itself gets hit
logging.getLogger("gateway").setLevel(logging.CRITICAL)  # the warnings of rejects and recoveries are the point


def pieces(data: bytes) -> Iterator[bytes]:
    """The pieces of `data`: a length byte, then that many bytes, again and again (the last may be short)."""
    pos = 0
    while pos < len(data):
        n = data[pos]
        yield data[pos + 1 : pos + 1 + n]
        pos += 1 + n


# --- the network ---------------------------------------------------------------------------------------


def command(data: bytes) -> None:
    """A ZEPS command (ZeroMQ frame): ProtocolError or a command whose encoding is exactly these bytes."""
    try:
        cmd = P.decode(data)
    except ProtocolError:
        return
    assert P.encode(cmd) == data, cmd


def batch(data: bytes) -> None:
    """A record batch. Structure checked with and without the CRC (the fuzzer rarely forges a CRC); the Python
    and the compiled record loops agree on every input; a dense batch encodes back to its bytes and splits into
    parts that hold its records."""
    _loops_agree(data)
    try:
        b = B.Batch.parse(data, check_crc=False)
    except BatchError:
        return
    crc_ok = _parses(data)
    entries = list(b.entries())
    assert len(entries) == b.count and all(b.first_seq <= e[0] <= b.last_seq for e in entries)
    assert [e[:4] for e in entries] == list(b.raw())
    list(b.records(prefixes=(b"a",)))
    B.Batch.parse(b.select((b"a", b"")), check_crc=True)
    if not (b.dense and b.count):
        return
    ttl = bool(b.flags & B.FLAG_TTL)
    rows = [(ts, bytes(k), bytes(v), t) if ttl else (ts, bytes(k), bytes(v)) for _, ts, k, v, t in entries]
    again = B.encode(b.first_seq, rows, ts_ns=b.ts_ns, ttl=ttl, producer=b.producer)
    assert again[:8] + again[12:] == data[:8] + data[12:] and (again == data) == crc_ok
    parts = [B.Batch.parse(part) for _, part in b.split(200)]
    assert [e for p in parts for e in p.entries()] == entries
    mid = (b.first_seq + b.last_seq) // 2
    assert list(B.Batch.parse(b.part(mid, b.last_seq)).entries()) == [e for e in entries if e[0] >= mid]


def _parses(data: bytes) -> bool:
    try:
        B.Batch.parse(data)
    except BatchError:
        return False
    return True


def _loops_agree(data: bytes) -> None:
    """gateway/wire/_record_loops.c and its Python twin give the same fault (or none) and the same records."""
    if loops.IMPLEMENTATION != "compiled" or len(data) < B.HEADER_SIZE:
        return
    _, _, flags, _, _, count, first, last, _ = B.HEADER.unpack_from(data)
    if last < first:
        return
    overhead = B.RECORD_TTL_OVERHEAD if flags & B.FLAG_TTL else B.RECORD_OVERHEAD
    start = B.PRODUCER_HEADER_SIZE if flags & B.FLAG_PRODUCER else B.HEADER_SIZE
    view = memoryview(data)
    fault = loops.py_check(view, count, last - first, overhead, start)
    assert loops.check(view, count, last - first, overhead, start) == fault
    if fault is None and count:
        for lo, hi in ((0, B.MAX_SEQ), (first + 1, (first + last) // 2)):
            py = list(loops.py_entries(view, first, count, overhead, start, lo, hi, True))
            assert list(loops.entries(view, first, count, overhead, start, lo, hi, True)) == py


def payload(data: bytes) -> None:
    """A multicast payload: a batch or a heartbeat, else McastError; a heartbeat encodes back to itself."""
    try:
        got = parse_payload(data)
    except McastError:
        return
    if isinstance(got, Heartbeat):
        assert Heartbeat.decode(got.encode()) == got


def announcement(data: bytes) -> None:
    """A discovery datagram, unsigned and signed: McastError (Unauthenticated included) or an announcement
    that encodes back to itself."""
    for keys in ((), (KEY,)):
        try:
            ad = announce.decode(data, keys)
        except McastError:
            continue
        assert announce.decode(ad.encode(), ()) == ad
        assert announce.decode(ad.encode(KEY), (KEY,)) == ad


def fill_datagram(data: bytes) -> None:
    """A datagram at a fill port, as a request and as an answer, without and with keys: FillError or a value;
    a request encodes back to itself."""
    for keys in (None, KEYS):
        try:
            req = fill.decode_request(data, keys)
        except FillError:
            pass
        else:
            assert fill.decode_request(fill.encode_request(req, KEY), KEYS) == req
        with contextlib.suppress(FillError):
            fill.decode_answer(data, STREAM.encode(), keys)


def datagram(data: bytes) -> None:
    """A udp:// datagram down a subscriber's receive path: frames, the stream key check, the payload."""
    try:
        frames = decode_message(data)
    except McastError:
        return
    assert decode_message(encode_message(frames)) == frames
    for keys in ((), (KEY,)):
        with contextlib.suppress(McastError):
            parse_payload(Verifier(STREAM, keys).open(frames))


def apdu(data: bytes) -> None:
    """APDUs of a few senders into the Python and the C reassembler: the same messages, the same junk count.
    A piece's first byte picks the sender (low 2 bits), or lose() (0x80) or lose_all() (0xFF); and the
    frames the input holds, packetised, come back whole."""
    py, c = Reassembler((b"", b"s"), 512), _pgm_loop.Reassembler((b"", b"s"), 512)
    for piece in pieces(data):
        if not piece:
            continue
        sender, kind = bytes([piece[0] & 3]), piece[0]
        if kind == 0xFF:
            py.lose_all(), c.lose_all()
        elif kind & 0x80:
            py.lose(sender), c.lose(sender)
        else:
            out_py: list[list[bytes]] = []
            out_c: list[list[bytes]] = []
            py.feed(sender, piece[1:], out_py)
            c.feed(sender, piece[1:], out_c)
            assert out_py == out_c, (out_py, out_c)
            assert py.junk == c.junk
    frames = list(pieces(data))
    if frames:
        mss = 32 + 8 * data[0]  # 32..2072: tiny APDUs would spend the run on one message's thousands of pieces
        for r in (Reassembler(), _pgm_loop.Reassembler()):
            out: list[list[bytes]] = []
            for a in packetise(frames, mss):
                r.feed(b"x", a, out)
            assert out == [frames]


def peer_link(data: bytes) -> None:
    """Bytes a peer link reads, in pieces: whole frames (or ProtocolError for a length over the limit), each a
    ZEPS command, a REPLICA-BATCH's batch a batch."""
    deframer, frames = Deframer(MAX_FRAME), []
    fed = b""
    try:
        for piece in pieces(data):
            deframer.feed(piece)
            fed += piece
            while (frame := deframer.next()) is not None:
                frames.append(frame)
    except ProtocolError:
        pass
    taken = b"".join(header(len(f)) + f for f in frames)
    assert fed.startswith(taken) and (deframer.partial or len(fed) - len(taken) < HEADER_SIZE or fed == taken)
    for frame in frames:
        try:
            cmd = P.decode(frame)
            if isinstance(cmd, P.ReplicaBatch):
                B.Batch.parse(cmd.batch)
        except (ProtocolError, BatchError):
            pass


# --- the disk --------------------------------------------------------------------------------------------

_TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None  # tmpfs when there is one: files at every execution
_THREE_RECORDS = B.encode(1, [(10**18, b"k", b"a"), (10**18, b"k", b"b"), (10**18, b"k", b"c")], ts_ns=10**18)


def journal(data: bytes) -> None:
    """A stream directory as a crash or a bad disk may leave it: one segment and its index, from the input
    (a 2-byte big-endian index length, the index, the segment).

    Read before recovery: batches, or JournalError (JournalCorrupt with the offset), never another error. The
    writer's recovery on open: it opens (a torn tail cut) or refuses with JournalCorrupt. A stream that
    verify finds clean (a torn tail is no problem) opens, reads the same batches after as before (a torn
    batch is never served, nothing else is lost) up to the writer's head; in every stream that opens, the
    next append continues the sequence. (Recovery checks the tail from the last index entry it trusts, not
    the whole segment: damage before it is verify's to find, and a reader's to refuse.)
    """
    root = Path(tempfile.mkdtemp(prefix="zeps-fuzz-", dir=_TMP))
    try:
        _journal(root, data)
    finally:  # here, not at exit: libFuzzer ends the process without running Python's exit handlers
        shutil.rmtree(root, ignore_errors=True)


def _journal(root: Path, data: bytes) -> None:
    directory = root / STREAM
    directory.mkdir()
    n = int.from_bytes(data[:2], "big")
    seg_path(directory, 1).write_bytes(data[2 + n :])
    idx_path(directory, 1).write_bytes(data[2 : 2 + n])
    before = _read_all(root)
    clean = verify_root(root).clean  # every batch and index entry checks out; a torn tail is only a note
    try:
        writer = JournalWriter.open(root, STREAM, durability=Durability("never"), index_interval=64)
    except JournalCorrupt:
        assert not clean
        return  # a fault with a valid batch after it: never cut, never skipped
    with writer:
        head = writer.last_seq
        if clean:  # the same batches, a torn one gone, and they end at the head
            after = _read_all(root)
            assert isinstance(before, list) and isinstance(after, list), (before, after)
            assert list(map(bytes, after)) == list(map(bytes, before))
            assert (after[-1].last_seq if after else 0) == head
        writer.append(B.Batch.parse(B.encode(0, [(0, b"k", b"v")])))
        assert [b.first_seq for b in _read_all(root, head + 1)] == [head + 1]  # type: ignore[union-attr]


def stream_files(data: bytes) -> None:
    """The small files beside a stream's segments, from the input's first three pieces: `head`,
    `leader-epochs`, `committed` (each absent when its piece is empty), next to a journal of three records.

    head: None or a sequence in range; leader-epochs: entries or JournalCorrupt, and a node about to lead sets a
    damaged one aside instead of failing; committed: a sequence or None. The writer opens (or refuses with
    JournalError), appends after both its journal and the head file, and a mark opens on what is there.
    """
    root = Path(tempfile.mkdtemp(prefix="zeps-fuzz-", dir=_TMP))
    try:
        _stream_files(root, data)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _stream_files(root: Path, data: bytes) -> None:
    directory = root / STREAM
    directory.mkdir()
    seg_path(directory, 1).write_bytes(_THREE_RECORDS)
    files = [*pieces(data), b"", b"", b""][:3]
    for name, piece in zip((HEAD_NAME, EPOCHS_NAME, MARK_NAME), files, strict=True):
        if piece:
            (directory / name).write_bytes(piece)
    head = read_head(directory)
    assert head is None or (1 <= head[0] < B.MAX_SEQ and head[1] >= 0), head
    with contextlib.suppress(JournalCorrupt):
        assert all(e >= 0 and s >= 0 for e, s in read_epochs(directory))
    mark = read_mark(directory)
    assert mark is None or 0 <= mark <= B.MAX_SEQ
    try:
        writer = JournalWriter.open(root, STREAM, durability=Durability("never"))
    except JournalError:
        return
    with writer:
        expected = max(4, head[0] if head else 0)
        assert writer.last_seq + 1 == expected, (writer.last_seq, head)
        start_epoch(directory, 7, expected)
        assert read_epochs(directory)[-1] == (7, expected)
        if expected < 2**62:
            writer.append(B.Batch.parse(B.encode(0, [(0, b"k", b"v")])))
            assert writer.last_seq == expected
    CommittedMark(directory).close()


def _read_all(root: Path, first: int = 0) -> list[B.Batch] | JournalError:
    """Every batch of the stream from `first` (its first sequence when 0), or the JournalError that stopped it."""
    try:
        reader = JournalReader(root, STREAM)
        with reader.cursor(first or reader.first_seq) as cursor:
            out = []
            while (b := cursor.next_batch()) is not None:
                out.append(b)
            return out
    except JournalError as exc:
        return exc


TARGETS: dict[str, Target] = {
    "command": command,
    "batch": batch,
    "payload": payload,
    "announcement": announcement,
    "fill_datagram": fill_datagram,
    "datagram": datagram,
    "apdu": apdu,
    "peer_link": peer_link,
    "journal": journal,
    "stream_files": stream_files,
}
