"""The leader-epoch checkpoint of a stream (docs/ha.md): which epoch sequenced which records on this node.

One line per epoch in which this node led, `EPOCH FIRST_SEQ`, in a file beside the segments (as Kafka keeps
its leader-epoch-checkpoint): the first sequence the node assigned as leader of that epoch. Written before
the node sequences anything in the epoch; lines whose records were cut (a former leader that rejoined) are
removed with them. `zeps ha status` and audits read it; the journal format itself is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

EPOCHS_NAME = "leader-epochs"


def read_epochs(directory: Path) -> list[tuple[int, int]]:
    """(epoch, first_seq) pairs, oldest first; empty if this node never led the stream."""
    try:
        text = (directory / EPOCHS_NAME).read_text()
    except FileNotFoundError:
        return []
    return [(int(e), int(s)) for e, s in (line.split() for line in text.splitlines() if line.strip())]


def _write(directory: Path, entries: list[tuple[int, int]]) -> None:
    tmp = directory / f"{EPOCHS_NAME}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{e} {s}\n" for e, s in entries))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / EPOCHS_NAME)


def start_epoch(directory: Path, epoch: int, first_seq: int) -> None:
    """This node leads `epoch` and will assign sequences from `first_seq` on."""
    entries = [(e, s) for e, s in read_epochs(directory) if e < epoch]
    _write(directory, [*entries, (epoch, first_seq)])


def cut_epochs(directory: Path, last_keep: int) -> None:
    """The journal was cut after `last_keep`: forget the epochs that began after it."""
    entries = read_epochs(directory)
    kept = [(e, s) for e, s in entries if s <= last_keep]
    if kept != entries:
        _write(directory, kept)
