"""Chaos: under load, kill -9 the gateway, the replay sidecar and subscribers at random moments, restart them,
and check that nothing was lost, altered, reordered or sequenced twice.

The contracts checked (docs/hardening.md):
- the journal: sequences 1..H contiguous, each issued once; every record exactly as published;
- publishers: every record confirmed is in the journal at the sequence confirmed, exactly once. A record sent
  but not confirmed when the gateway died may or may not have been journaled; the Publisher sends it again
  after reconnecting, and the gateway, which keeps each producer's highest number in the journal, drops it
  if it has it (docs/gateway.md, "Exactly-once publishing");
- subscribers: a subscriber's delivered log, committed with its checkpoint, equals the journal record for
  record, across any number of kill -9s. The Subscriber redelivers from its checkpoint after a restart
  (at-least-once per incarnation); an application that commits its output with the checkpoint, as the one
  here does, gets every record exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from support.feedlab import STREAM

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Checkpoint, Subscriber
from gateway.errors import DataLoss, PublishError
from gateway.journal import JournalReader, verify_root
from gateway.tools.deployment import Deployment
from netlab import Lab
from netlab.procs import MP, HostProcess

pytestmark = pytest.mark.lab

SEED = int(os.environ.get("ZEPS_CHAOS_SEED", "0")) or random.randrange(1, 10**6)
CHAOS_S = 35.0  # how long the kills go on
MAX_KILLS = 16
RATE = 2000.0  # records/s offered by the publisher
CHUNK = 100  # records per confirmed flush
LOG = struct.Struct("<QI")  # a subscriber's delivered log: (seq, CRC32C of key and body) per record


def key(i: int) -> str:
    return f"key{i % 100:03d}"


def body(i: int) -> bytes:
    return (b"%d:" % i).ljust(100, b"x")


def digest(k: bytes, v: bytes) -> int:
    return crc32c(v, crc32c(k))


# --- inside lab hosts ----------------------------------------------------------------------------------------


def publisher(ingest: str, stop: Any) -> dict[str, Any]:
    """Publish records 0, 1, 2... at RATE, confirmed per CHUNK, until `stop`, with one Publisher that rides out
    gateway deaths itself (reconnects, re-sends what is unconfirmed). Returns {id: confirmed seq}, ids issued,
    and the errors seen (flush deadlines passed while the gateway was down: the records stay buffered)."""
    confirmed: dict[int, int] = {}
    errors: Counter[str] = Counter()
    next_id = 0
    started = time.monotonic()
    deadline = started + CHAOS_S + 60
    while True:
        try:
            pub = Publisher(ingest, STREAM, confirm=True, timeout=3, batch_records=50)
            break
        except PublishError as exc:
            errors[exc.reason[:60]] += 1
            assert time.monotonic() < deadline, errors
            time.sleep(0.1)  # the gateway is restarting
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            todo, next_id = range(next_id, next_id + CHUNK), next_id + CHUNK
            for i in todo:
                pub.publish(key(i), body(i))
            while True:
                try:
                    last = pub.flush()
                    break
                except PublishError as exc:  # not confirmed in time: the gateway is down; they stay buffered
                    errors[exc.reason.split(":")[0][:60]] += 1
                    assert time.monotonic() < deadline, errors
            assert last is not None
            # One producer: its records are journaled in order, so a chunk ends at the last sequence confirmed.
            confirmed.update(zip(todo, range(last - len(todo) + 1, last + 1), strict=True))
            time.sleep(max(0.0, started + next_id / RATE - time.monotonic()))
        pub.close()
    finally:
        pub.abort()
    return {"confirmed": confirmed, "issued": next_id, "errors": dict(errors), "reconnects": pub.reconnects}


def subscriber(multicast: list[str], replay: str, workdir: str) -> dict[str, Any]:
    """One incarnation of a subscriber that may be kill -9'd at any moment.

    Its output, the delivered log, is committed with its checkpoint: on start it drops the log entries past the
    checkpoint (delivered, not yet checkpointed: the Subscriber delivers them again from the checkpoint on), and
    it writes each entry (one write(), so a kill never leaves half of one) before it asks for the next record,
    the moment the Subscriber may checkpoint the previous one. It runs until the log reaches the sequence in
    the file `until`, written by the test at the end.
    """
    work = Path(workdir)
    log, losses = work / "delivered", work / "losses"
    committed = Checkpoint(work / "checkpoint").load() or 0
    data = log.read_bytes() if log.exists() else b""
    keep = 0
    while keep + LOG.size <= len(data) and LOG.unpack_from(data, keep)[0] <= committed:
        keep += LOG.size
    with open(log, "ab") as f:
        f.truncate(keep)
    with open(work / "restarts", "a") as f:
        f.write(f"{(len(data) - keep) // LOG.size}\n")  # entries delivered again by this incarnation
    last = LOG.unpack_from(data, keep - LOG.size)[0] if keep else 0
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    until = work / "until"
    with Subscriber(STREAM, multicast=multicast, replay=replay, start="earliest", checkpoint=work / "checkpoint",
                    progress_timeout=1.0) as sub:  # fmt: skip
        while not (until.exists() and last >= int(until.read_text())):
            try:
                rec = sub.next(timeout=0.2)
            except DataLoss as exc:
                with open(losses, "a") as f:
                    f.write(f"{exc}\n")
                continue
            if rec is not None:
                os.write(fd, LOG.pack(rec.seq, digest(rec.key.encode(), rec.body)))
                last = rec.seq
    os.close(fd)
    return {"last": last, "summary": sub.summary()}


# --- the test ------------------------------------------------------------------------------------------------


class Subscribers:
    """Subscriber processes on their hosts, each with a work directory that outlives its incarnations."""

    def __init__(self, lab: Lab, dep: Deployment, root: Path, hosts: list[str]) -> None:
        self.lab, self.dep = lab, dep
        self.work = {h: root / h for h in hosts}
        for path in self.work.values():
            path.mkdir()
        self.procs: dict[str, HostProcess] = {}
        for h in hosts:
            self.start(h)

    def start(self, host: str) -> None:
        self.procs[host] = self.lab.start(
            host, subscriber, self.dep.for_host(host), self.dep.replay, str(self.work[host])
        )

    def kill9(self, host: str) -> None:
        proc = self.procs[host]
        if not proc.is_alive():
            proc.result(0)  # it ended by itself: raise what it raised
            raise AssertionError(f"subscriber on {host} exited on its own")
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)

    def finish(self, head: int, timeout: float) -> dict[str, dict[str, Any]]:
        for path in self.work.values():
            (path / "until.tmp").write_text(str(head))
            (path / "until.tmp").rename(path / "until")
        return {h: p.result(timeout) for h, p in self.procs.items()}


def test_kill_9_at_random_moments_loses_alters_and_reuses_nothing(make_lab, tmp_path: Path, capsys) -> None:
    rng = random.Random(SEED)
    lab = make_lab(["pub", "gw", "sub1", "sub2"])
    dep = Deployment(lab, tmp_path / "journal", STREAM)
    started = time.monotonic()
    kills: Counter[str] = Counter()
    try:
        subs = Subscribers(lab, dep, tmp_path, ["sub1", "sub2"])
        stop = MP.Event()
        pub = lab.start("pub", publisher, dep.ingest, stop)
        while time.monotonic() - started < CHAOS_S and sum(kills.values()) < MAX_KILLS:
            time.sleep(rng.uniform(0.5, 2.5))
            victim = rng.choices(["gateway", "replay", "sub1", "sub2"], weights=(3, 2, 2, 2))[0]
            if victim in ("gateway", "replay"):
                dep.kill9(victim)
                time.sleep(rng.uniform(0.0, 0.5))
                dep.start_gateway() if victim == "gateway" else dep.start_replay()
            else:
                subs.kill9(victim)
                subs.start(victim)
            kills[victim] += 1
        stop.set()
        published = pub.result(timeout=90)
        head = JournalReader(tmp_path / "journal", STREAM).last_seq
        results = subs.finish(head, timeout=90)
    finally:
        problems = dep.close()
    assert not problems, problems
    elapsed = time.monotonic() - started

    report = verify_root(tmp_path / "journal")
    assert report.clean, report.describe()
    with JournalReader(tmp_path / "journal", STREAM).cursor(1) as cursor:
        journal = []
        while (batch := cursor.next_batch()) is not None:
            journal.extend((seq, k.tobytes(), v.tobytes()) for seq, _, k, v in batch.raw())
    assert [seq for seq, _, _ in journal] == list(range(1, head + 1)), "a sequence missing, reused or out of order"
    ids = [int(v.split(b":")[0]) for _, _, v in journal]
    assert all((k, v) == (key(i).encode(), body(i)) for (_, k, v), i in zip(journal, ids, strict=True)), "altered"

    confirmed, issued = published["confirmed"], published["issued"]
    assert set(confirmed) == set(range(issued)), "a record issued was never confirmed"
    assert all(ids[seq - 1] == i for i, seq in confirmed.items()), "a confirmed record is not at its sequence"
    copies = Counter(ids)
    duplicated = {i for i, n in copies.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} records journaled twice, e.g. {sorted(duplicated)[:5]}"

    want = b"".join(LOG.pack(seq, digest(k, v)) for seq, k, v in journal)
    for host, result in results.items():
        assert not (tmp_path / host / "losses").exists(), (tmp_path / host / "losses").read_text()
        assert (tmp_path / host / "delivered").read_bytes() == want, f"{host}: delivered log differs from the journal"
        assert result["last"] == head
    redelivered = sum(int(n) for h in results for n in (tmp_path / h / "restarts").read_text().split())

    assert sum(kills.values()) >= 10, kills
    with capsys.disabled():
        print(
            f"\n  chaos (seed {SEED}): {sum(kills.values())} kill -9s survived ({dict(kills)}) in {elapsed:.0f} s; "
            f"{head} records journaled, {issued} published, none twice ({published['reconnects']} publisher "
            f"reconnects); {redelivered} records redelivered after subscriber restarts and dropped by the "
            f"checkpoint; publisher errors: {published['errors']}",
            flush=True,
        )
