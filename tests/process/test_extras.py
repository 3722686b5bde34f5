"""An install without extras (`pip install zeps-gateway`, no [lab], [top] or [spark]) as a user meets it: every
command that needs an extra says which, and the pip command, in one line; the others work. The extras' modules
are hidden from the interpreter (tests/support/no_extras), which is what a fresh venv without them looks like
to an import, and takes no network or package cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.servers import STREAM, Stream

from gateway.cli.extras import EXTRAS

BIN = Path(sys.executable).parent
HIDE = ",".join(m for modules in EXTRAS.values() for m in modules)
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("ZEPS_")},
    "PYTHONPATH": str(Path(__file__).parents[1] / "support" / "no_extras"),
    "ZEPS_TEST_HIDE": HIDE,
}


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60, env=ENV)


def test_the_extras_are_hidden() -> None:
    done = subprocess.run([sys.executable, "-c", "import docker"], capture_output=True, text=True, env=ENV)
    assert done.returncode == 1 and "No module named 'docker'" in done.stderr


@pytest.mark.parametrize(
    ("argv", "code", "extra"),
    [
        (("netlab", "up", "--backend", "docker"), 2, "lab"),
        (("zeps", "demo"), 2, "lab"),
        (("zeps", "top", "--gateway", "127.0.0.1:1"), 2, "top"),  # as every zeps command short of an extra
        # checked before a benchmark runs (minutes), not when its report is drawn or its sniffer started
        (("zeps", "bench", "sink", "--quick"), 2, "spark"),
        (("zeps", "bench", "recovery", "--quick"), 2, "lab"),
        (("zeps", "bench", "throughput", "--quick", "--report", "/tmp/zeps-no-extras.md"), 2, "spark"),
    ],
)
def test_a_command_that_needs_an_extra_names_it_and_the_pip_command(argv: tuple[str, ...], code: int, extra: str):
    done = run(*argv)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"pip install 'zeps-gateway[{extra}]'" in done.stderr and "a bug" not in done.stderr


def test_the_spark_commands_name_the_spark_extra(tmp_path: Path) -> None:
    stream = Stream(tmp_path, STREAM)
    stream.write(1, per_batch=3)
    stream.writer.close()
    for argv in (("export", "--to", str(tmp_path / "out.parquet")), ("analyze",)):
        done = run("zeps", argv[0], "--journal", str(tmp_path), "--stream", STREAM, *argv[1:])
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "pip install 'zeps-gateway[spark]'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv", [("netlab", "--help"), ("netlab", "status"), ("zeps", "--help"), ("zeps", "demo", "-h")]
)
def test_commands_that_need_no_extra_work_without_them(argv: tuple[str, ...]) -> None:
    done = run(*argv)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
