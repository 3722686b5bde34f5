"""The data pipeline on a real local Spark: the `zeps` data source (batch over the journal, streaming over a real
`zeps replay` sidecar), `zeps export` and `zeps analyze`, and the Spark-less install.

One Spark session (tests/process/conftest.py) serves every Spark test; it is local[2] and bound to loopback.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.servers import start_sidecar

from gateway.cli.main import main
from gateway.journal import JournalWriter, iso_utc
from gateway.journal.layout import idx_path, list_segments, seg_path
from gateway.spark.analyze import ACCURACY, NS, QUANTILES, analyze, summary
from gateway.spark.source import JournalScan, ReplayStream, SeqRange
from gateway.wire import batch as B

BASE = 1_750_000_000 * NS
STREAM = "ticks"


# --- fixtures -----------------------------------------------------------------------------------------------


@dataclass
class Clock:
    """The journal's clock: the test sets the journal time of each batch."""

    now: int = BASE

    def __call__(self) -> int:
        return self.now


@dataclass
class Journal:
    """A stream written here by JournalWriter, with what was written: records and each record's journal time."""

    root: Path
    stream: str
    writer: JournalWriter
    clock: Clock
    rng: random.Random
    records: list[B.Record] = field(default_factory=list)
    journal_ts: dict[int, int] = field(default_factory=dict)  # seq -> journal time of its batch
    batch_ts: list[int] = field(default_factory=list)  # journal time per batch, in order

    def write(self, batches: int, per_batch: int = 10) -> None:
        """Publish times spread over the previous 3 ms; batch journal times 2 ms apart; bodies 0..300 bytes;
        keys skewed (k0 most, k5 rare, one key that is not UTF-8) so per-key numbers differ."""
        for _ in range(batches):
            self.clock.now += 2_000_000
            recs = []
            for _ in range(per_batch):
                n = len(self.records) + len(recs)
                key = b"\xffraw" if n % 997 == 500 else b"k%d" % min(int(self.rng.expovariate(0.7)), 5)
                body = (b"%d;" % n + self.rng.randbytes(self.rng.randrange(0, 300)))[: self.rng.randrange(0, 300)]
                recs.append((self.clock.now - self.rng.randrange(0, 3_000_000), key, body))
            sealed = B.Batch.parse(self.writer.append(B.Batch.parse(B.encode(0, recs))))
            self.batch_ts.append(sealed.ts_ns)
            for rec in sealed.records():
                self.records.append(rec)
                self.journal_ts[rec.seq] = sealed.ts_ns

    def rows(self, lo: int = 1, hi: int = 2**63) -> list[tuple]:
        return [(r.seq, r.ts_ns, r.key, r.body) for r in self.records if lo <= r.seq <= hi]


def make_journal(root: Path, stream: str, batches: int, per_batch: int = 10, *, seed: int = 7) -> Journal:
    clock = Clock()
    writer = JournalWriter.open(root, stream, segment_bytes=256 * 1024, index_interval=4096, clock=clock)
    journal = Journal(root, stream, writer, clock, random.Random(seed))
    journal.write(batches, per_batch)
    return journal


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journal]:
    """2,000 batches of 10 records over about 10 segments."""
    root = tmp_path_factory.mktemp("spark") / "journal"
    j = make_journal(root, STREAM, 2000)
    yield j
    j.writer.close()


@pytest.fixture(scope="module")
def sidecar(journal: Journal) -> Iterator[str]:
    with start_sidecar(journal.root) as side:
        yield side.endpoint


def read(spark, journal: Journal, **options: object):
    reader = spark.read.format("zeps").option("stream", journal.stream)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load(str(journal.root))


def collect(df) -> list[tuple]:
    return sorted((r.seq, r.ts_ns, r.key, bytes(r.body)) for r in df.collect())


