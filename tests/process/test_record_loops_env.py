"""The record loops' switch at import time, in a fresh interpreter (tests/unit/test_record_loops.py: the loops)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_environment_can_force_the_python_loops() -> None:
    """ZEPS_PURE_PYTHON=1 at import: what `zeps bench` uses to measure what the compiled loops win."""
    code = "from gateway.wire import record_loops as L; print(L.IMPLEMENTATION, L.check is L.py_check)"
    env = {**os.environ, "ZEPS_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["python", "True"]
