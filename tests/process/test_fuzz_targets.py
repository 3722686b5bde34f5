"""A short coverage-guided fuzzing run of every decoder (tests/fuzz/run.py, atheris): a few thousand
executions per target, each in its own process, from the committed seeds. `make fuzz` runs the long one
(1,000,000 executions per target). A crash fails the test with the target's traceback; its input is in
build/fuzz/crashes/ and becomes a regression input under tests/fuzz/corpus (test_fuzz_corpus replays it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

from run import NAMES  # noqa: E402

RUN = FUZZ / "run.py"
RUNS = {name: 1000 if name in ("journal", "stream_files") else 3000 for name in NAMES}  # files at every execution
MAX_S = 10  # per target: a loaded machine runs fewer, never longer


@pytest.mark.parametrize("name", NAMES)
def test_a_short_fuzzing_run_finds_no_crash(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = [sys.executable, str(RUN), name, f"-runs={RUNS[name]}", f"-max_total_time={MAX_S}", "-print_final_stats=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    executed = re.search(r"stat::number_of_executed_units: (\d+)", proc.stderr)
    assert executed and int(executed.group(1)) > 0, proc.stderr[-2000:]
    with capsys.disabled():
        print(f"\n  fuzz {name}: {int(executed.group(1)):,} executions", flush=True)
