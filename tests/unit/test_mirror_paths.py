"""A mirror's source over several paths (gateway.client.mirror_paths): striping, reassembly, A/B arbitration,
replacement of a failed or stalled path, gaps named; and its doc."""

from __future__ import annotations

from pathlib import Path

from gateway.client import mirror_paths as M
from gateway.wire import batch as B
from gateway.wire import tail as T

DOC = Path(__file__).parents[2] / "docs" / "mirroring.md"


def batch(first: int, last: int) -> B.Batch:
    return B.Batch.parse(B.encode(first, [(seq, b"k", b"%d" % seq) for seq in range(first, last + 1)]))


def datagram(first: int, last: int) -> M.Datagram:
    """A journal batch that came whole in one datagram."""
    b = batch(first, last)
    return M.Datagram(T.Piece(b, first, last, b.crc))


def parts(first: int, last: int, n: int) -> list[M.Datagram]:
    """The journal batch first..last in `n` datagram parts (each naming it), in order."""
    whole = batch(first, last)
    cut = [B.Batch.parse(raw) for _, raw in whole.split(B.HEADER_SIZE + (whole.nbytes - B.HEADER_SIZE) // n + 8)]
    assert len(cut) == n
    return [M.Datagram(T.Piece(part, first, last, whole.crc)) for part in cut]


def take(core: M.SourcePathsCore, now: float | None = None) -> list[M.Action]:
    """The actions after a Tick (at `now`, by default the last event's time): the work is done then."""
    core.on(M.Tick(), core._now if now is None else now)
    actions, core.actions = core.actions, []
    return actions


def released(core: M.SourcePathsCore) -> list[tuple[int, int]]:
    out = []
    while (b := core.pop()) is not None:
        out.append((b.first_seq, b.last_seq))
    return out


def started(paths: int, after: int = 0, **kw: int) -> M.SourcePathsCore:
    core = M.SourcePathsCore(paths, after, **kw)
    assert core.actions == [M.Open(i) for i in range(paths)]
    core.actions = []
    return core


def test_the_doc_shows_the_table() -> None:
    assert M.describe_transitions() in DOC.read_text(), "docs/mirroring.md is stale: paste describe_transitions()"


def test_one_path_subscribes_after_the_head_at_once() -> None:
    core = started(1, after=41)
    assert core.phase is M.Phase.LIVE
    core.on(M.Up(0), 0.0)
    assert take(core) == [M.Subscribe(0, 41)]
    core.on(M.Arrived(0, batch(42, 50)), 0.1)
    assert released(core) == [(42, 50)]


def test_the_catch_up_is_striped_and_released_in_order() -> None:
    core = started(3, after=100, chunk=10, depth=2)
    for i in range(3):
        core.on(M.Up(i), 0.0)
    fetches = [a for a in take(core) if isinstance(a, M.Fetch)]
    assert sorted((f.first, f.last) for f in fetches) == [(101 + 10 * k, 110 + 10 * k) for k in range(6)]
    assert {f.path for f in fetches} == {0, 1, 2}
    by_first = {f.first: f.path for f in fetches}
    core.on(M.Arrived(by_first[111], batch(111, 120)), 0.1)  # the second range first: held
    core.on(M.Arrived(by_first[121], batch(121, 125)), 0.1)
    assert released(core) == []
    core.on(M.Arrived(by_first[101], batch(101, 110)), 0.2)
    assert released(core) == [(101, 110), (111, 120), (121, 125)]
    assert core.next == 126


def test_a_fetch_that_meets_the_head_makes_it_live_on_two_paths_and_the_first_arrival_wins() -> None:
    core = started(3, after=0, chunk=10, depth=1)
    for i in range(3):
        core.on(M.Up(i), 0.0)
    fetches = {f.first: f for f in take(core) if isinstance(f, M.Fetch)}
    assert sorted(fetches) == [1, 11, 21]
    p1, p11, p21 = fetches[1].path, fetches[11].path, fetches[21].path
    core.on(M.Arrived(p1, batch(1, 10)), 0.1)
    core.on(M.Ended(p1, 10), 0.1)
    core.on(M.Arrived(p11, batch(11, 15)), 0.1)
    core.on(M.Ended(p11, 15), 0.1)  # the head is 15: live after it
    assert core.phase is M.Phase.LIVE
    core.on(M.Ended(p21, 15), 0.1)  # beyond the head: nothing
    subs = [a for a in take(core) if isinstance(a, M.Subscribe)]
    assert len(subs) == 2 and {s.after for s in subs} == {15}
    a, b = (s.path for s in subs)
    core.on(M.Arrived(a, batch(16, 20)), 0.2)
    core.on(M.Arrived(b, batch(16, 18)), 0.2)  # the B feed, behind: dropped
    core.on(M.Arrived(b, batch(19, 23)), 0.3)  # ahead of A: its 21..23 win
    core.on(M.Arrived(a, batch(21, 23)), 0.3)
    assert released(core) == [(1, 10), (11, 15), (16, 20), (21, 23)]
    assert core.dropped == 3 + 2 + 3


def test_a_range_left_short_below_the_live_start_is_fetched_again() -> None:
    core = started(2, after=0, chunk=10, depth=1)
    core.on(M.Up(0), 0.0)
    core.on(M.Up(1), 0.0)
    fetches = {f.first: f.path for f in take(core) if isinstance(f, M.Fetch)}
    core.on(M.Ended(fetches[11], 18), 0.1)  # served at head 18: live after 18
    core.on(M.Arrived(fetches[1], batch(1, 5)), 0.1)
    core.on(M.Ended(fetches[1], 5), 0.1)  # served earlier, at head 5: 6..10 are no one's
    again = [a for a in take(core) if isinstance(a, M.Fetch)]
    assert [(f.first, f.last) for f in again] == [(6, 10)]


def test_a_failed_path_gives_its_ranges_back_and_is_opened_again_after_a_backoff() -> None:
    core = started(2, after=0, chunk=10, depth=1)
    core.on(M.Up(0), 0.0)
    core.on(M.Up(1), 0.0)
    fetches = {f.path: f for f in take(core) if isinstance(f, M.Fetch)}
    core.on(M.Arrived(0, batch(fetches[0].first, fetches[0].first + 3)), 0.1)
    core.on(M.Down(0), 0.2)
    core.on(M.Ended(1, fetches[1].last), 0.25)  # path 1 has room: the rest of path 0's range goes first
    again = [a for a in take(core) if isinstance(a, M.Fetch)]
    assert (again[0].path, again[0].first, again[0].last) == (1, fetches[0].first + 4, fetches[0].last)
    core.on(M.Tick(), 0.2 + M.BACKOFF_MIN_S + 0.01)
    assert M.Open(0) in take(core)


def test_a_stalled_path_is_replaced_but_not_while_the_mirror_is_not_reading() -> None:
    core = started(2, after=0, chunk=10, depth=1, stall_s=1.0)
    core.on(M.Up(0), 0.0)
    core.on(M.Up(1), 0.0)
    fetches = {f.first: f.path for f in take(core) if isinstance(f, M.Fetch)}
    stuck = fetches[1]
    core.on(M.Tick(reading=False), 5.0)  # the mirror site was slow: nobody's fault
    core.on(M.Tick(), 5.5)
    assert take(core) == []
    core.on(M.Tick(), 6.1)
    closes = [a for a in take(core) if isinstance(a, M.Close)]
    assert [c.path for c in closes] == [stuck]
    assert "sent nothing for 1.1 s" in closes[0].why


def test_a_gap_or_a_trim_names_the_records_gone() -> None:
    core = started(2, after=1000, chunk=10, depth=1)
    core.on(M.Up(0), 0.0)
    core.on(M.Up(1), 0.0)
    fetches = {f.first: f.path for f in take(core) if isinstance(f, M.Fetch)}
    core.on(M.Trimmed(fetches[1001], 1500), 0.1)
    assert core.gone == (1001, 1499, 1500)
    gap = started(1, after=0)
    gap.on(M.Up(0), 0.0)
    assert take(gap) == [M.Subscribe(0, 0)]
    gap.on(M.Arrived(0, batch(7, 9)), 0.1)  # the source's first retained is 7
    assert gap.gone == (1, 6, 7)
    assert released(gap) == []


def test_each_paths_tally_counts_what_was_taken_from_it_and_the_live_first_arrivals() -> None:
    """Rule 10: the records released from each path sum to what was handed out; live, the copy that won counts."""
    tallies = [M.PathTally() for _ in range(2)]
    core = M.SourcePathsCore(2, 0, chunk=10, depth=1, tallies=tallies)
    core.on(M.Up(0), 0.0)
    core.on(M.Up(1), 0.0)
    assert [t.up for t in tallies] == [True, True]
    assert [(f.path, f.first) for f in take(core) if isinstance(f, M.Fetch)] == [(0, 1), (1, 11)]
    core.on(M.Arrived(1, batch(11, 15)), 0.1)
    core.on(M.Ended(1, 15), 0.1)  # the head is 15
    core.on(M.Arrived(0, batch(1, 10)), 0.2)
    core.on(M.Ended(0, 10), 0.2)
    assert sorted(s.path for s in take(core) if isinstance(s, M.Subscribe)) == [0, 1]
    core.on(M.Arrived(0, batch(16, 20)), 0.3)
    core.on(M.Arrived(1, batch(16, 22)), 0.4)  # 16..20 dropped, 21..22 won by path 1
    core.on(M.Arrived(0, batch(21, 22)), 0.5)  # dropped
    assert released(core) == [(1, 10), (11, 15), (16, 20), (21, 22)]
    assert [t.records for t in tallies] == [10 + 5, 5 + 2]  # their sum: the 22 handed out
    assert [t.first_arrivals for t in tallies] == [5, 2]
    assert tallies[1].bytes == len(batch(11, 15).buf) + len(batch(16, 22).buf)
    assert [t.arrived_at for t in tallies] == [0.5, 0.4]
    core.on(M.Down(1), 0.6)
    assert not tallies[1].up and tallies[1].reopens == 0
    assert M.Open(1) in take(core, 0.6 + M.BACKOFF_MIN_S)  # opened again after its backoff: one reconnect
    assert tallies[1].reopens == 1 and tallies[1].records == 7


def test_the_datagram_tail_is_asked_on_a_subscribed_path_and_again_when_that_path_is_replaced() -> None:
    core = started(2, after=0, chunk=10, depth=1, tail=True)
    core.on(M.Up(0), 0.0)
    core.on(M.Up(1), 0.0)
    fetches = [a for a in take(core) if isinstance(a, M.Fetch)]
    core.on(M.Ended(fetches[0].path, 0), 0.1)  # the source's head is 0: live at once
    actions = take(core)
    assert [a for a in actions if isinstance(a, M.AskTail)] == [M.AskTail(0)]
    assert not [a for a in take(core) if isinstance(a, M.AskTail)]  # once
    core.on(M.Down(0), 0.2)
    assert [a for a in take(core) if isinstance(a, M.AskTail)] == [M.AskTail(1)]


def test_no_tail_is_asked_unless_wanted() -> None:
    core = started(1, after=5)
    core.on(M.Up(0), 0.0)
    assert take(core) == [M.Subscribe(0, 5)]


def test_datagram_batches_merge_with_the_subscription_first_arrival_wins_and_never_name_a_loss() -> None:
    core = started(1, after=10, tail=True)
    core.on(M.Up(0), 0.0)
    assert take(core) == [M.Subscribe(0, 10), M.AskTail(0)]
    core.on(datagram(11, 20), 0.1)  # the datagram came first
    core.on(datagram(31, 40), 0.1)  # one lost between: held, no loss named
    assert released(core) == [(11, 20)]
    assert core.gone is None
    core.on(M.Arrived(0, batch(11, 20)), 0.2)  # the TCP copy, later: dropped
    core.on(M.Arrived(0, batch(21, 30)), 0.2)  # the one the datagrams lost: TCP fills it
    assert released(core) == [(21, 30), (31, 40)]
    core.on(M.Arrived(0, batch(31, 40)), 0.3)
    assert released(core) == []
    assert (core.tail_records, core.tallies[0].records, core.dropped) == (20, 10, 20)
    assert core.gone is None


def test_a_datagram_far_beyond_the_mirror_is_not_held() -> None:
    core = started(1, after=0, tail=True)
    core.on(datagram(core.ahead + 10, core.ahead + 12), 0.0)
    assert (core.held, core.tail_far) == (0, 1)


def test_a_journal_batchs_datagram_parts_are_joined_and_only_the_whole_batch_is_released() -> None:
    core = started(1, after=10, tail=True)
    core.on(M.Up(0), 0.0)
    take(core)
    p0, p1, p2 = parts(11, 40, 3)
    core.on(p2, 0.1)
    core.on(p0, 0.1)
    assert released(core) == []  # never a part alone
    core.on(p1, 0.1)
    out = core.pop()
    assert out is not None and bytes(out.buf) == bytes(batch(11, 40).buf)  # the journal's batch, byte for byte
    assert (core.tail_joined, core.tail_records, core.dropped) == (1, 30, 0)
    core.on(M.Arrived(0, batch(11, 40)), 0.2)  # the TCP copy, later: dropped
    assert released(core) == [] and core.dropped == 30


def test_the_tcp_copy_wins_over_parts_still_missing_one_and_those_parts_are_then_dropped() -> None:
    core = started(1, after=10, tail=True)
    core.on(M.Up(0), 0.0)
    take(core)
    p0, _, p2 = parts(11, 40, 3)  # the middle part lost for good
    core.on(p0, 0.1)
    core.on(p2, 0.1)
    core.on(M.Arrived(0, batch(11, 40)), 0.2)
    assert released(core) == [(11, 40)]  # the first complete copy, at once
    take(core, 0.3)
    assert core._parts == {} and core.dropped == p0.piece.batch.count + p2.piece.batch.count
    assert (core.tail_joined, core.tail_records) == (0, 0)


def test_parts_whose_join_is_not_the_batch_they_name_are_dropped() -> None:
    core = started(1, after=10, tail=True)
    core.on(M.Up(0), 0.0)
    take(core)
    for part in parts(11, 40, 3):
        core.on(M.Datagram(part.piece._replace(crc=part.piece.crc ^ 1)), 0.1)
    assert released(core) == [] and (core.tail_joined, core.tail_unjoined) == (0, 1)
