"""Power loss, not just kill -9: a real gateway journals confirmed batches under strace, is killed with -9, and
its journal is made to look as a power loss leaves it (tests/support/powerloss.py: unsynced bytes dropped,
torn at a random byte, or zeroed). Then the gateway starts again on it, recovers, and the journal is read.

- --fsync always and group: every record the gateway confirmed is in the journal, at its sequence.
- --fsync never: confirmed records may be lost (a confirm means written, not synced: docs/journal.md), and
  what survives is a prefix of what was journaled.
- every mode: the journal reads clean after the restart: a torn last batch is cut on start, never served.
- a loss that kept a later unsynced write and lost an earlier one ("reorder") leaves a hole with valid batches
  after it: the gateway refuses to start, naming `zeps journal repair`, which cuts at the hole; no record a
  --fsync always or group gateway confirmed lies past it.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.powerloss import Ledger, kill_traced, strace
from support.servers import STREAM, GatewayProcess, Raw

from gateway.errors import JournalTrimmed
from gateway.journal import JournalReader, verify_root
from gateway.wire import batch as B
from gateway.wire import protocol as P

pytestmark = pytest.mark.timeout(240)

BATCHES = 400  # of PER records, sent with up to WINDOW unconfirmed
PER = 5
WINDOW = 16
BURST = 40  # batches sent at the end without waiting, then the kill: some are written and not yet synced
LOSSES = ("drop", "torn", "zeros", "reorder")
ZEPS = [sys.executable, "-m", "gateway.cli"]


def body(i: int, j: int) -> bytes:
    return b"%d.%d;" % (i, j) + b"x" * 60


def publish_then_kill(gw: GatewayProcess, seed: int) -> tuple[dict[int, bytes], list[bytes]]:
    """Publish batches over one connection up to a random one, then a burst of BURST more, and kill -9 the
    gateway at once; the confirmed records (sequence -> body) and every body sent, in order."""
    client = Raw(gw.ingest)
    client.attach(STREAM, (P.FEATURE_BATCH, P.FEATURE_CONFIRM))
    sent: list[list[bytes]] = []
    confirmed: dict[int, bytes] = {}
    rng = random.Random(seed)
    kill_at = rng.randrange(BATCHES // 2, BATCHES - BURST)
    try:
        for i in range(BATCHES):
            bodies = [body(i, j) for j in range(PER)]
            client.send(P.PublishBatch(B.encode(0, [(0, b"k", b) for b in bodies])))
            sent.append(bodies)
            if i == kill_at + BURST:
                break
            while (i < kill_at and len(sent) - len(confirmed) // PER > WINDOW) or (
                client.sock.poll(0) and len(confirmed) < len(sent) * PER
            ):
                ok = client.expect(P.PublishOk, timeout=10)
                assert ok.count == PER  # type: ignore[attr-defined]
                for j, b in enumerate(sent[len(confirmed) // PER]):
                    confirmed[ok.sequence + j] = b  # type: ignore[attr-defined]
        time.sleep(rng.uniform(0, 0.04))  # inside a group commit's 50 ms, at a random point
        kill_traced(gw.proc.pid)
        gw.proc.wait(10)
    finally:
        client.close()
    return confirmed, [b for bodies in sent for b in bodies]


@pytest.mark.parametrize("mode", ["always", "group", "never"])
def test_power_loss_keeps_every_confirmed_record(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, log = tmp_path / "journal", tmp_path / "strace.log"
    # A group commit every 50 ms, so that a kill finds written, unsynced batches (default 5 ms).
    opts = ("--fsync", mode, "--fsync-ms", "50") if mode == "group" else ("--fsync", mode)
    gw = GatewayProcess(root, *opts, streams=(STREAM,), wrap=tuple(strace(log)))
    confirmed, sent = publish_then_kill(gw, seed=len(mode))
    ledger = Ledger.read(log, root)
    assert confirmed and ledger.files, "nothing was confirmed or traced"
    for how in LOSSES:
        copy = tmp_path / how
        shutil.copytree(root, copy)
        lost = ledger.lose(how, random.Random(how), at=copy)
        refused = start_and_stop(copy, opts)
        if refused:  # a hole with valid batches after it: never skipped, the operator repairs
            assert how == "reorder" and "journal corrupt" in refused and "zeps journal repair" in refused, refused
            # Its exit status says whether verify is clean afterwards: not yet, the deleted index is rebuilt on open.
            repair = subprocess.run([*ZEPS, "journal", "repair", str(copy), "--yes"], capture_output=True, check=False)
            assert b"discard from" in repair.stdout, repair.stdout
            assert not start_and_stop(copy, opts)
        problems = verify_root(copy).problems  # after a repair, the discarded sequences: never reused, a gap
        assert all(refused and "discarded by truncate_at" in p.message for p in problems), problems
        records = read(copy, gap_allowed=bool(refused))  # JournalCorrupt on anything served not whole and valid
        got = dict(records)
        assert [seq for seq, _ in records] == list(range(1, len(records) + 1))
        assert [b for _, b in records] == sent[: len(records)]  # a prefix of what was sent, nothing else
        missing = [seq for seq in confirmed if got.get(seq) != confirmed[seq]]
        if mode != "never":
            assert not missing, f"{how}: {len(missing)} confirmed records lost, e.g. {missing[:5]}"
        with capsys.disabled():
            print(
                f"\n  power loss, --fsync {mode}, {how}: {sum(lost.values())} unsynced bytes lost in {len(lost)} "
                f"files; {len(confirmed)} confirmed, {len(records)} journaled after, {len(missing)} confirmed lost"
                + ("; refused to start, repaired" if refused else ""),
                flush=True,
            )


def start_and_stop(root: Path, opts: tuple[str, ...]) -> str:
    """Start the gateway on `root` (it recovers the journal) and stop it: "" or, if it refused to start, why."""
    try:
        GatewayProcess(root, *opts, streams=(STREAM,)).stop()
    except AssertionError as exc:  # wait_ready: the process exited, with its stderr
        return str(exc)
    return ""


def read(root: Path, *, gap_allowed: bool) -> list[tuple[int, bytes]]:
    """(seq, body) of every record from 1 on, up to the gap a repair leaves (the sequences it discarded)."""
    out: list[tuple[int, bytes]] = []
    try:
        with JournalReader(root, STREAM).cursor(1) as cursor:
            while (batch := cursor.next_batch()) is not None:
                out.extend((r.seq, r.body) for r in batch.records())
    except JournalTrimmed:
        assert gap_allowed
    return out
