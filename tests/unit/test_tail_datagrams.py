"""Tail datagrams (gateway.wire.tail): repetition and XOR parity repair a single loss with no round trip; a
batch larger than a datagram goes in parts that name it; foreign and malformed datagrams are refused; the
redundancy setting is parsed strictly."""

from __future__ import annotations

import pytest

from gateway.wire import batch as B
from gateway.wire import tail as T

TOKEN = 0x1234_5678_9ABC_DEF0


def journal_batch(first: int, n: int, size: int = 20) -> B.Batch:
    return B.Batch.parse(B.encode(first, [(seq, b"k", bytes([seq % 256]) * size) for seq in range(first, first + n)]))


def payload(first: int, n: int, size: int = 20) -> bytes:
    """A data payload of a journal batch that fits one datagram: `of` and the batch."""
    (whole,) = T.pieces(journal_batch(first, n, size), 1400)
    return whole


def firsts(pieces: list[T.Piece]) -> list[int]:
    return [p.batch.first_seq for p in pieces]


def test_redundancy_is_parsed_strictly() -> None:
    assert T.Redundancy.parse("repeat:1") == T.Redundancy("repeat", 1)
    assert str(T.Redundancy.parse("xor:4")) == "xor:4"
    for bad in ("xor", "xor:1", "xor:17", "repeat:0", "repeat:4", "fec:2", "xor:-2", ""):
        with pytest.raises(ValueError, match="give repeat:N"):
            T.Redundancy.parse(bad)


def test_repeat_sends_each_datagram_again_after_the_spacing_and_the_decoder_takes_it_once() -> None:
    enc = T.TailEncoder(TOKEN, T.Redundancy("repeat", 2, spacing_s=0.005))
    now = enc.push(payload(1, 3), 0.0)
    assert len(now) == 1 and enc.next_due == 0.005
    assert enc.due(0.004) == []
    again = enc.due(0.005) + enc.due(0.010)
    assert again == now * 2 and enc.next_due is None
    dec = T.TailDecoder(TOKEN)
    assert firsts(dec.receive(again[0])) == [1]  # the first copy was lost: the repeat carries it
    assert dec.receive(again[1]) == []
    assert (dec.stats.data, dec.stats.duplicates) == (1, 1)


def test_xor_parity_rebuilds_any_one_lost_datagram_of_a_group() -> None:
    for lost in range(4):
        enc = T.TailEncoder(TOKEN, T.Redundancy("xor", 4))
        sent: list[bytes] = []
        for k in range(4):
            sent += enc.push(payload(1 + 10 * k, 1 + k, size=10 + 7 * k), float(k))  # unequal lengths
        assert len(sent) == 5  # four data, one parity
        dec = T.TailDecoder(TOKEN)
        got = [b for i, d in enumerate(sent) if i != lost for b in dec.receive(d)]
        assert sorted(firsts(got)) == [1, 11, 21, 31]
        assert got[-1].batch.buf == journal_batch(1 + 10 * lost, 1 + lost, 10 + 7 * lost).buf
        assert dec.stats.rebuilt == 1


def test_a_parity_that_comes_before_the_rest_of_its_group_repairs_when_they_come() -> None:
    enc = T.TailEncoder(TOKEN, T.Redundancy("xor", 2))
    d0, d1, parity = enc.push(payload(1, 2), 0.0) + enc.push(payload(3, 2), 0.0)
    dec = T.TailDecoder(TOKEN)
    assert dec.receive(parity) == []
    assert firsts(dec.receive(d1)) == [3, 1]  # d1, then d0 rebuilt
    assert dec.receive(d0) == []  # a copy of what was rebuilt


def test_two_losses_in_a_group_are_left_to_the_tcp_copy() -> None:
    enc = T.TailEncoder(TOKEN, T.Redundancy("xor", 3))
    sent = enc.push(payload(1, 1), 0.0) + enc.push(payload(2, 1), 0.0) + enc.push(payload(3, 1), 0.0)
    dec = T.TailDecoder(TOKEN)
    assert firsts(dec.receive(sent[2]) + dec.receive(sent[3])) == [3]
    assert dec.stats.rebuilt == 0


def test_an_open_group_is_closed_by_the_spacing_with_the_parity_of_what_it_has() -> None:
    enc = T.TailEncoder(TOKEN, T.Redundancy("xor", 4, spacing_s=0.005))
    d0 = enc.push(payload(1, 2), 1.0)[0]
    assert enc.next_due == 1.005
    (parity,) = enc.due(1.005)
    assert enc.next_due is None
    dec = T.TailDecoder(TOKEN)
    assert firsts(dec.receive(parity)) == [1]  # a group of one: its parity is the datagram itself
    assert dec.receive(d0) == []


def test_foreign_malformed_and_corrupt_datagrams_are_refused() -> None:
    enc = T.TailEncoder(TOKEN, T.Redundancy("repeat", 1))
    (good,) = enc.push(payload(1, 2), 0.0)
    dec = T.TailDecoder(TOKEN + 1)
    assert dec.receive(good) == []  # another tail's token
    dec = T.TailDecoder(TOKEN)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    for junk in (b"", b"ZF", good[:10], bytes(corrupt), b"XX" + good[2:]):
        assert dec.receive(junk) == []
    assert dec.stats.rejected == 5 and dec.stats.data == 0
    assert firsts(dec.receive(good)) == [1]


def test_a_batch_larger_than_a_datagram_goes_in_parts_each_naming_it() -> None:
    big = journal_batch(100, 60, size=40)  # 60 x 58 bytes: about 3.5 KB
    payloads = T.pieces(big, 1400)
    assert len(payloads) == 3 and max(map(len, payloads)) <= 1400
    enc, dec = T.TailEncoder(TOKEN, T.Redundancy("xor", 4)), T.TailDecoder(TOKEN)
    got = [p for payload in payloads for d in enc.push(payload, 0.0) for p in dec.receive(d)]
    assert [(p.first, p.last, p.crc) for p in got] == [(100, 159, big.crc)] * 3
    assert not any(p.whole for p in got)
    assert B.join([p.batch for p in got]) == bytes(big.buf)
    (small,) = dec.receive(enc.push(payload(200, 2), 0.0)[0])
    assert small.whole and (small.first, small.last) == (200, 201)


def test_a_batch_that_is_not_what_its_of_names_is_refused() -> None:
    batch = journal_batch(10, 3)
    enc, dec = T.TailEncoder(TOKEN, T.Redundancy("repeat", 1)), T.TailDecoder(TOKEN)
    for of in ((11, 12, batch.crc), (10, 12, batch.crc ^ 1)):  # beyond its range; whole with another CRC
        assert dec.receive(enc.push(T.OF.pack(*of) + bytes(batch.buf), 0.0)[0]) == []
    assert dec.stats.rejected == 2
    assert firsts(dec.receive(enc.push(T.OF.pack(5, 12, 0) + bytes(batch.buf), 0.0)[0])) == [10]  # a part
