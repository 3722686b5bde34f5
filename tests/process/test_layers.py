"""The floor plan holds: imports run downward only, the client needs no lab, every exception is a ZepsError."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gateway
from gateway.errors import ZepsError

REPO = Path(__file__).resolve().parents[2]
# import-linter's command, run with -S so that no .pth file (the editable install's) decides where `gateway` is:
# the tree analysed is the one first on PYTHONPATH.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *site_packages])}
    argv = [sys.executable, "-S", "-c", LINT_IMPORTS, "--no-cache", "--config", str(REPO / "pyproject.toml")]
    return subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def test_the_layer_contracts_are_kept() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_way_import_breaks_the_contracts(tmp_path: Path) -> None:
    """The check can fail: the same tree with one upward import (wire -> cli) is refused, naming the line."""
    for package in ("gateway", "netlab"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    ttl = tmp_path / "gateway" / "wire" / "ttl.py"
    ttl.write_text(ttl.read_text() + "\nfrom gateway.cli import main as _upward\n")
    done = _lint_imports(tmp_path)
    assert done.returncode == 1
    assert "gateway.wire is not allowed to import gateway.cli" in done.stdout
    assert "gateway.wire.ttl -> gateway.cli.main" in done.stdout


def test_the_public_api_imports_without_the_lab() -> None:
    """`pip install zeps-gateway` has no docker, scapy or netlab: the client must not need them."""
    code = (
        "import sys\n"
        "for name in ('docker', 'scapy', 'netlab', 'pyspark', 'packaging'):\n"
        "    sys.modules[name] = None\n"
        "from gateway import Subscriber, AsyncSubscriber, Publisher, ZepsError, DataLoss\n"
        "import gateway.sequencer.gateway, gateway.replay, gateway.cli.main\n"
        "assert issubclass(DataLoss, ZepsError)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _library_modules() -> list[str]:
    skip = ("gateway.spark", "gateway.bench", "gateway.tools", "gateway.cli.__main__")
    return [
        m.name
        for m in pkgutil.walk_packages(gateway.__path__, "gateway.")
        if not m.name.startswith(skip) and not m.name.endswith("_record_loops")
    ]


@pytest.mark.parametrize("module", _library_modules())
def test_every_exception_class_derives_from_zeps_error(module: str) -> None:
    mod = importlib.import_module(module)
    for name, obj in vars(mod).items():
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("gateway."):
            assert issubclass(obj, ZepsError), f"{module}.{name} does not derive from ZepsError"


def test_the_public_api_names_what_it_exports() -> None:
    for name in gateway.__all__:
        assert hasattr(gateway, name), name
