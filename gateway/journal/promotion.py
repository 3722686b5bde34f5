"""The promotion mark of a mirror stream (docs/mirroring.md): the sequence at which this site stopped mirroring.

A file `promoted` beside the segments holding the journal's head when `zeps mirror promote` made this site the
stream's primary and, after it, the source sidecar the site mirrored until then (`300 tcp://10.1.0.5:5571`; a
mark of an earlier version holds the number alone). It is written (and synced, with its directory) before the
promotion is answered, so a restarted gateway finds it, keeps refusing the old source's batches (the fence
survives a crash) and goes on announcing which source it was a copy of. The same text is a group's promotion in
etcd (gateway.replication.promotions). The journal format itself is unchanged; nothing removes the mark (a site
mirrors again from a new journal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROMOTED_NAME = "promoted"


@dataclass(frozen=True, slots=True)
class Promotion:
    """A stream promoted at sequence `head`, formerly a mirror of `source` ("": not known)."""

    head: int
    source: str = ""

    def encode(self) -> str:
        """`HEAD` or `HEAD SOURCE`: a reader of the number alone (an earlier version) reads the head."""
        return f"{self.head} {self.source}" if self.source else str(self.head)

    @classmethod
    def decode(cls, text: str) -> Promotion:
        """The promotion in `text` (ValueError if it holds no number first)."""
        head, _, source = text.strip().partition(" ")
        return cls(int(head), source.strip())


def read_promotion(directory: Path) -> Promotion | None:
    """The promotion of this stream, or None if it never was."""
    try:
        text = (directory / PROMOTED_NAME).read_text()
    except FileNotFoundError:
        return None
    return Promotion.decode(text)


def write_promotion(directory: Path, promotion: Promotion) -> None:
    """Persist `promotion`: file and directory synced before this returns (OSError if not)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{PROMOTED_NAME}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{promotion.encode()}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / PROMOTED_NAME)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
