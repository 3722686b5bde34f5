"""Write the seed corpora (tests/fuzz/corpus/TARGET/): a few small valid inputs per target, made by the encoders.

    python tests/fuzz/seeds.py      rewrites every seed file named here (crash inputs kept beside them stay)

Seeds give the fuzzer the shape of a valid input to mutate from: without them it would spend most of its
executions on magic numbers and lengths. Kept small (a few hundred bytes each), since they are committed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from targets import KEY, STREAM

from gateway.journal import JournalWriter
from gateway.journal.layout import idx_path, seg_path
from gateway.journal.writer import Durability
from gateway.wire import announce, fill
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.apdu import packetise
from gateway.wire.framing import encode_message
from gateway.wire.heartbeat import Heartbeat
from gateway.wire.length_prefixed import header

CORPUS = Path(__file__).resolve().parent / "corpus"
VALUES = {P.Wire.NUMBER_2: 1, P.Wire.NUMBER_4: 7, P.Wire.NUMBER_8: 42, P.Wire.STRING: "s.a", P.Wire.CHUNK: b"xy"}
VALUES[P.Wire.STRINGS] = ("batch", "range")


def records(n: int) -> list[tuple[int, bytes, bytes]]:
    return [(1000 + i, f"k.{i}".encode(), bytes([i]) * (i + 2)) for i in range(n)]


def batches() -> dict[str, bytes]:
    plain = B.Batch.parse(B.encode(5, records(4), ts_ns=99))
    return {
        "plain": bytes(plain.buf),
        "ttl": B.encode(1, [(*r, 500 * i) for i, r in enumerate(records(3))], ts_ns=7, ttl=True),
        "producer": B.encode(9, records(2), producer=(77, 3)),
        "empty": B.empty(3, 8),
        "sparse": plain.select((b"k.1", b"k.3")),
    }


def pieces(chunks: list[bytes]) -> bytes:
    """The inverse of targets.pieces: each chunk (at most 255 bytes) after its length byte."""
    assert all(len(c) < 256 for c in chunks)
    return b"".join(bytes([len(c)]) + c for c in chunks)


def cut(data: bytes, size: int = 255) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


MARK_3 = (3).to_bytes(8, "big") + (3 ^ 0x5A45_5053_4D41_524B).to_bytes(8, "big")  # a committed mark at 3, checked


def journal_seeds() -> dict[str, bytes]:
    """A stream of three batches as the writer leaves it (index entry per batch), whole and with a torn tail."""
    root = Path(tempfile.mkdtemp(prefix="zeps-seed-"))
    try:
        with JournalWriter.open(
            root, STREAM, durability=Durability("never"), index_interval=1, clock=lambda: 10**18
        ) as w:
            for n in (1, 3, 2):
                w.append(B.Batch.parse(B.encode(0, records(n))))
        seg = seg_path(root / STREAM, 1).read_bytes()
        idx = idx_path(root / STREAM, 1).read_bytes()
    finally:
        shutil.rmtree(root)
    whole = len(idx).to_bytes(2, "big") + idx + seg
    return {"whole": whole, "torn": whole[:-9], "no-index": b"\0\0" + seg}


def seeds() -> dict[str, dict[str, bytes]]:
    some = batches()
    hb = Heartbeat(head=12, ts_ns=5, replay="tcp://10.0.0.1:5560", gateway_id=3)
    ad = announce.Announcement(
        announce.GATEWAY,
        0x1A2B,
        "node-a",
        (announce.StreamAd("px", 10, 200, (announce.Channel("udp", "239.192.1.1", 5555),)),),
        "tcp://10.0.0.1:5555",
        "tcp://10.0.0.1:5560",
        sent_ns=1,
        epoch=2,
        leader=True,
    )
    request = fill.FillRequest(4, STREAM, 10, 3)
    frames = [b"s.a", b"hello", b"x" * 300]
    link = [P.Ping(), P.ReplicaCommit(STREAM, 1, 5, 6), P.ReplicaBatch(STREAM, 1, 5, some["plain"])]
    link_bytes = b"".join(header(len(f)) + f for f in map(P.encode, link))
    commands = {
        spec.name: P.encode(
            spec.cls(**{n: P.PROTOCOL if n == "protocol" else VALUES[w] for n, w in spec.fields})  # type: ignore[arg-type]
        )
        for spec in P.COMMANDS.values()
    }
    return {
        "command": commands,
        "batch": some,
        "payload": {
            "batch": some["ttl"],
            "heartbeat": hb.encode(),
            "epoch": Heartbeat(1, 2, "tcp://h:1", 3, 4).encode(),
        },
        "announcement": {"unsigned": ad.encode(), "signed": ad.encode(KEY)},
        "fill_datagram": {
            "request": fill.encode_request(request),
            "request-signed": fill.encode_request(request, KEY),
            "answer": fill.encode_answer(4, some["plain"], STREAM.encode()),
            "answer-signed": fill.encode_answer(4, some["producer"], STREAM.encode(), KEY),
        },
        "datagram": {
            "batch": encode_message([STREAM.encode(), some["plain"]]),
            "signed": encode_message(list(KEY.frames(STREAM.encode(), hb.encode()))),
        },
        "apdu": {
            "two-senders": pieces(
                [bytes([0]) + a for a in packetise(frames, 120)] + [bytes([1]) + a for a in packetise(frames[:2], 60)]
            ),
            "lose": pieces([bytes([0]) + packetise(frames, 100)[1], b"\x80", bytes([2]) + packetise(frames, 250)[0]]),
        },
        "peer_link": {"frames": pieces(cut(link_bytes, 100))},
        "journal": journal_seeds(),
        "stream_files": {
            "all-three": pieces([b"9 1000000000000000000\n", b"3 1\n5 4\n", MARK_3]),
            "damaged": pieces([b"x y", b"3 1\nfive 4\n", bytes(16)]),
        },
    }


def main() -> None:
    for target, files in seeds().items():
        directory = CORPUS / target
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (directory / f"seed-{name}").write_bytes(data)
        print(f"{target}: {len(files)} seeds, {sum(map(len, files.values()))} bytes")


if __name__ == "__main__":
    main()
