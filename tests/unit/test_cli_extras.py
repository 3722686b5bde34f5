"""gateway.cli.extras: a missing module that belongs to an extra is named with the extra and its pip command;
any other missing module is not dressed up as one (tests/process/test_extras.py runs the commands)."""

from __future__ import annotations

import pytest

from gateway.cli.extras import EXTRAS, explain, require
from gateway.errors import ConfigError


@pytest.mark.parametrize(("module", "extra"), [(m, e) for e, ms in EXTRAS.items() for m in ms])
def test_a_module_of_an_extra_names_the_extra(module: str, extra: str) -> None:
    line = explain(ModuleNotFoundError(f"No module named '{module}.sub'", name=f"{module}.sub"))
    assert line == f"this needs the {extra} extra ({module} not installed): pip install 'zeps-gateway[{extra}]'"


def test_another_missing_module_is_left_alone() -> None:
    assert explain(ModuleNotFoundError("No module named 'nosuch'", name="nosuch")) is None


def test_require_names_only_what_is_missing() -> None:
    require("lab", "pytest")  # importable: nothing raised
    with pytest.raises(ConfigError, match=r"the lab extra \(nosuch_module not installed\): pip install"):
        require("lab", "pytest", "nosuch_module")
