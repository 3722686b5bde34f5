"""A wall clock of its own for the processes a test starts, stepped at run time (netlab/wallclock_shim.c).

The wall clock is not namespaced (a time namespace offsets only the monotonic and boot clocks), `date -s`
would move every process on the machine, and libfaketime makes Python 3.11's sleeps fail. So the lab moves it
per process instead: processes started with `WallClock.env()` read CLOCK_REALTIME, gettimeofday() and time()
through a preloaded shim that adds an offset kept in a small file, and `step()` changes the offset while
they run, as NTP stepping the clock (or an operator with `date -s`) would. Their monotonic clocks and sleeps
are the machine's. Built with the C compiler the project's system packages include (gcc).

Threading contract: one WallClock per test; `step` from the thread that owns it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("wallclock_shim.c")
_OFFSET = struct.Struct("=q")  # the shim maps it as an int64_t, native order


class WallClock:
    """The offset file and the shim, under `directory` (which the caller removes)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.shim = _build(directory)
        self.file = directory / "wallclock-offset"
        self.file.write_bytes(_OFFSET.pack(0))
        self.offset_s = 0.0

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment (`base`, or this process's) whose processes read this clock."""
        env = dict(os.environ if base is None else base)
        env["LD_PRELOAD"] = " ".join(filter(None, (str(self.shim), env.get("LD_PRELOAD", ""))))
        env["NETLAB_WALLCLOCK"] = str(self.file)
        return env

    def step(self, seconds: float) -> None:
        """Move the clock by `seconds` (negative: back) for every process started with `env()`, at once."""
        self.offset_s += seconds
        fd = os.open(self.file, os.O_WRONLY)
        try:
            os.pwrite(fd, _OFFSET.pack(round(self.offset_s * 1e9)), 0)  # one aligned 8-byte store in the page
        finally:
            os.close(fd)


def _build(directory: Path) -> Path:
    """The shim compiled into `directory` (named by the source's hash: a changed source is built again)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    shim = directory / f"wallclock-{digest}.so"
    if not shim.exists():
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            raise RuntimeError("netlab's wall clock needs a C compiler: apt-get install gcc")
        argv = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-o", str(shim), str(SOURCE), "-ldl"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed: {done.stderr.strip()}")
    return shim
