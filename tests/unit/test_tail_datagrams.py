"""Tail datagrams (gateway.wire.tail): repetition and XOR parity repair a single loss with no round trip; foreign
and malformed datagrams are refused; the redundancy setting is parsed strictly."""

from __future__ import annotations

import pytest

from gateway.wire import batch as B
from gateway.wire import tail as T

TOKEN = 0x1234_5678_9ABC_DEF0


def payload(first: int, n: int, size: int = 20) -> bytes:
    return B.encode(first, [(seq, b"k", bytes([seq % 256]) * size) for seq in range(first, first + n)])


def firsts(batches: list[B.Batch]) -> list[int]:
    return [b.first_seq for b in batches]


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
        assert got[-1].buf == B.Batch.parse(payload(1 + 10 * lost, 1 + lost, 10 + 7 * lost)).buf
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
