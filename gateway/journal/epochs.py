"""The leader-epoch checkpoint of a stream (docs/ha.md): which epoch sequenced which records on this node.

One line per epoch in which this node led, `EPOCH FIRST_SEQ`, in a file beside the segments (as Kafka keeps
its leader-epoch-checkpoint): the first sequence the node assigned as leader of that epoch. Written before
the node sequences anything in the epoch; lines whose records were cut (a former leader that rejoined) are
removed with them. `zeps ha status` and audits read it; the journal format itself is unchanged.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from gateway.errors import JournalCorrupt

EPOCHS_NAME = "leader-epochs"
_LINE = re.compile(rb"(\d{1,20}) (\d{1,20})")  # up to 2**64 - 1: every sequence a journal holds
_MAX = 2**64 - 1

_FIX = "It is an audit record, not data: the node sets a damaged one aside and starts a new one when it next leads"

log = logging.getLogger(__name__)


def read_epochs(directory: Path) -> list[tuple[int, int]]:
    """(epoch, first_seq) pairs, oldest first; empty if this node never led the stream. JournalCorrupt names
    the first line that is not two decimal numbers."""
    path = directory / EPOCHS_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    entries, offset = [], 0
    for line in data.splitlines(keepends=True):
        if line.strip():
            match = _LINE.fullmatch(line.rstrip(b"\n"))
            if match is None or max(int(match[1]), int(match[2])) > _MAX:
                raise JournalCorrupt(path, offset, f"line {line[:40]!r} is not `EPOCH FIRST_SEQ`", _FIX)
            entries.append((int(match[1]), int(match[2])))
        offset += len(line)
    return entries


def _readable(directory: Path) -> list[tuple[int, int]]:
    """The entries, or none after setting a damaged file aside (kept as leader-epochs.corrupt for audits): a
    node about to lead must not fail on its audit record."""
    try:
        return read_epochs(directory)
    except JournalCorrupt as exc:
        aside = directory / f"{EPOCHS_NAME}.corrupt"
        os.replace(directory / EPOCHS_NAME, aside)
        log.warning("%s; set aside as %s", exc, aside)
        return []


def _write(directory: Path, entries: list[tuple[int, int]]) -> None:
    tmp = directory / f"{EPOCHS_NAME}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{e} {s}\n" for e, s in entries))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / EPOCHS_NAME)


def start_epoch(directory: Path, epoch: int, first_seq: int) -> None:
    """This node leads `epoch` and will assign sequences from `first_seq` on."""
    entries = [(e, s) for e, s in _readable(directory) if e < epoch]
    _write(directory, [*entries, (epoch, first_seq)])


def cut_epochs(directory: Path, last_keep: int) -> None:
    """The journal was cut after `last_keep`: forget the epochs that began after it."""
    entries = _readable(directory)
    kept = [(e, s) for e, s in entries if s <= last_keep]
    if kept != entries:
        _write(directory, kept)
