"""`zeps bench` end to end in --quick mode: every scenario really runs (labs, gateway, sidecar, subscribers,
nats-server) and yields a well-formed report. No timing is asserted: targets live in the report, not here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gateway.bench import SCENARIOS, BenchError, failover, mirror, report, scenario
from gateway.bench.runner import Result, Settings, machine
from gateway.cli.main import main
from gateway.tools.hagroup import NODE_OPTIONS
from netlab import state

pytestmark = pytest.mark.lab


def _my_labs() -> list[str]:
    """Labs recorded as owned by this test process: a scenario must leave none behind."""
    return [r["id"] for r in state.load_all() if (r.get("owner") or {}).get("pid") == os.getpid()]


def _check(result: Result, name: str) -> None:
    assert result.scenario == name
    assert result.tables and all(t.rows for t in result.tables)
    for table in result.tables:
        assert all(len(row) == len(table.columns) for row in table.rows), table.title
    assert result.targets
    assert not [n for n in result.notes if "failed" in n], result.notes


@pytest.mark.parametrize("name", [s for s in SCENARIOS if s not in ("replay", "memory", "failover", "soak", "mirror")])
def test_scenario_quick(name: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("zeps bench needs root (network namespaces): run the tests as root", pytrace=False)
    result = scenario(name).run(Settings(runs=1, quick=True, tmp=tmp_path))
    _check(result, name)
    if name == "latency":  # ZEPS against NATS core and JetStream in the same run, with the ratios
        peers, ratios = result.tables[-2:]
        assert {row[1] for row in peers.rows} == {"ZEPS udp://", "NATS core", "NATS JetStream"}
        assert len(ratios.rows) == 3 and all(cell != "n/a" for row in ratios.rows for cell in row[1:])
        assert {t.issue for t in result.targets} == {None, 32}  # #8's bounds and #32's comparison
    if name == "throughput":  # issue #32's rows: columns, the batch publish, replay into one client columnar
        rates, cpu, replayed = result.tables
        assert {"ZEPS, Subscriber.next_batch().columns()", "ZEPS, Publisher.publish_many(), Subscriber.next_batch()"
                ".columns()"} <= {row[0] for row in rates.rows}  # fmt: skip
        assert len(cpu.rows) == len(rates.rows) - 1  # every ZEPS row has its CPU per record (the relay has none)
        assert all(cell.median > 0 for row in cpu.rows for cell in row[1:])
        assert replayed.rows[0][2].median > 0 and replayed.rows[0][3].median > 0
    if name == "fanin":  # 1,000 publishers got in with the gateway's defaults, and every record arrived
        (table,) = result.tables
        assert [row[0] for row in table.rows] == ["one publisher", "1,000 publishers"]
        assert all(row[3].median > 0 for row in table.rows)  # the gateway's CPU per record, both cases
    assert not _my_labs()  # every lab it made is gone
    assert not any(tmp_path.iterdir())  # temporary journals and stores removed


def test_failover_quick_delivers_every_record_once(tmp_path: Path) -> None:
    """Leader kills under a confirming publisher: a run whose subscriber missed, repeated or reordered a record
    fails (a "failed" note), so a table row means every record was delivered once, in order."""
    result = scenario("failover").run(Settings(runs=1, quick=True, tmp=tmp_path))
    _check(result, "failover")
    failovers, cost = result.tables
    assert [row[0] for row in failovers.rows] == ["300 ms (default)"]
    assert failovers.rows[0][-1].median > 100  # records confirmed and each delivered once, in order
    assert failovers.rows[0][4].startswith("3: ")  # every kill measured
    assert [row[0] for row in cost.rows] == [
        "one node (--min-insync 0)",
        "a pair (--min-insync 1)",
        "the pair, peer link over TLS",
    ]
    assert all(row[1].median > 0 and row[2].median > 0 for row in cost.rows)  # publisher and subscriber clocks
    assert len(result.targets) == 3
    assert not _my_labs()
    assert not any(tmp_path.iterdir())


def test_mirror_quick_measures_every_link_and_numbers_are_sane(tmp_path: Path) -> None:
    """Issue #35's benchmark in the two-site lab: a row per link in each table, every cell measured and plausible
    (a run that missed a record or failed to promote fails, as a "failed" note)."""
    result = scenario("mirror").run(Settings(runs=1, quick=True, tmp=tmp_path))
    _check(result, "mirror")
    lag, rates, promotion = result.tables
    links = [link.name for link in mirror.LINKS]
    promoted = [*links, *(p.name for p in mirror.PROMOTIONS)]  # and B a group, and A cut off at the router
    assert [[row[0] for row in table.rows] for table in result.tables] == [links, links, promoted]
    for row in lag.rows:
        a_p50, a_p99, b_p50, b_p99, added, wan_bytes = (cell.median for cell in row[1:7])
        assert 0 < a_p50 <= a_p99 < 1_000 and 0 < b_p50 <= b_p99 < 10_000
        assert added == pytest.approx(b_p99 - a_p99)
        assert 100 < wan_bytes < 10_000  # a 100-byte body crossed at least once, and not absurdly often
        tail = next(link for link in mirror.LINKS if link.name == row[0]).tail
        assert (0 <= row[7].median <= 100) if tail else row[7] == "—"  # the share forwarded from datagrams
    _, *wans = lag.rows
    assert all(wan[3].median > mirror.WAN.delay_ms for wan in wans)  # B's p50: one way across the WAN at least
    for row in rates.rows:
        mirrored, read, *cpu_us, waiting = (cell.median for cell in row[1:])
        assert 1_000 < mirrored < 10_000_000 and 1_000 < read < 10_000_000
        assert all(0 < us < 1_000 for us in cpu_us) and 0 <= waiting <= 100 * os.cpu_count()
    for row, cut in zip(promotion.rows, [False] * len(links) + [p.cut for p in mirror.PROMOTIONS], strict=True):
        command, first_publish = row[2].median, row[3].median
        assert 0 < command <= first_publish < 60
        assert (row[4].median >= first_publish) if cut else row[4] == "—"  # from the cut: the command's start too
    assert {t.issue for t in result.targets} == {None} and result.issue == 35
    assert len(result.targets) == 2 + 2 * len(wans) + len(promoted)
    assert not _my_labs()
    assert not any(tmp_path.iterdir())


def test_a_failed_failover_run_keeps_its_nodes_logs(tmp_path: Path) -> None:
    """The group is gone after a failed run, its logs are not: the error names where they are."""
    settings = Settings(runs=1, quick=True, tmp=tmp_path)
    group = failover._group(settings, ["etcd", "n1"], ("n1",), NODE_OPTIONS)
    with pytest.raises(BenchError, match="RuntimeError: the run failed") as failed, group as (_, nodes, _etcd):
        nodes["n1"].start().wait_ready()
        raise RuntimeError("the run failed")
    kept = Path(re.findall(r"logs are kept in (\S+)\)", str(failed.value))[0])
    assert {p.name for p in kept.iterdir()} == {"n1.log", "etcd.log"}
    assert "zeps gateway: listening on" in (kept / "n1.log").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("zeps-bench-") and p != kept]  # the lab's dir went
    assert not _my_labs()


def test_soak_quick_checks_every_record_and_samples_every_process(tmp_path: Path) -> None:
    """20 s of the soak: every fault of a cycle applied (the gateway and sidecar restarted once each), every
    process's RSS sampled, both subscribers checked for 1..N exactly once and in order."""
    result = scenario("soak").run(Settings(runs=1, quick=True, tmp=tmp_path))
    _check(result, "soak")
    rss, records = result.tables
    incarnations = {row[0]: row[1] for row in rss.rows}
    assert incarnations == {"gateway": 2, "replay sidecar": 2, "publisher": 1, "subscriber A": 1,
                            "subscriber B (paused)": 1}  # fmt: skip
    (row,) = records.rows
    published, head = (int(cell.replace(",", "")) for cell in row[2:4])
    assert published > 10_000 and head == published  # every record confirmed, none twice
    assert all(cell.startswith(f"{head:,} ") for cell in row[4:6])  # each subscriber got 1..head
    assert row[6] == "sidecar kill -9 x1, gateway kill -9 x1, pause 4 s x1"
    assert result.targets[1].met, result.notes
    assert not _my_labs()
    assert not any(tmp_path.iterdir())


