"""The journal: per-stream append-only segment files of record batches, exactly as they were multicast.

The gateway appends through the stream's one JournalWriter (which assigns sequences and journal time, and
fsyncs per its Durability); the replay sidecar reads through JournalReader cursors in another process,
following the tail without locks. inspect_root / verify_root back `zeps journal inspect|verify`; check_group
(journals of several nodes of a group) backs `zeps ha check`.
See docs/journal.md for the on-disk format and the rules.
"""

from gateway.errors import JournalCorrupt, JournalError, JournalLocked, JournalTrimmed, NotAJournal
from gateway.journal.crosscheck import GroupCheck, check_group
from gateway.journal.reader import Cursor, JournalReader
from gateway.journal.tools import (
    Finding,
    StreamInfo,
    VerifyReport,
    inspect_root,
    iso_utc,
    journal_streams,
    tail_fault,
    truncate_at,
    verify_root,
)
from gateway.journal.writer import Durability, JournalWriter, RecoveryReport, Retention

__all__ = [
    "Cursor",
    "Durability",
    "Finding",
    "GroupCheck",
    "JournalCorrupt",
    "JournalError",
    "JournalLocked",
    "JournalReader",
    "JournalTrimmed",
    "JournalWriter",
    "NotAJournal",
    "RecoveryReport",
    "Retention",
    "StreamInfo",
    "VerifyReport",
    "check_group",
    "inspect_root",
    "iso_utc",
    "journal_streams",
    "tail_fault",
    "truncate_at",
    "verify_root",
]
