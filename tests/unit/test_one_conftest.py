"""Lab hosts import tests/conftest.py by its module name, "conftest": a second conftest.py anywhere under tests/
takes that name over in a full run, and every lab host then dies importing the wrong module."""

from __future__ import annotations

from pathlib import Path


def test_tests_hold_one_conftest() -> None:
    tests = Path(__file__).resolve().parents[1]
    assert sorted(p.relative_to(tests).as_posix() for p in tests.rglob("conftest.py")) == ["conftest.py"]
