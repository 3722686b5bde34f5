"""Do the journals of a replicated group's nodes agree? The checker behind `zeps ha check` (docs/ha.md).

For one stream, over every node's journal, it proves three properties or names the first place one fails:

- **one content per sequence**: wherever a sequence exists, its record is the same (journal time, key, body,
  time to live, producer id and producer number): a sequence was never given to two records;
- **no gap below each node's head**: each node holds every sequence from its first retained one to its head,
  each batch continuing the one before;
- **no record twice**: within each node, every producer's numbers only grow (the gateway's dedup journals a
  producer's record once; a record journaled again under a new sequence would repeat a number).

The nodes are read in lockstep by sequence, one cursor each, so memory grows with the number of producers,
not with the journals. It only reads, so it is safe beside running nodes: heads are taken when the check
starts and records past them are not judged.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gateway.errors import JournalError, JournalTrimmed, NotAJournal
from gateway.journal.reader import JournalReader
from gateway.wire.batch import PRODUCER, Batch


@dataclass(frozen=True, slots=True)
class NodeRange:
    """What one node's journal holds of the stream: sequences first..head (head 0 and first 1 when empty)."""

    first: int
    head: int


@dataclass(frozen=True, slots=True)
class Content:
    """One record as the checker compares it: a digest of every byte that makes it that record."""

    digest: str
    key: str
    size: int

    def plain(self) -> dict[str, object]:
        return {"digest": self.digest, "key": self.key, "bytes": self.size}


@dataclass(slots=True)
class GroupCheck:
    """The outcome for one stream. `checked`: the highest sequence compared; `violation`: one line, or None."""

    stream: str
    nodes: dict[str, NodeRange]
    checked: int = 0
    violation: str | None = None
    divergence: dict[str, object] | None = field(default=None)  # {"seq": S, "nodes": {node: content}}

    @property
    def ok(self) -> bool:
        return self.violation is None

    def plain(self) -> dict[str, object]:
        """As one JSON object (`zeps ha check` prints it as one line)."""
        return {
            "stream": self.stream,
            "ok": self.ok,
            "nodes": {name: {"first": r.first, "head": r.head} for name, r in self.nodes.items()},
            "checked": self.checked,
            "divergence": self.divergence,
            "violation": self.violation,
        }


_RECORD = struct.Struct("<qqqI")  # journal time, the record's own time, ttl, key length: then key, body

# One node's walk yields its batches in order as (first sequence not yet compared, batch), or, where a property
# fails, (sequence, what failed) and ends.
_Item = tuple[int, Batch | str]


def check_group(journals: Sequence[str | os.PathLike[str]], stream: str) -> GroupCheck:
    """Check `stream` across the nodes' journal roots (named by their paths as given). A node without the
    stream counts as an empty journal. Raises NotAJournal if a root is not a journal root at all.

    Nodes copy batches verbatim, so the walk compares whole batches (one memcmp each) and looks at records
    only where batches differ in bytes or in boundaries: then the first record that differs is the divergence.
    """
    names = [os.fspath(j) for j in journals]
    if len(set(names)) != len(names):
        raise ValueError(f"a journal is named twice in {names}: give each node's journal root once")
    readers: dict[str, JournalReader | None] = {}
    for name in names:
        if not Path(name).is_dir():
            raise NotAJournal(f"{name} is not a directory: pass each node's journal root (--journal DIR per node)")
        readers[name] = JournalReader(name, stream) if (Path(name) / stream).is_dir() else None
    ranges = {
        name: NodeRange(r.first_seq, r.last_seq) if r is not None else NodeRange(1, 0) for name, r in readers.items()
    }
    result = GroupCheck(stream, ranges)
    walks = {name: _batches(r, ranges[name]) for name, r in readers.items() if r is not None}
    current = {name: item for name, walk in walks.items() if (item := next(walk, None)) is not None}
    while current:
        seq = min(start for start, _ in current.values())
        here: dict[str, Batch] = {}
        for name, (start, batch) in current.items():
            if start != seq:
                continue
            if isinstance(batch, str):
                result.violation = f"node {name}: {batch}"
                return result
            here[name] = batch
        hi = min([b.last_seq for b in here.values()] + [start - 1 for start, _ in current.values() if start > seq])
        whole = {(b.first_seq, b.last_seq, bytes(b.buf)) for b in here.values()}
        if len(whole) > 1 or next(iter(whole))[:2] != (seq, hi):
            differ = _first_difference(here, seq, hi)
            if differ is not None:
                at, contents = differ
                result.divergence = {"seq": at, "nodes": {name: c.plain() for name, c in contents.items()}}
                text = ", ".join(
                    f"{name} has {c.digest} (key {c.key!r}, {c.size} bytes)" for name, c in contents.items()
                )
                result.violation = f"sequence {at} holds different records: {text}"
                return result
        result.checked = hi
        for name, batch in here.items():
            if batch.last_seq > hi:
                current[name] = (hi + 1, batch)
            elif (item := next(walks[name], None)) is None:
                del current[name]
            else:
                current[name] = item
    return result


def _first_difference(batches: dict[str, Batch], lo: int, hi: int) -> tuple[int, dict[str, Content]] | None:
    """The first sequence in lo..hi whose records differ between the nodes' batches, with each node's record."""
    walks = {name: _contents(batch, lo, hi) for name, batch in batches.items()}
    for seq in range(lo, hi + 1):
        contents = {name: next(walk) for name, walk in walks.items()}
        if len({c.digest for c in contents.values()}) > 1:
            return seq, contents
    return None


def _contents(batch: Batch, lo: int, hi: int) -> Iterator[Content]:
    """Each record lo..hi of a batch as compared: every byte that makes it that record, producer number included."""
    producer = batch.producer
    for seq, ts, key, body, ttl in batch.entries(lo, hi):
        digest = hashlib.blake2b(_RECORD.pack(batch.ts_ns, ts, ttl, len(key)), digest_size=8)
        digest.update(key)
        digest.update(body)
        if producer is not None:
            digest.update(PRODUCER.pack(producer[0], producer[1] + seq - batch.first_seq))
        yield Content(digest.hexdigest(), key.tobytes().decode(errors="replace"), len(body))


def _batches(reader: JournalReader, span: NodeRange) -> Iterator[_Item]:
    """One node's batches from its first sequence to its head, checking continuity and producer numbers."""
    highest: dict[int, tuple[int, int]] = {}  # producer id -> (its highest number, at which sequence)
    expected = span.first
    try:
        with reader.cursor(max(span.first, 1)) as cursor:
            while expected <= span.head:
                batch = cursor.next_batch()
                if batch is None:
                    yield expected, f"holds nothing after {expected - 1}, below its head {span.head}"
                    return
                if (producer := batch.producer) is not None:
                    before = highest.get(producer[0])
                    if before is not None and producer[1] <= before[0]:
                        yield (
                            batch.first_seq,
                            (
                                f"a record twice: producer {producer[0]:#x} number {producer[1]} at sequence "
                                f"{batch.first_seq}, after its number {before[0]} at sequence {before[1]}"
                            ),
                        )
                        return
                    highest[producer[0]] = (producer[1] + batch.last_seq - batch.first_seq, batch.last_seq)
                yield batch.first_seq, batch
                expected = batch.last_seq + 1
    except JournalTrimmed as exc:
        yield exc.seq, f"sequences {exc.seq}..{exc.first_retained - 1} are missing below its head"
    except JournalError as exc:
        yield expected, f"unreadable at sequence {expected}: {exc}"
