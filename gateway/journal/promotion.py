"""The promotion mark of a mirror stream (docs/mirroring.md): the sequence at which this site stopped mirroring.

A file `promoted` beside the segments holding one number, the journal's head when `zeps mirror promote` made
this site the stream's primary. It is written (and synced, with its directory) before the promotion is
answered, so a restarted gateway finds it and keeps refusing the old source's batches: the fence survives a
crash. The journal format itself is unchanged; nothing removes the mark (a site mirrors again from a new
journal).
"""

from __future__ import annotations

import os
from pathlib import Path

PROMOTED_NAME = "promoted"


def read_promotion(directory: Path) -> int | None:
    """The sequence this stream was promoted at, or None if it never was."""
    try:
        text = (directory / PROMOTED_NAME).read_text()
    except FileNotFoundError:
        return None
    return int(text.split()[0])


def write_promotion(directory: Path, head: int) -> None:
    """Persist the promotion at `head`: file and directory synced before this returns (OSError if not)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{PROMOTED_NAME}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{head}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / PROMOTED_NAME)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