def zeps_history(endpoint: str, stream: str, *args: str) -> list[tuple]:
    cmd = [sys.executable, "-m", "gateway.cli", "history", "--replay", endpoint, "--stream", stream, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return [(r["seq"], r["ts_ns"], r["key"], base64.b64decode(r["body_b64"])) for r in rows]


# --- batch --------------------------------------------------------------------------------------------------


def test_batch_read_equals_zeps_history_record_for_record(spark, journal: Journal, sidecar: str) -> None:
    df = read(spark, journal)
    assert df.columns == ["stream", "seq", "ts_ns", "key", "body"]
    assert df.rdd.getNumPartitions() == len(list_segments(journal.root / journal.stream)) > 5
    history = zeps_history(sidecar, journal.stream)
    assert len(history) == len(journal.records) == 20_000
    assert collect(df) == history == journal.rows()
    assert {r.stream for r in df.select("stream").distinct().collect()} == {journal.stream}
    assert any("\ufffd" in key for _, _, key, _ in history)  # the non-UTF-8 key is decoded alike

    # Sequence and time ranges.
    assert collect(read(spark, journal, fromSeq=4321, toSeq=9876)) == zeps_history(
        sidecar, journal.stream, "--from", "4321", "--to", "9876"
    )
    since = journal.batch_ts[1234] - 1_000_000  # between two batches' journal times
    iso = iso_utc(since)[:-4] + "Z"  # whole microseconds, as --from parses them
    from_time = collect(read(spark, journal, fromTime=iso))
    assert from_time == zeps_history(sidecar, journal.stream, "--from", iso)
    assert from_time[0][0] == 12_341  # the first record of batch 1234


def test_ranges_are_resolved_by_the_index_into_segment_partitions(spark, journal: Journal) -> None:
    segments = list_segments(journal.root / journal.stream)
    assert not any(5000 < s <= 5100 for s in segments), "the range should sit inside one segment"
    assert JournalScan(str(journal.root), journal.stream, lo=5000, hi=5100).partitions() == [SeqRange(5000, 5100)]

    # A time range: only the segments holding it, bounds exactly at batch boundaries.
    t0, t1 = journal.batch_ts[700], journal.batch_ts[1499]
    parts = JournalScan(str(journal.root), journal.stream, from_ns=t0, to_ns=t1).partitions()
    assert parts[0].lo == 7001 and parts[-1].hi == 15_000
    assert all(a.hi + 1 == b.lo for a, b in itertools.pairwise(parts))
    assert len(parts) == sum(
        1 for s, n in zip(segments, [*segments[1:], 2**62], strict=True) if s <= 15_000 and n > 7001
    )

    df = read(spark, journal, fromTime=t0, toTime=t1, journalTime="true")
    assert df.rdd.getNumPartitions() == len(parts)
    with pytest.raises(Exception, match="option fromSeq='-5': expected an integer >= 0"):
        read(spark, journal, fromSeq=-5).count()
    with pytest.raises(ValueError, match="startingSeq 'soon'"):
        ReplayStream.from_options({"replay": "tcp://127.0.0.1:1", "stream": "s", "startingSeq": "soon"})
    rows = df.select("seq", "journal_ts_ns").collect()
    assert sorted(r.seq for r in rows) == list(range(7001, 15_001))
    assert all(journal.journal_ts[r.seq] == r.journal_ts_ns for r in rows)


# --- analyze ------------------------------------------------------------------------------------------------


def near_quantiles(values: list[int], got: tuple[int, ...]) -> bool:
    """Whether `got` are percentile_approx's QUANTILES of `values`: the smallest v with at least q of the values
    <= v, give or take the rank error n / ACCURACY it guarantees."""
    ordered, slack = sorted(values), math.ceil(len(values) / ACCURACY)
    ranks = [max(0, math.ceil(q * len(values)) - 1) for q in QUANTILES]
    return all(
        ordered[max(0, r - slack)] <= v <= ordered[min(len(values) - 1, r + slack)]
        for r, v in zip(ranks, got, strict=True)
    )


def test_analyze_matches_plain_python_and_audits_gaps(spark, journal: Journal, tmp_path: Path) -> None:
    # A copy of the journal with two segments removed by hand: the gap audit must name exactly those.
    root = tmp_path / "journal"
    shutil.copytree(journal.root / journal.stream, root / journal.stream, ignore=shutil.ignore_patterns("writer.lock"))
    segments = list_segments(root / journal.stream)
    removed = []
    for i in (2, 5):
        removed.append((segments[i], segments[i + 1] - 1))
        seg_path(root / journal.stream, segments[i]).unlink()
        idx_path(root / journal.stream, segments[i]).unlink()
    kept = [r for r in journal.records if not any(lo <= r.seq <= hi for lo, hi in removed)]

    df = spark.read.format("zeps").option("stream", journal.stream).option("journalTime", "true").load(str(root))
    with summary(df) as slim:
        report = analyze(slim, journal.stream)

    by_key: dict[str, list[B.Record]] = defaultdict(list)
    for r in kept:
        by_key[r.key].append(r)
    assert [k.key for k in report.keys] == sorted(by_key, key=lambda k: (-len(by_key[k]), k))
    for stats in [*report.keys, report.total]:
        recs = by_key[stats.key] if stats.key else kept
        sizes = [len(r.body) for r in recs]
        assert stats.records == len(recs)
        assert (stats.first_ns, stats.last_ns) == (min(r.ts_ns for r in recs), max(r.ts_ns for r in recs))
        assert stats.peak_per_s == max(Counter(r.ts_ns // NS for r in recs).values())
        assert (stats.sizes.min, stats.sizes.max) == (min(sizes), max(sizes))
        assert stats.sizes.mean == pytest.approx(sum(sizes) / len(sizes))
        assert near_quantiles(sizes, stats.sizes.quantiles), (stats.key, stats.sizes)
    assert report.total.peak_per_s > report.keys[-1].peak_per_s > 0

    c = report.continuity
    assert (c.first_seq, c.last_seq) == (1, 20_000)
    assert c.gaps == removed and c.gap_count == 2 and c.duplicates == 0
    assert c.missing == sum(hi - lo + 1 for lo, hi in removed) == 20_000 - len(kept)

    delays = [journal.journal_ts[r.seq] - r.ts_ns for r in kept]
    t = report.timing
    assert t is not None and t.records == len(kept)
    assert (t.min, t.max) == (min(delays), max(delays))
    assert near_quantiles(delays, t.quantiles) and t.quantiles[0] < t.quantiles[2], t

    text = report.describe(top=3)
    assert f"{len(kept):,} records" in text and f"{removed[0][0]}..{removed[0][1]}" in text
    assert "... and" in text and "more keys" in text


# --- the commands -------------------------------------------------------------------------------------------


def test_zeps_export_and_analyze_commands(spark, journal: Journal, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out.parquet"
    args = ["export", "--journal", str(journal.root), "--stream", journal.stream, "--to", str(out)]
    assert main([*args, "--from", "101", "--until", "5000"]) == 0
    assert "exported 4,900 records" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table.column_names == ["stream", "seq", "ts_ns", "key", "body"]
    got = sorted(zip(*(table.column(c).to_pylist() for c in ("seq", "ts_ns", "key", "body")), strict=True))
    assert got == journal.rows(101, 5000)

    assert main(args) == 2  # the output exists
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--from", "2099-01-01T00:00:00Z"]) == 0
    assert "exported no records" in capsys.readouterr().err
    assert main([*args, "--from", "yesterday"]) == 2
    assert "--from: 'yesterday' is not SEQ" in capsys.readouterr().err

    png = tmp_path / "rates.png"
    analyze_args = ["analyze", "--journal", str(journal.root), "--stream", journal.stream, "--plot", str(png)]
    assert main([*analyze_args, "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "stream ticks: 20,000 records, sequences 1..20,000" in printed
    assert "no gaps, no duplicates" in printed and "publish->journal  min" in printed
    assert len(re.findall(r"^k\d ", printed, re.M)) == 3  # three key rows
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_without_pyspark_spark_commands_exit_2_and_the_rest_works(journal: Journal, tmp_path: Path) -> None:
    """A Spark-less install: pyspark made unimportable in a fresh interpreter."""
    prelude = (
        "import sys; sys.modules['pyspark'] = None; from gateway.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )

    def zeps(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-c", prelude, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    for command in ("export", "analyze"):
        extra = ("--to", str(tmp_path / "x.parquet")) if command == "export" else ()
        done = zeps(command, "--journal", str(journal.root), "--stream", journal.stream, *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (
            f"zeps {command}: pyspark not installed; install the spark extra: pip install 'zeps-gateway[spark]' "
            "(and Java 17)"
        )
    done = zeps("journal", "inspect", str(journal.root))
    assert done.returncode == 0 and "sequences  1 .. 20000" in done.stdout, done.stderr
    done = zeps("export", "--journal", str(tmp_path), "--stream", "nope", "--to", str(tmp_path / "y"))
    assert done.returncode == 2 and "no stream 'nope'" in done.stderr


# --- streaming ----------------------------------------------------------------------------------------------


def test_stream_to_parquet_exactly_once_across_a_stop_mid_way(
    spark, journal: Journal, sidecar: str, tmp_path: Path
) -> None:
    live = make_journal(journal.root, "live", 60, 100, seed=11)  # 6,000 records; the sidecar finds the new stream
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start():
        source = (
            spark.readStream.format("zeps")
            .option("replay", sidecar)
            .option("stream", live.stream)
            .option("maxRecordsPerBatch", "500")
            .load()
        )
        writer = source.writeStream.format("parquet").option("checkpointLocation", str(checkpoint))
        return writer.trigger(availableNow=True).start(str(out))

    try:
        first = start()
        deadline = time.monotonic() + 120
        while len(first.recentProgress) < 3 and first.isActive:
            assert time.monotonic() < deadline, "no progress within 120 s"
            time.sleep(0.05)
        assert first.isActive, "the query finished before it could be stopped mid-way"
        first.stop()
        written = spark.read.parquet(str(out)).count()
        assert 0 < written < 6000

        live.write(20, per_batch=100)  # 2,000 more while the query is down
        second = start()
        assert second.awaitTermination(timeout=180), "availableNow did not finish within 180 s"
        assert second.exception() is None
        resumed_at = second.recentProgress[0]["sources"][0]["startOffset"]
        resumed_at = json.loads(resumed_at) if isinstance(resumed_at, str) else resumed_at
        assert resumed_at["seq"] > 0  # from the checkpoint, not from the start

        for query in (first, second):
            assert all(p["numInputRows"] <= 500 for p in query.recentProgress)
        rows = spark.read.parquet(str(out))
        assert rows.count() == 8000
        assert collect(rows) == live.rows()
    finally:
        live.writer.close()


def test_analyze_json_and_a_corrupt_journal_in_one_line(spark, tmp_path: Path, capsys) -> None:
    for stream in ("good", "bad"):
        with JournalWriter.open(tmp_path, stream) as w:
            for i in range(6):
                w.append(B.Batch.parse(B.encode(0, [(1_700_000_000 * 10**9 + i * 10**9, b"k%d" % i, b"v" * 50)] * 10)))
    assert main(["analyze", "--journal", str(tmp_path), "--stream", "good", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"]["records"] == 60 and report["continuity"]["gap_count"] == 0
    assert sorted(k["key"] for k in report["keys"]) == [f"k{i}" for i in range(6)]

    seg = seg_path(tmp_path / "bad", 1)
    data = bytearray(seg.read_bytes())
    data[len(data) // 6 * 3 + B.HEADER_SIZE + 5] ^= 0x40  # in the 4th of 6 batches: readers refuse to go past it
    seg.write_bytes(bytes(data))
    assert main(["analyze", "--journal", str(tmp_path), "--stream", "bad"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zeps analyze: journal corrupt: "), err
    assert f"zeps journal repair {tmp_path} --stream bad" in err[0]
