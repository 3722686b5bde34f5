"""A server process's heap, settled once it has started: its long-lived objects out of the collector's way.

Why: CPython's full collection walks every object it tracks, holding the GIL. A started `zeps gateway` or
`zeps replay` tracks about 44,000 (modules, classes, configuration, sockets), and one full collection of them
took 24-28 ms of CPU in the gateway's process (docs/benchmarks.md): every record in flight waited for it, a
p99.9 stall. Those objects live as long as the process, so they are frozen (`gc.freeze`, as pre-forking
servers do); later collections walk only what was made since, and cycles made since are still collected.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect what starting up left behind, then freeze the rest: call once, just before serving."""
    gc.collect()
    gc.freeze()
