"""The sans-IO replay session (gateway.sidecar.session.Session), driven directly against an in-memory journal.

The fake is of the journal only (the `Journal` protocol the session is written against): batches in a list,
retention by moving the first retained sequence, growth by appending. Everything the session does (commands,
credit, the order of frames, TRIMMED and FETCH-END) is the real code; frames are decoded with the real codec.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gateway.errors import JournalTrimmed
from gateway.sidecar import session as S
from gateway.sidecar.session import GRANTABLE, Session
from gateway.wire import batch as B
from gateway.wire import protocol as P

STREAM = "orders"
BATCH = 10  # records per journal batch in these tests


def journal_batch(first: int, keys: list[str], ts_ns: int = 0) -> B.Batch:
    """A dense journal batch of one record per key, numbered from `first`, bodies b"<seq>"."""
    records = [(ts_ns, key.encode(), str(first + i).encode()) for i, key in enumerate(keys)]
    return B.Batch.parse(B.resequence(B.Batch.parse(B.encode(0, records)), first, ts_ns))


class FakeCursor:
    def __init__(self, journal: FakeJournal, from_seq: int) -> None:
        self.journal = journal
        self.next_seq = from_seq
        self.closed = False

    def next_batch(self) -> B.Batch | None:
        assert not self.closed, "read after close"
        if self.next_seq < self.journal.first_seq:  # retention passed this reader: it moves on, and says so
            seq, self.next_seq = self.next_seq, self.journal.first_seq
            raise JournalTrimmed(STREAM, seq, self.journal.first_seq)
        for batch in self.journal.batches:
            if batch.last_seq >= self.next_seq:
                self.next_seq = batch.last_seq + 1
                return batch
        return None

    def close(self) -> None:
        self.closed = True


class FakeJournal:
    """Batches of `BATCH` records, sequences from 1, journal time 1000 * first sequence of each batch."""

    def __init__(self, records: int = 30, keys: tuple[str, ...] = ("k",)) -> None:
        self.batches: list[B.Batch] = []
        self.cursors: list[FakeCursor] = []
        self.keys = keys
        self.append(records)

    def append(self, records: int) -> None:
        first = self.last_seq + 1
        for start in range(first, first + records, BATCH):
            n = min(BATCH, first + records - start)
            keys = [self.keys[(start + i) % len(self.keys)] for i in range(n)]
            self.batches.append(journal_batch(start, keys, ts_ns=1000 * start))

    def trim_before(self, seq: int) -> None:
        """Retention: drop every batch that ends before `seq` (whole batches, as segments are)."""
        self.batches = [b for b in self.batches if b.last_seq >= seq]

    @property
    def first_seq(self) -> int:
        return self.batches[0].first_seq if self.batches else self.last_seq + 1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else 0

    def seq_for_time(self, ts_ns: int) -> int:
        return next((b.first_seq for b in self.batches if b.ts_ns >= ts_ns), self.last_seq + 1)

    def cursor(self, from_seq: int) -> FakeCursor:
        if from_seq < self.first_seq:
            raise JournalTrimmed(STREAM, from_seq, self.first_seq)
        cursor = FakeCursor(self, from_seq)
        self.cursors.append(cursor)
        return cursor


def session(journal: FakeJournal, *features: str, max_fetches: int = 4) -> Session:
    """An attached session past its ATTACH-OK (and EXTEND-OK when `features` are asked for)."""
    s = Session(b"\x00\x01", STREAM, journal, max_fetches=max_fetches, now=0.0)
    assert drain(s) == [P.AttachOk()]
    if features:
        assert s.handle(P.Extend(features), 0.0)
        assert drain(s) == [P.ExtendOk(tuple(sorted(GRANTABLE.intersection(features))))]
    return s


def drain(s: Session, reads: int = 1000) -> list[P.Command]:
    """What the socket loop sends in one turn of `reads` journal reads: every frame peek() allows, decoded."""
    s.begin_turn(reads)
    sent = []
    while (frame := s.peek()) is not None:
        sent.append(P.decode(frame))
        s.pop()
    return sent


def seqs(commands: list[P.Command]) -> list[int]:
    """The record sequences delivered by DELIVER / DELIVER-BATCH frames, in order."""
    out: list[int] = []
    for cmd in commands:
        if isinstance(cmd, P.Deliver):
            out.append(cmd.sequence)
        elif isinstance(cmd, P.DeliverBatch):
            out += [seq for seq, *_ in B.Batch.parse(cmd.batch).raw()]
    return out


def coverage(commands: list[P.Command]) -> list[tuple[int, int]]:
    """The (first, last) coverage of each DELIVER-BATCH, in order."""
    batches = [B.Batch.parse(c.batch) for c in commands if isinstance(c, P.DeliverBatch)]
    return [(b.first_seq, b.last_seq) for b in batches]


# --- attach and negotiation -----------------------------------------------------------------------------------


def test_attach_ok_is_sent_first_without_credit() -> None:
    s = Session(b"id", STREAM, FakeJournal(), max_fetches=1, now=5.0)
    assert s.credit == 0
    assert drain(s) == [P.AttachOk()]
    assert drain(s) == []  # nothing else until the client asks


def test_extend_grants_what_the_sidecar_has_once_right_after_attach() -> None:
    s = Session(b"id", STREAM, FakeJournal(), max_fetches=1, now=0.0)
    assert s.handle(P.Extend((P.FEATURE_BATCH, P.FEATURE_RANGE, P.FEATURE_CONFIRM, "teleport")), 0.0)
    assert drain(s) == [P.AttachOk(), P.ExtendOk((P.FEATURE_BATCH, P.FEATURE_RANGE))]
    assert s.features == {P.FEATURE_BATCH, P.FEATURE_RANGE}
    assert not s.handle(P.Extend((P.FEATURE_TIME,)), 0.0)
    [invalid] = drain(s)
    assert isinstance(invalid, P.Invalid) and "once" in invalid.reason
    assert P.FEATURE_TIME not in s.features


def test_snapshot_is_granted_only_with_a_snapshot_source_and_batches() -> None:
    plain = session(FakeJournal(), P.FEATURE_BATCH, P.FEATURE_SNAPSHOT)
    assert P.FEATURE_SNAPSHOT not in plain.features  # this session has no snapshot source


def test_extend_after_another_command_is_refused() -> None:
    s = session(FakeJournal())
    s.handle(P.Ping(), 0.0)
    assert not s.handle(P.Extend((P.FEATURE_BATCH,)), 0.0)
    assert [type(c) for c in drain(s)] == [P.PingOk, P.Invalid]


# --- subscribe ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("features", [(), (P.FEATURE_BATCH,)], ids=["deliver", "deliver-batch"])
def test_subscribe_from_a_sequence_delivers_every_later_record_in_order(features: tuple[str, ...]) -> None:
    s = session(FakeJournal(30), *features)
    assert s.handle(P.Subscribe("", 14), 0.0)  # latest=14: "I have up to 14"
    assert s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert sent[0] == P.SubscribeOk()
    assert seqs(sent[1:]) == list(range(15, 31))
    if features:
        assert coverage(sent[1:]) == [(15, 20), (21, 30)]  # the first journal batch is cut at the start
    else:
        assert sent[1] == P.Deliver(15, "k", b"15")
    assert s.at_tail and not s.has_work


def test_subscribe_with_latest_zero_starts_at_the_first_retained_record() -> None:
    journal = FakeJournal(30)
    journal.trim_before(11)
    s = session(journal, P.FEATURE_BATCH, P.FEATURE_RANGE)
    s.handle(P.Subscribe("", 0), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert seqs(sent) == list(range(11, 31))
    assert not any(isinstance(c, P.Trimmed) for c in sent)  # "I have nothing" loses nothing


def test_subscription_follows_the_tail_when_woken() -> None:
    journal = FakeJournal(10)
    s = session(journal, P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 0), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    assert seqs(drain(s)) == list(range(1, 11))
    assert s.tailing
    journal.append(5)
    assert drain(s) == []  # the session looks again only when told the journal may have grown
    s.wake()
    assert seqs(drain(s)) == list(range(11, 16))


def test_subscribe_time_starts_at_the_first_batch_journaled_at_or_after_it() -> None:
    journal = FakeJournal(30)  # batches journaled at 1000, 11000, 21000
    s = session(journal, P.FEATURE_BATCH, P.FEATURE_TIME)
    s.handle(P.SubscribeTime("", 5000), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    assert seqs(drain(s)) == list(range(11, 31))


def test_a_pattern_filters_keys_and_the_coverage_stays_gap_free() -> None:
    journal = FakeJournal(30, keys=("a/1", "b/2", "b/3"))
    s = session(journal, P.FEATURE_BATCH)
    s.handle(P.Subscribe("a/", 0), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)[1:]
    assert seqs(sent) == [seq for seq in range(1, 31) if seq % 3 == 0]  # sequence n has key n % 3
    spans = coverage(sent)
    assert spans[0][0] == 1 and spans[-1][1] == 30
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans))  # nothing left uncovered


def test_batches_holding_nothing_for_a_pattern_become_one_empty_batch_covering_them() -> None:
    journal = FakeJournal(0)
    for first, key in ((1, "a/x"), (11, "b/y"), (21, "b/z"), (31, "a/x")):
        journal.batches.append(journal_batch(first, [key] * BATCH))
    s = session(journal, P.FEATURE_BATCH)
    s.handle(P.Subscribe("a/", 0), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)[1:]
    assert coverage(sent) == [(1, 10), (11, 30), (31, 40)]  # one empty batch for 11..30, not one per batch
    assert seqs(sent) == [*range(1, 11), *range(31, 41)]


def test_resubscribing_drops_what_the_old_subscription_had_not_sent() -> None:
    journal = FakeJournal(30)
    s = session(journal, P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 0), 0.0)
    s.handle(P.Credit(1), 0.0)
    assert seqs(drain(s)) == list(range(1, 11))  # one frame: the credit went below zero
    s.handle(P.Subscribe("", 25), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert sent[0] == P.SubscribeOk()
    assert seqs(sent) == list(range(26, 31))
    assert all(c.closed for c in journal.cursors[:-1])  # the old subscription's cursor was released


# --- credit ---------------------------------------------------------------------------------------------------


def test_no_data_without_credit_and_a_grant_releases_it() -> None:
    s = session(FakeJournal(30), P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 0), 0.0)
    assert drain(s) == [P.SubscribeOk()]
    assert not s.ready
    s.handle(P.Credit(1 << 20), 0.0)
    assert s.ready
    assert seqs(drain(s)) == list(range(1, 31))


def test_credit_is_charged_per_data_frame_and_a_stall_is_reported() -> None:
    journal = FakeJournal(30)
    s = session(journal, P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 0), 0.0)
    drain(s)
    frame = P.encode(P.DeliverBatch(journal.batches[0].buf))
    s.handle(P.Credit(len(frame) + 1), 0.0)  # one frame and one byte: the second frame overshoots
    s.begin_turn(100)
    first = s.peek()
    assert first == frame
    sent = s.pop()
    assert (sent.data_bytes, sent.records, sent.credit_stall) == (len(frame), BATCH, False)
    assert s.credit == 1
    assert s.peek() is not None
    sent = s.pop()
    assert sent.credit_stall and s.credit == 0  # an overshoot is forgiven: the credit stops at zero
    assert s.peek() is None and not s.ready
    s.handle(P.Credit(1 << 20), 0.0)
    assert seqs(drain(s)) == list(range(21, 31))


def test_replies_go_first_and_cost_no_credit() -> None:
    s = session(FakeJournal(30), P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 0), 0.0)
    s.handle(P.Credit(1), 0.0)
    s.begin_turn(100)
    assert s.peek() is not None  # SUBSCRIBE-OK
    s.pop()
    assert isinstance(P.decode(s.peek() or b""), P.DeliverBatch)  # produced, waiting to be sent
    s.handle(P.Ping(), 0.0)
    assert drain(s)[:1] == [P.PingOk()]  # overtakes the data frame that was already produced
    assert s.credit == 0


def test_a_turn_reads_at_most_its_budget_of_journal_batches() -> None:
    s = session(FakeJournal(50), P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 0), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    assert seqs(drain(s, reads=2)) == list(range(1, 21))
    assert seqs(drain(s, reads=2)) == list(range(21, 41))


# --- fetch ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("features", [(P.FEATURE_RANGE,), (P.FEATURE_RANGE, P.FEATURE_BATCH)], ids=["plain", "batch"])
def test_fetch_delivers_exactly_the_range_then_fetch_end(features: tuple[str, ...]) -> None:
    journal = FakeJournal(30)
    s = session(journal, *features)
    assert s.handle(P.Fetch(7, "", 5, 12), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert seqs(sent) == list(range(5, 13))
    assert sent[-1] == P.FetchEnd(7, 5, 12)
    assert not s.fetches and all(c.closed for c in journal.cursors)


def test_fetch_past_the_head_ends_at_the_head() -> None:
    s = session(FakeJournal(30), P.FEATURE_RANGE, P.FEATURE_BATCH)
    s.handle(P.Fetch(1, "", 25, B.MAX_SEQ), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert seqs(sent) == list(range(25, 31))
    assert sent[-1] == P.FetchEnd(1, 25, 30)


def test_fetch_from_zero_starts_at_the_first_retained_and_fetches_go_before_the_subscription() -> None:
    journal = FakeJournal(30)
    journal.trim_before(11)
    s = session(journal, P.FEATURE_RANGE, P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 25), 0.0)
    s.handle(P.Fetch(2, "", 0, 15), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert sent[0] == P.SubscribeOk()
    end = sent.index(P.FetchEnd(2, 11, 15))
    assert seqs(sent[:end]) == list(range(11, 16))
    assert seqs(sent[end:]) == list(range(26, 31))


def test_fetch_needs_range_and_a_sane_range_and_a_free_slot() -> None:
    s = session(FakeJournal(30))
    assert not s.handle(P.Fetch(1, "", 1, 5), 0.0)
    [refused] = drain(s)
    assert isinstance(refused, P.Invalid) and "'range'" in refused.reason

    s = session(FakeJournal(30), P.FEATURE_RANGE, max_fetches=1)
    s.handle(P.Fetch(1, "", 9, 5), 0.0)
    s.handle(P.Fetch(2, "", 1, 5), 0.0)
    s.handle(P.Fetch(3, "", 6, 9), 0.0)
    reasons = [c.reason for c in drain(s) if isinstance(c, P.Invalid)]
    assert len(reasons) == 2
    assert "first 9 is after last 5" in reasons[0] and "1 fetches outstanding" in reasons[1]
    assert [f.request_id for f in s.fetches] == [2]


# --- retention ------------------------------------------------------------------------------------------------


def test_trimmed_range_is_reported_with_range_and_delivery_resumes_at_the_first_retained() -> None:
    journal = FakeJournal(30)
    journal.trim_before(11)
    s = session(journal, P.FEATURE_RANGE, P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 3), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert sent[:2] == [P.SubscribeOk(), P.Trimmed(4, 11)]
    assert seqs(sent) == list(range(11, 31))


def test_trimmed_without_range_continues_silently() -> None:
    journal = FakeJournal(30)
    journal.trim_before(11)
    s = session(journal)
    s.handle(P.Subscribe("", 3), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert not any(isinstance(c, P.Trimmed) for c in sent)
    assert seqs(sent) == list(range(11, 31))


def test_fetch_of_a_trimmed_range_says_what_was_lost_then_ends() -> None:
    journal = FakeJournal(30)
    journal.trim_before(21)
    s = session(journal, P.FEATURE_RANGE, P.FEATURE_BATCH)
    s.handle(P.Fetch(5, "", 2, 25), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    sent = drain(s)
    assert sent[0] == P.Trimmed(2, 21)
    assert seqs(sent) == list(range(21, 26))
    assert sent[-1] == P.FetchEnd(5, 2, 25)


def test_retention_passing_a_reader_mid_stream_is_reported_where_it_happened() -> None:
    journal = FakeJournal(30)
    s = session(journal, P.FEATURE_RANGE, P.FEATURE_BATCH)
    s.handle(P.Subscribe("", 0), 0.0)
    s.handle(P.Credit(1 << 20), 0.0)
    assert seqs(drain(s, reads=1)) == list(range(1, 11))
    journal.trim_before(21)  # the cursor stands at 11, now gone
    sent = drain(s)
    assert sent[0] == P.Trimmed(11, 21)
    assert seqs(sent) == list(range(21, 31))


# --- commands a replay session refuses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cmd", "reason"),
    [
        (P.Deliver(1, "k", b"v"), "sent by servers"),
        (P.AttachOk(), "sent by servers"),
        (P.Publish("k", b"v"), "publish to the gateway's ingest endpoint"),
        (P.SubscribeTime("", 0), "needs the 'time' extension"),
        (P.Snapshot(()), "needs the 'snapshot' extension"),
        (P.Attach(P.PROTOCOL, P.VERSION, STREAM), "ATTACH is not expected here"),
    ],
    ids=lambda v: v.NAME if isinstance(v, P.Command) else "",
)
def test_bad_commands_are_answered_with_invalid_and_the_session_carries_on(cmd: P.Command, reason: str) -> None:
    s = session(FakeJournal(10))
    assert not s.handle(cmd, 1.0)
    [invalid] = drain(s)
    assert isinstance(invalid, P.Invalid) and reason in invalid.reason, invalid
    assert s.handle(P.Subscribe("", 0), 2.0) and s.handle(P.Credit(1 << 20), 2.0)
    assert seqs(drain(s)) == list(range(1, 11))


def test_any_command_counts_as_hearing_from_the_client() -> None:
    s = session(FakeJournal(10))
    s.ping(3.0)
    assert drain(s) == [P.Ping()]
    assert s.pinged_at == 3.0
    s.handle(P.PingOk(), 4.0)
    assert (s.last_heard, s.pinged_at) == (4.0, 0.0)


def test_detach_ends_the_session_for_the_loop_to_drop() -> None:
    s = session(FakeJournal(10))
    assert s.handle(P.Detach(), 1.0) and s.phase is S.Phase.DETACHED
    assert s.handle(P.Ping(), 2.0) and not s.replies  # ended: nothing more is answered


def test_the_doc_embeds_the_command_table_of_the_sessions_methods() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "replay.md").read_text()
    assert S.describe_transitions() in doc, "docs/replay.md is stale: paste describe_transitions()"
    assert set(S.TRANSITIONS) == set(S.Phase)
    for row in S.TRANSITIONS.values():
        for function in filter(None, [*row.on.values(), *(go.guard for go in row.go)]):
            assert getattr(Session, function.__name__) is function


def test_close_releases_every_cursor() -> None:
    journal = FakeJournal(30)
    s = session(journal, P.FEATURE_RANGE)
    s.handle(P.Subscribe("", 0), 0.0)
    s.handle(P.Fetch(1, "", 1, 25), 0.0)
    s.handle(P.Credit(1), 0.0)
    drain(s)
    assert any(not c.closed for c in journal.cursors)
    s.close()
    assert all(c.closed for c in journal.cursors)


def test_a_turn_ends_at_its_frame_count_or_its_deadline_whichever_comes_first() -> None:
    """One big answer (a long FETCH) holds the socket loop no longer than a turn's deadline, nor for more frames
    than its count; the first frame always goes, so every ready client moves at each turn."""
    counted = S.Turn(3, deadline=10.0)
    for now in (0.0, 1.0, 2.0, 3.0, 4.0):
        if counted.allows(now):
            counted.served += 1
    assert counted.served == 3
    timed = S.Turn(256, deadline=10.0)
    assert timed.allows(11.0)  # the first frame, however late the turn began
    timed.served = 1
    assert timed.allows(9.999) and not timed.allows(10.0) and not timed.allows(11.0)
