"""Lab records in /run/netlab: how ``netlab`` commands find labs that other processes created.

/run is a tmpfs, so records vanish on reboot together with the namespaces they describe. One JSON file per
lab, named after the lab id; a lock file serialises id/subnet allocation and cleanup between processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_DIR = Path("/run/netlab")


def _ensure_dir() -> None:
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Hold the machine-wide netlab lock (allocation of ids and subnets, and cleanup)."""
    _ensure_dir()
    with open(STATE_DIR / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def path_for(lab_id: str) -> Path:
    return STATE_DIR / f"{lab_id}.json"


def save(lab_id: str, record: dict[str, Any]) -> None:
    """Write a lab record atomically (readers never see half a file)."""
    _ensure_dir()
    tmp = STATE_DIR / f".{lab_id}.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path_for(lab_id))


def remove(lab_id: str) -> None:
    path_for(lab_id).unlink(missing_ok=True)


def load_all() -> list[dict[str, Any]]:
    """All lab records, oldest first; unreadable files are skipped (a crash mid-write leaves only a .tmp)."""
    records = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: r.get("created", 0))


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (None if gone): with the pid, identifies a process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its closing parenthesis.
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_alive(owner: dict[str, int] | None) -> bool:
    """Whether the process that owns a lab (None: a persistent CLI lab, owned by nobody) still runs."""
    return owner is not None and process_start_time(owner["pid"]) == owner["start"]
