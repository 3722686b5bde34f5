"""Room for connections: each TCP connection holds a file descriptor, and many systems start processes with a
soft open-files limit of 1,024 (the hard limit is far higher), which a gateway with `--max-clients` 1024 would
reach before its client limit. `make_room` raises the soft limit as far as needed, up to the hard one, as
servers such as nginx (worker_rlimit_nofile) and Go's runtime do.
"""

from __future__ import annotations

import resource


def make_room(needed: int) -> str | None:
    """Raise this process's soft limit of open files to at least `needed` (children inherit it), up to the hard
    limit; None when there is room, else why not and the fix."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        return (
            f"{needed} open files are needed but the hard limit is {hard}: raise it (ulimit -Hn {needed}, or "
            f"LimitNOFILE={needed} in a systemd unit)"
        )
    return None
