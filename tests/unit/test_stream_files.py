"""The small files beside a stream's segments, damaged (found by fuzzing, tests/fuzz/targets.py `stream_files`):
a damaged `leader-epochs` made a node fail as it took the lead; a head file with numbers no journal holds
moved the next sequence out of range; a node leading from a sequence of 20 digits wrote an epoch line that
its own reader refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.errors import JournalCorrupt
from gateway.journal import Durability, JournalWriter
from gateway.journal.epochs import EPOCHS_NAME, read_epochs, start_epoch
from gateway.journal.layout import HEAD_NAME, read_head
from gateway.wire.batch import Batch, encode


def test_damaged_leader_epochs_is_named_and_set_aside_when_leading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / EPOCHS_NAME).write_bytes(b"3 1\nfive 4\n")
    with pytest.raises(JournalCorrupt, match=r"leader-epochs at byte 4: line b'five 4\\n' is not `EPOCH FIRST_SEQ`"):
        read_epochs(tmp_path)
    with caplog.at_level(logging.WARNING, "gateway.journal.epochs"):
        start_epoch(tmp_path, 9, 40)  # a node taking the lead: never fails on its audit record
    assert read_epochs(tmp_path) == [(9, 40)]
    assert (tmp_path / f"{EPOCHS_NAME}.corrupt").read_bytes() == b"3 1\nfive 4\n"  # kept, for audits
    assert "set aside" in caplog.text


@pytest.mark.parametrize("text", [b"0 5", b"-3 5", b"18446744073709551615 5", b"7 -1", b"\xff\xfe", b"7"])
def test_a_head_file_out_of_range_is_ignored(tmp_path: Path, text: bytes) -> None:
    with JournalWriter.open(tmp_path, "s", durability=Durability("never")) as w:
        w.append(Batch.parse(encode(0, [(0, b"k", b"v")])))
    (tmp_path / "s" / HEAD_NAME).write_bytes(text)
    assert read_head(tmp_path / "s") is None
    with JournalWriter.open(tmp_path, "s", durability=Durability("never")) as w:
        assert w.last_seq == 1  # from the journal itself
        w.append(Batch.parse(encode(0, [(0, b"k", b"v")])))
        assert w.last_seq == 2


def test_an_epoch_from_a_twenty_digit_sequence_reads_back(tmp_path: Path) -> None:
    """The head may name any next sequence below 2**64 - 1; a node about to lead from 11111111111111111110
    wrote `7 11111111111111111110`, which read_epochs (19 digits at most) then called corrupt."""
    start_epoch(tmp_path, 7, 11111111111111111110)
    start_epoch(tmp_path, 8, 2**64 - 2)
    assert read_epochs(tmp_path) == [(7, 11111111111111111110), (8, 2**64 - 2)]
    (tmp_path / EPOCHS_NAME).write_bytes(b"7 18446744073709551616\n")  # 2**64: no journal holds it
    with pytest.raises(JournalCorrupt, match="is not `EPOCH FIRST_SEQ`"):
        read_epochs(tmp_path)
