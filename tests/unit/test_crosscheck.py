"""`zeps ha check` and gateway.journal.crosscheck on journals written here: agreeing nodes (one behind, one
empty), a diverged node, a gap, a record journaled twice, and the command's output and exit status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.journal import JournalWriter, check_group
from gateway.journal.reader import JournalReader
from gateway.wire.batch import Batch, encode

S = "px"


def batch(n: int, tag: str, producer: tuple[int, int] | None = None) -> Batch:
    records = [(0, b"k", f"{tag}-{i}".encode()) for i in range(n)]
    return Batch.parse(encode(0, records, producer=producer))


def leader_journal(root: Path, batches: int, *, segment_bytes: int = 64 << 20) -> list[Batch]:
    """A leader's journal of `batches` batches of 3 records (producer 7, numbers 1, 2, ...); its batches."""
    with JournalWriter.open(root, S, segment_bytes=segment_bytes) as w:
        for k in range(batches):
            w.append(batch(3, f"r{k}", producer=(7, 1 + 3 * k)))
    with JournalReader(root, S).cursor(1) as cursor:
        out = []
        while (b := cursor.next_batch()) is not None:
            out.append(Batch.parse(bytes(b)))
        return out


def follower_journal(root: Path, batches: list[Batch]) -> None:
    with JournalWriter.open(root, S) as w:
        for b in batches:
            w.append_replica(b)


def test_agreeing_nodes_one_behind_one_empty(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    batches = leader_journal(a, 10)
    follower_journal(b, batches[:7])  # a follower behind
    c.mkdir()  # a node that never got anything
    result = check_group([a, b, c], S)
    assert result.ok, result.violation
    assert result.checked == 30
    heads = {Path(n).name: (r.first, r.head) for n, r in result.nodes.items()}
    assert heads == {"a": (1, 30), "b": (1, 21), "c": (1, 0)}
    assert result.divergence is None


def test_a_diverged_node_is_named_at_its_first_differing_sequence(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    batches = leader_journal(a, 5)
    with JournalWriter.open(b, S) as w:  # b copied 1..9, then led alone and sequenced other records
        for x in batches[:3]:
            w.append_replica(x)
        w.append(batch(2, "alone"))
    result = check_group([a, b], S)
    assert not result.ok
    assert result.checked == 9
    assert result.divergence is not None and result.divergence["seq"] == 10
    assert set(result.divergence["nodes"]) == {str(a), str(b)}  # type: ignore[arg-type]
    assert "sequence 10 holds different records" in (result.violation or "")
    # Same records with another journal time are other records too (followers copy journal time verbatim).
    shutil.rmtree(b)
    with JournalWriter.open(b, S, clock=lambda: 1) as w:
        w.append(batch(3, "r0", producer=(7, 1)))
    assert check_group([a, b], S).divergence["seq"] == 1  # type: ignore[index]


def test_batches_cut_differently_are_compared_record_by_record(tmp_path: Path) -> None:
    """The same records in other batch boundaries agree; a record that differs inside a batch is named exactly."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    batches = leader_journal(a, 4)  # 1..3, 4..6, 7..9, 10..12
    with JournalWriter.open(b, S) as w:
        w.append_replica(batches[0])
        w.append_replica(Batch.parse(batches[1].part(4, 4)))
        w.append_replica(Batch.parse(batches[1].part(5, 6)))
        w.append_replica(Batch.parse(batches[2].part(7, 8)))
        w.append_replica(Batch.parse(batches[2].part(9, 9)))
        w.append_replica(batches[3])
    result = check_group([a, b], S)
    assert result.ok and result.checked == 12, result.violation
    with JournalWriter.open(c, S) as w:  # records 1..7 as a has them, then other records from 8 on
        w.append_replica(batches[0])
        w.append_replica(batches[1])
        w.append_replica(Batch.parse(batches[2].part(7, 7)))
        w.append(batch(5, "other"))
    result = check_group([a, b, c], S)
    assert result.divergence is not None and result.divergence["seq"] == 8 and result.checked == 7, result


def test_a_gap_below_the_head_is_a_violation(tmp_path: Path) -> None:
    a = tmp_path / "a"
    leader_journal(a, 40, segment_bytes=400)  # several segments
    segments = sorted((a / S).glob("*.seg"))
    assert len(segments) > 3
    segments[2].unlink()
    segments[2].with_suffix(".idx").unlink(missing_ok=True)
    result = check_group([a], S)
    assert not result.ok
    assert f"node {a}" in (result.violation or "") and "missing" in (result.violation or "")


def test_a_record_journaled_twice_is_a_violation(tmp_path: Path) -> None:
    a = tmp_path / "a"
    with JournalWriter.open(a, S) as w:
        w.append(batch(3, "x", producer=(9, 1)))
        w.append(batch(2, "y", producer=(9, 3)))  # numbers 3 and 4: 3 was journaled at sequence 3
    result = check_group([a], S)
    assert "a record twice: producer 0x9 number 3 at sequence 4, after its number 3 at sequence 3" in (
        result.violation or ""
    )


def test_zeps_ha_check_prints_one_line_and_exits_1_on_a_violation(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    batches = leader_journal(a, 4)
    follower_journal(b, batches)
    (tmp_path / "c").mkdir()  # a node that never journaled anything
    assert main(["ha", "check", "--journal", str(a), "--journal", str(b), "--journal", str(tmp_path / "c")]) == 0
    out, err = capsys.readouterr()
    line = json.loads(out)
    assert line["ok"] and line["checked"] == 12 and line["nodes"][str(b)] == {"first": 1, "head": 12}, line
    assert line["nodes"][str(tmp_path / "c")] == {"first": 1, "head": 0}, line
    assert err == ""
    with JournalWriter.open(b, S) as w:
        w.append(batch(1, "b-alone"))
    with JournalWriter.open(a, S) as w:
        w.append(batch(1, "a-alone"))
    assert main(["ha", "check", "--journal", str(a), "--journal", str(b), "--stream", S]) == 1
    out, err = capsys.readouterr()
    line = json.loads(out)
    assert line["divergence"]["seq"] == 13 and not line["ok"], line
    assert err.count("\n") == 1 and err.startswith(f"zeps ha check: stream {S}: sequence 13 holds different"), err


@pytest.mark.parametrize("argv", [["ha", "check"], ["ha", "check", "--journal", "/nonexistent/zeps"], ["empty"]])
def test_zeps_ha_check_usage_errors_exit_2(argv: list[str], capsys, tmp_path: Path) -> None:
    if argv == ["empty"]:  # journal roots that hold no stream at all
        argv = ["ha", "check", "--journal", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1
