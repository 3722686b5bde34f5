"""The promotion mark of a mirror stream (docs/mirroring.md): the sequence at which this site stopped mirroring.

A file `promoted` beside the segments holding the journal's head when `zeps mirror promote` made this site the
stream's primary and, after it, the source sidecar the site mirrored until then (`300 tcp://10.1.0.5:5571`; a
mark of an earlier version holds the number alone). It is written (and synced, with its directory) before the
promotion is answered, so a restarted gateway finds it, keeps refusing the old source's batches (the fence
survives a crash) and goes on announcing which source it was a copy of. The same text is a group's promotion in
etcd (gateway.replication.promotions). The journal format itself is unchanged; nothing removes the mark (a site
mirrors again from a new journal).

Beside it, a file `mirror-source` holds the source sidecar the stream's mirror sessions name (MIRROR), written
(synced, like the promotion mark) when it changes: a restarted gateway, or a group's new leader, announces which
source its copy comes from at once, not only once a mirror attaches again. It says where the copy comes from; it
fences nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROMOTED_NAME = "promoted"
SOURCE_NAME = "mirror-source"


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
    _write_synced(directory, PROMOTED_NAME, promotion.encode())


def read_source(directory: Path) -> str:
    """The source sidecar this mirror stream's sessions last named ("": none yet)."""
    try:
        return (directory / SOURCE_NAME).read_text().strip()
    except FileNotFoundError:
        return ""


def write_source(directory: Path, source: str) -> None:
    """Persist `source` as the one this mirror stream's sessions name: synced before this returns (OSError if
    not)."""
    _write_synced(directory, SOURCE_NAME, source)


def _write_synced(directory: Path, name: str, text: str) -> None:
    """Replace the file `name` by one line, `text`, atomically: file and directory synced."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{name}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{text}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / name)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
