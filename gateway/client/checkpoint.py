"""`Checkpoint`: where a Subscriber resumes after a restart, kept in a file that is replaced atomically."""

from __future__ import annotations

import os
import time
from pathlib import Path


class Checkpoint:
    """The last sequence the application finished with, kept in a file that is replaced atomically."""

    def __init__(self, path: Path, every_s: float = 0.5) -> None:
        self.path = path
        self.every_s = every_s
        self.saved_at = 0.0
        self.saved: int | None = None

    def load(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ValueError(f"checkpoint {self.path} does not hold a sequence number: delete it or fix it") from exc

    def save(self, seq: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if seq == self.saved or (not force and now - self.saved_at < self.every_s):
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(f"{seq}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.saved, self.saved_at = seq, now
