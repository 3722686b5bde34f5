"""Producer state rebuilt from the journal's tail when a gateway starts (gateway.sequencer.producers says why
it can be: every fact in it is in the journal)."""

from __future__ import annotations

import contextlib
import logging
import time

from gateway.errors import JournalTrimmed
from gateway.journal import JournalReader
from gateway.journal.layout import list_segments, seg_path
from gateway.sequencer.producers import ProducerTable

log = logging.getLogger(__name__)


def recover(table: ProducerTable, reader: JournalReader, expiry_s: float, scan_bytes: int) -> None:
    """Rebuild `table` from the tail of `reader`'s journal: the batches of the last `expiry_s`, and of at most
    `scan_bytes` (older producers are taken as new, as if expired)."""
    started = time.monotonic()
    since = reader.seq_for_time(time.time_ns() - int(expiry_s * 1e9))
    segments, budget = list_segments(reader.directory), scan_bytes
    for first in reversed(segments):  # the oldest segment still within the byte budget, from the end
        with contextlib.suppress(FileNotFoundError):
            budget -= seg_path(reader.directory, first).stat().st_size
        if budget < 0:
            since = max(since, first)
            break
    if since > reader.last_seq:
        return
    with reader.cursor(max(since, reader.first_seq)) as cursor:
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
