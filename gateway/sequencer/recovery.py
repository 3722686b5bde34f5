"""Producer state rebuilt from the journal: from its tail when a gateway starts (`recover`; gateway.sequencer.producers
says why it can be: every fact in it is in the journal), and only where a cut changed it (`after_cut`).

A follower whose journal went past its new leader's cuts it back (gateway.replication.copier) and then copies the
leader's records after the cut. Rebuilding the whole table from the journal's tail there cost 0.36-1.1 s under
load (20 MB read), a silence for every subscriber when the new leader waits for this follower to commit. The cut
changes little, and `after_cut` redoes only that:

- The table is, before the cut, what feeding the journal to `ProducerTable.journaled` in order builds (it is
  fed so live, by the leader's path or by `Lane.append_replica`, or by `recover`): per producer, its last batch.
- A producer whose last batch is at or below the cut point `keep` has that same last batch in the cut journal:
  every batch of it after that one would be later still, and there is none. Its entry stays as it is.
- A producer whose last batch is past `keep` (the dropped tail) is forgotten, then looked for going back from
  `keep`, in windows doubling from `_WINDOW` sequences, each read forward: the last batch of it in the latest
  window holding one is its last batch at or below `keep`, the entry a full rescan would make. The search ends
  once every such producer is found or the rescan's own lower bound (`_horizon`: expiry time, byte budget) is
  passed; one not found by then is unknown to a rescan too (as if expired: its next batch is taken as new).
  A producer the table first noted in the dropped tail has no batch from where the table began noting every
  batch (`complete_from`: 1, or where `recover` read from) up to the cut, but expired ones (older than the
  horizon, journal time growing with the sequence): when only such producers are left, the look back skips
  to below `complete_from`, so a producer new in the dropped tail costs no rescan either.
- The order (least recently seen first) is journal order of the last batches, restored by sequence.
- Capacity is the one fact a cut can bring back: a producer forgotten for `capacity` may rank among the kept
  ones again once the dropped tail's producers fall back. A table that ever forgot one is rebuilt in full.

So the table after the cut equals the one a full rescan of the cut journal builds (tests/unit/
test_producers_cut.py checks it over generated journals), and so does everything after it: the leader's
records copied after `keep` are noted as any replica batch is. One difference is kept on purpose: a producer
noted live from beyond a rescan's byte budget stays known (as on a node that never cut), where a rescan would
take it as new; knowing more only drops re-sends a rescan would journal twice. A publisher re-sending after the failover
(to the new leader, or later to this node when it leads) is told duplicate from new exactly as by a node that
never journaled the dropped tail: those records were never confirmed (the cut keeps the committed mark), so a
re-send of them is new here and is journaled, once.
"""

from __future__ import annotations

import contextlib
import logging
import time

from gateway.errors import JournalTrimmed
from gateway.journal import JournalReader
from gateway.journal.layout import list_segments, seg_path
from gateway.sequencer.producers import Producer, ProducerTable

log = logging.getLogger(__name__)

_WINDOW = 256  # sequences read back from a cut at first (doubling each step back)


def _horizon(reader: JournalReader, expiry_s: float, scan_bytes: int) -> int:
    """The first sequence a rescan reads: that of `expiry_s` ago, or the oldest segment within `scan_bytes` of the
    journal's end if later (older producers are taken as new, as if expired)."""
    since = reader.seq_for_time(time.time_ns() - int(expiry_s * 1e9))
    segments, budget = list_segments(reader.directory), scan_bytes
    for first in reversed(segments):  # the oldest segment still within the byte budget, from the end
        with contextlib.suppress(FileNotFoundError):
            budget -= seg_path(reader.directory, first).stat().st_size
        if budget < 0:
            return max(since, first)
    return since


def recover(table: ProducerTable, reader: JournalReader, expiry_s: float, scan_bytes: int) -> None:
    """Rebuild `table` from the tail of `reader`'s journal: the batches of the last `expiry_s`, and of at most
    `scan_bytes` (older producers are taken as new, as if expired)."""
    started = time.monotonic()
    since = _horizon(reader, expiry_s, scan_bytes)
    if since > reader.last_seq:
        return
    table.complete_from = max(since, reader.first_seq)
    with reader.cursor(table.complete_from) as cursor:
        while True:
            try:
                batch = cursor.next_batch()
            except JournalTrimmed:  # a gap (a cut tail, segments removed): the cursor goes on after it
                continue
            if batch is None:
                break
            table.journaled(batch)
        scanned = cursor.bytes_read
    table.expire(time.time_ns())
    log.info(
        "stream %s: %d producers recovered from %d bytes of journal tail in %.3f s",
        reader.stream,
        len(table),
        scanned,
        time.monotonic() - started,
    )


def after_cut(
    table: ProducerTable,
    reader: JournalReader,
    keep: int,
    expiry_s: float,
    scan_bytes: int,
    window: int = _WINDOW,
) -> ProducerTable:
    """The producer table of `reader`'s journal just cut after sequence `keep`, from `table`, the one right before
    the cut: what a rescan of the cut journal builds, reading back from `keep` only as far as the producers of the
    dropped tail need (see above; `window`: the sequences read back at first). `table` itself, updated, unless it
    ever forgot a producer for capacity."""
    started = time.monotonic()
    if table.evicted:  # capacity forgot producers that may count again: rebuild
        fresh = ProducerTable(table.expiry_ns, table.capacity)
        if keep:
            recover(fresh, reader, expiry_s, scan_bytes)
        return fresh
    gone, scanned, found = table.forget_after(keep), 0, {}
    stale = set(gone)
    unseen = {pid for pid, p in gone.items() if p.first_noted > keep}  # none of theirs from complete_from to keep
    floor = max(_horizon(reader, expiry_s, scan_bytes), reader.first_seq) if stale and keep else keep + 1
    end = keep
    while stale and end >= floor:
        if stale <= unseen:  # only producers first seen in the dropped tail left: skip what the table saw
            end = min(end, table.complete_from - 1)
            if end < floor:
                break
        start = max(end - window + 1, floor)
        with reader.cursor(start) as cursor:
            while True:
                try:
                    batch = cursor.next_batch()
                except JournalTrimmed:  # a gap (see recover)
                    continue
                if batch is None or batch.first_seq > end:
                    break
                if batch.producer is not None and batch.count and batch.producer[0] in stale:
                    pid, first = batch.producer
                    found[pid] = Producer(first + batch.count - 1, batch.last_seq, batch.ts_ns)
            scanned += cursor.bytes_read
        stale -= found.keys()
        end, window = start - 1, window * 2
    table.restore(found)
    table.expire(time.time_ns())
    log.debug(  # the copier logs the reopen's time, once per cut
        "stream %s: producers after the cut at %d: %d of the dropped tail, %d found again from %d bytes in %.3f s",
        reader.stream,
        keep,
        len(gone),
        len(found),
        scanned,
        time.monotonic() - started,
    )
    return table
