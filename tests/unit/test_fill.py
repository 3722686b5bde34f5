"""Fill datagrams: the codec round-trips and refuses junk; the sidecar's answerer keeps to its limits; the
subscriber's side asks again on its timer and hands a range to TCP after its tries.

Datagrams here go over loopback only; between lab hosts, under loss: tests/lab/test_fill_lab.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.client.datagram_fills import STALE, FillHedge
from gateway.errors import FillError
from gateway.journal import JournalWriter
from gateway.sidecar.fills import REQUEST_COST, FillAnswerer, FillLimits
from gateway.wire import batch as B
from gateway.wire import fill as F
from gateway.wire.streamkey import StreamKey

KEY = StreamKey(b"k" * 32)
OTHER = StreamKey(b"o" * 32)
requests = st.builds(
    F.FillRequest,
    st.integers(0, F.MAX_REQUEST_ID),
    st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=60),
    st.integers(1, 2**63),
    st.integers(1, F.MAX_COUNT),
)


@given(requests, st.booleans())
def test_requests_round_trip(req: F.FillRequest, signed: bool) -> None:
    key = KEY if signed else None
    assert F.decode_request(F.encode_request(req, key), {KEY.id: KEY} if signed else None) == req


@given(requests, st.data())
def test_a_cut_or_padded_request_is_refused(req: F.FillRequest, data: st.DataObject) -> None:
    raw = F.encode_request(req)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(FillError):
        F.decode_request(raw[:cut])
    with pytest.raises(FillError):
        F.decode_request(raw + data.draw(st.binary(min_size=1, max_size=23)))


@given(st.binary(max_size=300))
def test_junk_is_refused_or_decodes_to_a_valid_request(junk: bytes) -> None:
    try:
        req = F.decode_request(junk)
    except FillError:
        return
    assert req.first >= 1 and req.count >= 1 and req.stream


@given(requests)
def test_with_a_key_a_request_must_carry_its_tag(req: F.FillRequest) -> None:
    keys = {KEY.id: KEY}
    for raw in (F.encode_request(req), F.encode_request(req, OTHER)):
        with pytest.raises(FillError):
            F.decode_request(raw, keys)
    signed = bytearray(F.encode_request(req, KEY))
    signed[10] ^= 1  # the first sequence, changed in flight
    with pytest.raises(FillError):
        F.decode_request(bytes(signed), keys)


def test_an_answer_carries_a_batch_as_it_is() -> None:
    raw = B.encode(7, [(0, b"k", b"v" * 20), (0, b"k2", b"w")])
    for key in (None, KEY):
        rid, batch = F.decode_answer(F.encode_answer(9, raw, b"s", key), b"s", {KEY.id: KEY} if key else None)
        assert (rid, bytes(batch.buf), batch.first_seq, batch.last_seq) == (9, raw, 7, 8)
    with pytest.raises(FillError):  # signed for another stream
        F.decode_answer(F.encode_answer(9, raw, b"t", KEY), b"s", {KEY.id: KEY})
    with pytest.raises(FillError):  # a request is no answer
        F.decode_answer(F.encode_request(F.FillRequest(1, "s", 1, 1)), b"s")
    damaged = bytearray(F.encode_answer(9, raw, b"s"))
    damaged[-1] ^= 1
    with pytest.raises(FillError, match="damaged"):
        F.decode_answer(bytes(damaged), b"s")


# --- the sidecar's answerer -----------------------------------------------------------------------------


def body(seq: int) -> bytes:
    return b"%08d" % seq + b"x" * 92


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Path]:
    """Stream "s": records 1..2000 of 100-byte bodies in journal batches of 100 (too large for a datagram)."""
    with JournalWriter.open(tmp_path, "s") as w:
        for first in range(1, 2001, 100):
            w.append(B.Batch.parse(B.encode(first, [(0, b"key", body(s)) for s in range(first, first + 100)])))
    yield tmp_path


def ask(answerer: FillAnswerer, first: int, count: int, *, stream: str = "s", host: str = "10.0.0.2",
        now: float = 0.0, key: StreamKey | None = None) -> list[B.Batch]:  # fmt: skip
    raw = F.encode_request(F.FillRequest(5, stream, first, count), key)
    out = answerer.answer(raw, host, now)
    assert all(len(d) <= answerer.limits.datagram_bytes for d in out)
    return [F.decode_answer(d, stream.encode(), answerer.keys)[1] for d in out]


def records(batches: list[B.Batch]) -> list[int]:
    return [seq for b in batches for seq, _, _, _ in b.raw()]


def test_an_answer_holds_the_range_cut_to_fit_datagrams(journal: Path) -> None:
    answerer = FillAnswerer(journal, FillLimits())
    got = ask(answerer, 95, 12)  # across two journal batches
    assert records(got) == list(range(95, 107))
    assert all(bytes(b.buf[B.HEADER_SIZE :]) for b in got)
    assert [bytes(v) for b in got for *_, v in b.raw()] == [body(s) for s in range(95, 107)]


def test_an_answer_stops_at_the_journal_head_and_at_its_byte_cap(journal: Path) -> None:
    answerer = FillAnswerer(journal, FillLimits(max_answer_bytes=5000))
    assert records(ask(answerer, 1995, 100)) == list(range(1995, 2001))
    got = ask(answerer, 1, 1000)
    assert sum(b.nbytes + F.HEAD.size for b in got) <= 5000
    assert records(got) == list(range(1, len(records(got)) + 1))
    assert ask(answerer, 2001, 10) == []


def test_malformed_huge_and_unknown_requests_get_nothing(journal: Path) -> None:
    answerer = FillAnswerer(journal, FillLimits(max_records=100))
    assert answerer.answer(b"\x00junk", "10.0.0.2", 0.0) == []
    assert ask(answerer, 1, 101) == []
    assert ask(answerer, 1, 10, stream="nope") == []
    assert ask(answerer, 1, 10, stream="../s") == []
    assert answerer.stats.dropped == {"malformed": 1, "range": 1, "stream": 2}


@pytest.fixture
def small_batches(tmp_path: Path) -> Iterator[Path]:
    """Stream "s": records 1..3000 in journal batches of one (about 200 KiB: a few index entries apart)."""
    with JournalWriter.open(tmp_path, "s") as w:
        for seq in range(1, 3001):
            w.append(B.Batch.parse(B.encode(seq, [(0, b"key", body(seq))])))
    yield tmp_path


def test_gaps_in_rising_order_are_found_from_where_the_last_answer_stopped(small_batches: Path) -> None:
    answerer = FillAnswerer(small_batches, FillLimits())
    assert records(ask(answerer, 2990, 2)) == [2990, 2991]
    searched = answerer.stats.skipped  # from the index entry before 2990: hundreds of one-record batches
    assert records(ask(answerer, 2995, 3)) == [2995, 2996, 2997]
    assert answerer.stats.skipped - searched == 3  # 2992..2994, not the index entry's batches again
    assert answerer.stats.resumed == 1
    assert records(ask(answerer, 2996, 4)) == [2996, 2997, 2998, 2999]  # behind the kept cursor: a new one
    assert records(ask(answerer, 1, 2)) == [1, 2]
    assert answerer.stats.resumed == 1
    assert records(ask(answerer, 3000, 5)) == [3000]
    assert records(ask(answerer, 3001, 1)) == []  # at the head: the kept cursor waits there
    assert answerer.stats.resumed == 3


def test_a_kept_cursor_idle_for_a_second_is_closed(small_batches: Path) -> None:
    answerer = FillAnswerer(small_batches, FillLimits())
    assert records(ask(answerer, 10, 1, now=5.0)) == [10]
    answerer.forget_idle(5.5)
    assert records(ask(answerer, 11, 1, now=5.6)) == [11]
    assert answerer.stats.resumed == 1
    answerer.forget_idle(6.6)
    assert records(ask(answerer, 12, 1, now=6.7)) == [12]
    assert answerer.stats.resumed == 1  # a new cursor: the kept one was closed
    answerer.close()


def test_a_source_gets_its_rate_and_no_more(journal: Path) -> None:
    limits = FillLimits(rate_bytes=10_000, burst_bytes=20_000)
    answerer = FillAnswerer(journal, limits)
    sent = sum(b.nbytes + F.HEAD.size for _ in range(50) for b in ask(answerer, 1, 1000, now=0.0))
    assert sent <= limits.burst_bytes
    assert answerer.stats.dropped["rate"] > 0
    assert ask(answerer, 1, 10, host="10.0.0.3") != []  # another host has its own bucket
    later = sum(b.nbytes + F.HEAD.size for _ in range(50) for b in ask(answerer, 1, 1000, now=1.0))
    assert later <= limits.rate_bytes + REQUEST_COST


def test_with_a_key_only_signed_requests_are_answered_and_answers_are_signed(journal: Path) -> None:
    answerer = FillAnswerer(journal, FillLimits(), KEY)
    assert answerer.answer(F.encode_request(F.FillRequest(1, "s", 1, 5)), "10.0.0.2", 0.0) == []
    assert answerer.answer(F.encode_request(F.FillRequest(1, "s", 1, 5), OTHER), "10.0.0.2", 0.0) == []
    assert records(ask(answerer, 1, 5, key=KEY)) == [1, 2, 3, 4, 5]
    assert answerer.stats.dropped == {"malformed": 2}


# --- the subscriber's side (over loopback) --------------------------------------------------------------


def test_a_batch_beyond_a_hole_waits_for_it_and_late_answers_are_stale() -> None:
    hedge = FillHedge("s")
    assert hedge.ask(4, 1, 9, 0.0) and [r.first for r in hedge.outbox] == [1]

    def answer(first: int, last: int) -> list[tuple[int, int]]:
        batch = B.Batch.parse(B.encode(first, [(0, b"k", b"v")] * (last - first + 1)))
        return [(rid, b.first_seq) for rid, b in hedge.answered(4, batch, 0.001)]

    # 7..9 and 4..6 arrive before 1..3: never a batch beyond what the range has received, or the reconciler
    # would take the hole for a range the journal lacks.
    assert answer(7, 9) == [] and answer(4, 6) == []
    assert answer(1, 3) == [(4, 1), (4, 4), (4, 7)]
    assert not hedge.asks and hedge.srtt == pytest.approx(0.001)
    assert answer(1, 3) == [(STALE, 1)]  # a repeat's answer: used only where it continues the stream
