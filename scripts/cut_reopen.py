"""What a follower's reopen after a cut costs: the full rescan of the journal's tail it used to do
(gateway.sequencer.recovery.recover) against keeping the table but for the dropped tail (`after_cut`).

Usage: python scripts/cut_reopen.py [MB] [RUNS] [RECORDS] [TAIL]. Journals MB (default 20) of one producer's
batches (RECORDS records of 200 bytes each, default 10: a paced publisher's), then a dropped tail of 5 batches:
the producer's last ones (TAIL `same`, the default), or a new producer's (`new`: one seen nowhere else); per run,
on fresh copies of that journal, cuts it and times each way alternately, checking that both build the same table.
The load average is printed before and after: on a shared machine the times are noisy, their ratio less so.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gateway.journal import JournalReader, JournalWriter
from gateway.journal.tools import cut_after
from gateway.sequencer.producers import ProducerTable
from gateway.sequencer.recovery import after_cut, recover
from gateway.wire import batch as B

STREAM, VALUE = "s", b"x" * 200
EXPIRY_S, SCAN_BYTES, CAPACITY = 3600.0, 1 << 30, 100_000  # the gateway's defaults


def journal(root: Path, megabytes: int, records: int, tail: str) -> tuple[ProducerTable, int]:
    """The journal, the table its writer's gateway holds, and the sequence to cut after."""
    table, pseq = ProducerTable(int(EXPIRY_S * 1e9), CAPACITY), 0
    writer = JournalWriter.open(root, STREAM)
    try:

        def publish(pid: int = 7) -> None:
            nonlocal pseq
            batch = B.Batch.parse(B.encode(0, [(0, b"k", VALUE)] * records, producer=(pid, pseq)))
            table.journaled(B.Batch.parse(writer.append(batch)))
            pseq += records

        while writer.last_seq * (len(VALUE) + 20) < megabytes << 20:
            publish()
        keep = writer.last_seq  # what the new leader has too; the next 5 batches it lacks
        for _ in range(5):
            publish(7 if tail == "same" else 8)
    finally:
        writer.close()
    return table, keep


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    records = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    tail = sys.argv[4] if len(sys.argv) > 4 else "same"
    print(f"load before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        table, keep = journal(base, megabytes, records, tail)
        print(f"journal: {megabytes} MB in batches of {records} records, cut after {keep}, tail: {tail} producer")
        for run in range(runs):
            times = {}
            tables = {}
            for way in ("rescan", "after_cut"):
                root = Path(tmp) / way
                shutil.copytree(base, root)
                cut_after(root, STREAM, keep)
                reader = JournalReader(root, STREAM)
                started = time.monotonic()
                if way == "rescan":
                    tables[way] = ProducerTable(table.expiry_ns, CAPACITY)
                    recover(tables[way], reader, EXPIRY_S, SCAN_BYTES)
                else:
                    held = ProducerTable(table.expiry_ns, CAPACITY)
                    held.restore(dict(table.items()))
                    tables[way] = after_cut(held, reader, keep, EXPIRY_S, SCAN_BYTES)
                times[way] = time.monotonic() - started
                shutil.rmtree(root)
            rescan, kept = (
                [(pid, p.last_pseq, p.last_seq, p.seen_ns) for pid, p in t.items()] for t in tables.values()
            )
            same = rescan == kept
            print(
                f"run {run + 1}: rescan {times['rescan'] * 1000:.1f} ms, after_cut {times['after_cut'] * 1000:.2f} ms, "
                f"ratio {times['rescan'] / times['after_cut']:.0f}x, same table: {same}"
            )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
