"""`zeps bench`: bounded, self-cleaning benchmarks of ZEPS against its peers (issue #8), in namespace labs.

One module per scenario (`TITLE`, `estimate(settings)`, `run(settings) -> Result`), `runner` for what they
share (settings, medians, progress, /proc probes, the machine record), `report` for Markdown and plots,
`pipeline` and `nats` for the two systems' processes. docs/benchmarks.md is what `zeps bench all` writes.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from gateway.errors import ZepsError

SCENARIOS = (
    "throughput",
    "fanout",
    "fanin",
    "replay",
    "latency",
    "recovery",
    "norm",
    "memory",
    "sink",
    "failover",
    "mirror",
    "chaos",
    "soak",
)
ON_DEMAND = ("soak",)  # too long for `all`: run by name


class BenchError(ZepsError, RuntimeError):
    """A benchmark could not run or did not check out; the message says why and what to do."""


def scenario(name: str) -> ModuleType:
    if name not in SCENARIOS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(SCENARIOS)} or all")
    return importlib.import_module(f"gateway.bench.{name}")
