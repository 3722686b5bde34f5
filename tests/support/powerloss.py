"""Power loss without a special file system: record what a process wrote and synced, then take away what a power
loss may take.

A kill -9 loses nothing that was written: the page cache survives it. A power loss loses what was written but not
yet synced. LazyFS (the FUSE file system Jepsen uses) gets there by holding unsynced writes in its own cache;
it must be fetched and built, which CI cannot do. This gets there from the other end, with strace (Debian's):
the process runs under `strace -f -y`, which logs every write, truncate, fsync/fdatasync and rename with the
path of its descriptor, from every thread. Once the process is killed, `Ledger` replays the log: how long
each file was at its last sync is what survives. `lose` then makes the files look as a power loss may leave
them, one of three ways:

- "drop": every unsynced byte gone (LazyFS's clear-cache);
- "torn": part of the unsynced tail kept, cut at a random byte (a write torn by the loss);
- "zeros": the file keeps its length, the unsynced bytes read as zeros (its size reached the disk, its data not);
- "reorder": the first unsynced write of each file lost (zeros), the later ones kept: the disk wrote back a
  later page and lost an earlier one (LazyFS's torn-seq).

The model covers data, which is what fsync modes promise: a file's name and its existence are taken to survive
(the journal fsyncs its directory when it adds a segment). The log is complete up to the kill, for what
matters: strace logs a syscall when it returns, before the thread goes on, so a sync whose effect the process
acted on (a confirm sent) is in the log.
"""

from __future__ import annotations

import os
import random
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Loss = Literal["drop", "torn", "zeros", "reorder"]
TRACED = "openat,write,ftruncate,fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat"
# pid syscall(fd</path>, ...) = result; or the resumed half of a syscall another thread interrupted in the log.
_LINE = re.compile(r"^\d+ +(?:<\.\.\. )?(\w+)(?: resumed>)?\(?(.*?)\) += (-?\d+)")
_FD_PATH = re.compile(r"^\d+<([^>]*)>")
_STRINGS = re.compile(r'"((?:[^"\\]|\\.)*)"')


def strace(log: Path) -> list[str]:
    """The command prefix that runs a program under strace, logging what `Ledger` reads to `log`."""
    return ["strace", "-f", "-qq", "-y", "-s", "0", "-e", f"trace={TRACED}", "-e", "signal=none", "-o", str(log)]


def kill_traced(strace_pid: int) -> None:
    """kill -9 the program strace runs (its one child), not strace: strace then logs to the end and exits."""
    children = Path(f"/proc/{strace_pid}/task/{strace_pid}/children").read_text().split()
    assert len(children) == 1, children
    os.kill(int(children[0]), signal.SIGKILL)


@dataclass
class File:
    size: int = 0  # as the process left it
    synced: int = 0  # how much of it the last sync covered
    first_unsynced: int = 0  # bytes of the first write after the last sync


@dataclass
class Ledger:
    """Every file under `root` the traced process wrote: how long it is and how much of it was synced."""

    root: Path
    files: dict[str, File] = field(default_factory=dict)
    pending: dict[int, str] = field(default_factory=dict)  # pid -> the unfinished line of a syscall

    @classmethod
    def read(cls, log: Path, root: Path) -> Ledger:
        ledger = cls(root)
        for line in log.read_text().splitlines():
            ledger._line(line)
        return ledger

    def _line(self, line: str) -> None:
        pid, _, rest = line.partition(" ")
        if rest.endswith("<unfinished ...>"):
            self.pending[int(pid)] = rest.removesuffix("<unfinished ...>")
            return
        if rest.lstrip().startswith("<..."):  # the resumed half: join it to its start
            start = self.pending.pop(int(pid), "")
            rest = start + rest.split("resumed>", 1)[1]
        match = _LINE.match(f"{pid} {rest.strip()}")
        if match is None or int(match.group(3)) < 0:
            return  # a failed call, or an exit line
        name, args, result = match.group(1), match.group(2), int(match.group(3))
        fd = _FD_PATH.match(args)
        path = fd.group(1) if fd else None
        if name == "openat" and ("O_CREAT" in args or "O_TRUNC" in args):
            created = re.search(r"= \d+<([^>]*)>", line)
            if created and "O_TRUNC" in args:
                self._file(created.group(1)).size = 0
            elif created:
                self._file(created.group(1))
        elif name == "write" and path:
            f = self._file(path)
            if f.size == f.synced:
                f.first_unsynced = result
            f.size += result
        elif name == "ftruncate" and path:
            f = self._file(path)
            f.size = int(args.rsplit(",", 1)[1])
            f.synced = min(f.synced, f.size)
        elif name in ("fsync", "fdatasync") and path:
            f = self._file(path)
            f.synced = f.size
        elif name.startswith("rename"):
            old, new = (self._abs(s) for s in _STRINGS.findall(args)[:2])
            if old in self.files:
                self.files[new] = self.files.pop(old)
        elif name.startswith("unlink"):
            self.files.pop(self._abs(_STRINGS.findall(args)[0]), None)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else str(self.root / path)

    def _file(self, path: str) -> File:
        return self.files.setdefault(path, File())

    def unsynced(self) -> dict[Path, int]:
        """Bytes written but not synced, per file under the root that has any."""
        out = {}
        for path, f in self.files.items():
            p = Path(path)
            if p.is_relative_to(self.root) and p.exists() and f.size > f.synced:
                out[p] = f.size - f.synced
        return out

    def lose(self, how: Loss, rng: random.Random, at: Path | None = None) -> dict[Path, int]:
        """Make every file under the root (or the same files under `at`, a copy of it) look as a power loss `how`
        leaves them; the bytes lost per file."""
        lost = {}
        for original, n in self.unsynced().items():
            synced = self.files[str(original)].synced
            path = original if at is None else at / original.relative_to(self.root)
            size = path.stat().st_size
            if how in ("zeros", "reorder"):
                lose = size - synced if how == "zeros" else min(n, self.files[str(original)].first_unsynced)
                with open(path, "r+b") as f:
                    f.seek(synced)
                    f.write(bytes(lose))
                n = lose
            else:
                keep = synced + (rng.randrange(size - synced) if how == "torn" else 0)
                os.truncate(path, keep)
            lost[path] = n
        return lost
