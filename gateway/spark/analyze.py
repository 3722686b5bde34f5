"""`zeps analyze`: what a stream holds, per key and as a whole, computed by Spark.

Per key: records, first and last publish time, mean rate over that span, peak rate (the most records in one
second of publish time), and the body size distribution. For the stream: the same totals, a gap audit of
sequence continuity, and publish-to-journal timing (journal time of the batch minus the record's publish time)
when records carry a publish time.

The gap audit scales with the data, not with one machine: distinct sequences are counted against the span
first; only if some are missing are the runs found, by two anti-joins (a sequence whose predecessor is absent
starts a run, one whose successor is absent ends one), and only the first MAX_GAPS gaps reach the driver.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from gateway.journal import iso_utc

NS = 1_000_000_000
QUANTILES = (0.5, 0.9, 0.99)
ACCURACY = 10_000  # percentile_approx: rank error at most n / ACCURACY (Spark's default)
SHOW_GAPS = 10  # in the table
MAX_GAPS = 1000  # in a Report


@dataclass(frozen=True, slots=True)
class Sizes:
    """Body sizes in bytes: min, the QUANTILES (lower values, as Spark's percentile_approx), max, mean."""

    min: int
    quantiles: tuple[int, ...]
    max: int
    mean: float


@dataclass(frozen=True, slots=True)
class KeyStats:
    key: str
    records: int
    first_ns: int
    last_ns: int
    peak_per_s: int
    sizes: Sizes

    @property
    def mean_per_s(self) -> float | None:
        """Records per second between the first and the last record (None for a single instant)."""
        span = self.last_ns - self.first_ns
        return self.records * NS / span if span > 0 else None

    def row(self) -> tuple[str, ...]:
        """The key's line in the table."""
        times = (iso_utc(self.first_ns), iso_utc(self.last_ns))
        return (
            self.key,
            f"{self.records:,}",
            *times,
            _rate(self.mean_per_s),
            f"{self.peak_per_s:,}",
            _sizes(self.sizes),
        )


@dataclass(frozen=True, slots=True)
class Timing:
    """Publish-to-journal time in ns over `records` records: min, QUANTILES, max."""

    records: int
    min: int
    quantiles: tuple[int, ...]
    max: int


@dataclass(frozen=True, slots=True)
class Continuity:
    """Sequence continuity between the first and the last sequence read."""

    first_seq: int
    last_seq: int
    records: int
    distinct: int  # sequences
    gap_count: int
    gaps: list[tuple[int, int]]  # the first MAX_GAPS missing ranges (inclusive), in order

    @property
    def missing(self) -> int:
        return self.last_seq - self.first_seq + 1 - self.distinct

    @property
    def duplicates(self) -> int:
        """Records whose sequence another record has too."""
        return self.records - self.distinct

    def describe(self) -> str:
        if not self.gap_count and not self.duplicates:
            return "no gaps, no duplicates"
        parts = []
        if self.gap_count:
            shown = ", ".join(f"{lo}..{hi}" if lo < hi else str(lo) for lo, hi in self.gaps[:SHOW_GAPS])
            more = f", ... ({self.gap_count - SHOW_GAPS:,} more)" if self.gap_count > SHOW_GAPS else ""
            parts.append(f"{self.gap_count:,} gaps, {self.missing:,} sequences missing: {shown}{more}")
        if self.duplicates:
            parts.append(f"{self.duplicates:,} duplicate records")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Report:
    stream: str
    total: KeyStats  # the whole stream, key ""
    keys: list[KeyStats]  # most records first
    continuity: Continuity
    timing: Timing | None  # None: no record carries a publish time, or no journal time was read

    def describe(self, top: int = 20) -> str:
        """The report as the table `zeps analyze` prints."""
        t = self.total
        c = self.continuity
        lines = [
            f"stream {self.stream}: {t.records:,} records, sequences {c.first_seq:,}..{c.last_seq:,}, "
            f"{len(self.keys):,} keys",
            f"  publish time  {iso_utc(t.first_ns)} .. {iso_utc(t.last_ns)}",
            f"  rate          mean {_rate(t.mean_per_s)}/s, peak {t.peak_per_s:,}/s",
            f"  body bytes    min/p50/p90/p99/max {_sizes(t.sizes)}, mean {t.sizes.mean:.1f}",
            f"  continuity    {c.describe()}",
            f"  publish->journal  {self._timing()}",
            "",
        ]
        header = ("key", "records", "first", "last", "mean/s", "peak/s", "bytes min/p50/p90/p99/max")
        lines.extend(_table(header, [k.row() for k in self.keys[:top]]))
        if len(self.keys) > top:
            lines.append(f"... and {len(self.keys) - top:,} more keys (--top N shows more)")
        return "\n".join(lines)

    def _timing(self) -> str:
        if self.timing is None:
            return "not recorded"
        t = self.timing
        qs = " ".join(f"p{q * 100:g} {_ms(v)}" for q, v in zip(QUANTILES, t.quantiles, strict=True))
        return f"min {_ms(t.min)} {qs} max {_ms(t.max)} ({t.records:,} records)"


def analyze(slim: DataFrame, stream: str) -> Report:
    """Analyze `slim`, a summary() of the zeps source's records. ValueError if it holds none.

    Three small Spark jobs over the cached summary (three more only if sequences are missing): the statistics
    per key and for the whole stream in one rollup, the peak rates in one cube over (key, second), and the
    distinct sequence count.
    """
    rows = _statistics(slim).collect()
    peaks = {(r.all_keys, r.key): r.peak for r in _peaks(slim).collect()}
    total = next((r for r in rows if r.all_keys), None)
    if total is None or not total.records:
        raise ValueError(f"stream {stream!r}: no records in the range read; nothing to analyze")
    keys = [_key_stats(r, r.key, peaks[(0, r.key)]) for r in rows if not r.all_keys]
    timing = None
    if "journal_ts_ns" in slim.columns and total.delays:
        timing = Timing(total.delays, total.delay_min, tuple(total.delay_q), total.delay_max)
    return Report(
        stream=stream,
        total=_key_stats(total, "", peaks[(1, None)]),
        keys=sorted(keys, key=lambda k: (-k.records, k.key)),
        continuity=continuity(slim, total.records),
        timing=timing,
    )


@contextmanager
def summary(df: DataFrame) -> Iterator[DataFrame]:
    """What the analysis reads of the zeps source's `df`: body sizes instead of bodies, and journal_ts_ns if it
    has it; cached for the block, as analyze() and plot_rates() pass over it several times."""
    journal_time = ["journal_ts_ns"] if "journal_ts_ns" in df.columns else []
    slim = df.select("seq", "ts_ns", "key", F.length("body").alias("size"), *journal_time).persist()
    try:
        yield slim
    finally:
        slim.unpersist()


def _statistics(slim: DataFrame) -> DataFrame:
    """One row per key and one for the stream (all_keys = 1): counts, times, sizes, delays.

    (No distinct count here: with one, Spark groups by key and sequence before it aggregates, and every such
    group carries percentile sketches: many times slower.)"""
    delay = (
        F.when(F.col("ts_ns") > 0, F.col("journal_ts_ns") - F.col("ts_ns"))
        if "journal_ts_ns" in slim.columns
        else F.lit(None).cast("bigint").cast("bigint")
    )
    return slim.rollup("key").agg(
        F.grouping("key").alias("all_keys"),
        F.count("*").alias("records"),
        F.min("ts_ns").alias("first"),
        F.max("ts_ns").alias("last"),
        F.min("size").alias("size_min"),
        F.percentile_approx("size", list(QUANTILES), ACCURACY).alias("size_q"),
        F.max("size").alias("size_max"),
        F.avg("size").alias("size_mean"),
        F.count(delay).alias("delays"),
        F.min(delay).alias("delay_min"),
        F.percentile_approx(delay, list(QUANTILES), ACCURACY).alias("delay_q"),
        F.max(delay).alias("delay_max"),
    )


def _peaks(slim: DataFrame) -> DataFrame:
    """The most records in one second of publish time, per key and for the stream (all_keys = 1)."""
    per_second = (
        slim.withColumn("second", F.expr(f"ts_ns div {NS}"))
        .cube("key", "second")
        .agg(F.count("*").alias("n"), F.grouping("key").alias("all_keys"), F.grouping("second").alias("any_second"))
    )
    return per_second.where("any_second = 0").groupBy("all_keys", "key").agg(F.max("n").alias("peak"))


def _key_stats(row: Row, key: str, peak: int) -> KeyStats:
    sizes = Sizes(row.size_min, tuple(row.size_q), row.size_max, row.size_mean)
    return KeyStats(key, row.records, row.first, row.last, peak, sizes)


def continuity(slim: DataFrame, records: int, max_gaps: int = MAX_GAPS) -> Continuity:
    """The gap audit: distinct sequences against the span; the missing ranges only if some are missing."""
    row = slim.agg(F.count_distinct("seq"), F.min("seq"), F.max("seq")).first()
    assert row is not None  # an aggregate has exactly one row
    distinct, first, last = row
    if last - first + 1 == distinct:
        return Continuity(first, last, records, distinct, 0, [])
    seqs = slim.select("seq").distinct()
    starts = seqs.join(seqs.select((F.col("seq") + 1).alias("seq")), "seq", "left_anti")  # no predecessor
    ends = seqs.join(seqs.select((F.col("seq") - 1).alias("seq")), "seq", "left_anti")  # no successor
    runs = starts.count()
    first_starts = [r.seq for r in starts.orderBy("seq").limit(max_gaps + 1).collect()]
    first_ends = [r.seq for r in ends.orderBy("seq").limit(max_gaps + 1).collect()]
    gaps = [(end + 1, start - 1) for end, start in zip(first_ends, first_starts[1:], strict=False)]
    return Continuity(first, last, records, distinct, runs - 1, gaps)


def plot_rates(df: DataFrame, report: Report, path: Path, *, top: int = 5, points: int = 200) -> None:
    """Draw records/s over publish time for the `top` keys of `report`, from `df` (key, ts_ns), into a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    keys = [k.key for k in report.keys[:top]]
    start = report.total.first_ns
    width = max((report.total.last_ns - start) // points + 1, NS // 1000)  # ns per bucket, 1 ms at least
    bucket = F.expr(f"(ts_ns - {start}) div {width}").alias("bucket")
    rows = df.where(F.col("key").isin(keys)).groupBy("key", bucket).count().collect()
    fig, ax = plt.subplots(figsize=(10, 5))
    for key in keys:
        counts = sorted((r.bucket, r["count"]) for r in rows if r.key == key)
        series = dict(counts)
        xs = np.arange(max(series) + 1) if series else np.arange(0)
        ax.plot(xs * width / NS, [series.get(int(x), 0) * NS / width for x in xs], label=key or "(empty key)")
    ax.set_xlabel(f"seconds since {iso_utc(start)}")
    ax.set_ylabel(f"records/s (buckets of {width / 1e6:g} ms)")
    ax.set_title(f"stream {report.stream}: rate per key (top {len(keys)} by records)")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def _sizes(s: Sizes) -> str:
    return "/".join(str(v) for v in (s.min, *s.quantiles, s.max))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned first column, the others right-aligned."""
    widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    return [line(header), *(line(row) for row in rows)]