def test_replay_and_memory_through_the_cli_write_a_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "report" / "benchmarks.md"
    store = tmp_path / "store"
    store.mkdir()
    for name in ("replay", "memory"):
        assert main(["bench", name, "--quick", "--runs", "1", "--tmp", str(store), "--report", str(out)]) == 0
        text = out.read_text()
        assert text.startswith("# Benchmarks")
        assert re.search(r"^\| target \| issue \| measured \| met \|$", text, re.M)
        assert re.search(r"^\| .* \| #8 \| .* \| (yes|\*\*no\*\*) \|$", text, re.M)
        assert "## Machine and versions" in text and "nats-server" in text
        images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
        assert images and all((out.parent / image).stat().st_size > 1000 for image in images)
    printed = capsys.readouterr().out
    assert "## Replay" in printed and "## Memory" in printed
    assert not any(store.iterdir())


def test_report_of_a_failed_scenario_still_renders(tmp_path: Path) -> None:
    failed = Result("fanout", "Fan-out", "", notes=["**This scenario failed:** no nats-server"])
    paths = report.write([failed], machine(), tmp_path / "b.md", "zeps bench all")
    text = paths[0].read_text()
    assert "This scenario failed" in text and "## Machine and versions" in text


@pytest.mark.parametrize(
    "args",
    [["--runs", "0"], ["--journal-gb", "-1"], ["--tmp", "/nonexistent/dir"], ["--minutes", "0"], ["--rate", "-5"]],
)
def test_bad_options_exit_2(args: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "memory", *args]) == 2
    assert "zeps bench" in capsys.readouterr().err
