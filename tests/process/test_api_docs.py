"""The API reference (`make docs`: pdoc over the package's own docstrings, docs/client.md says why pdoc): every
public name, `gateway.__all__`, is in it with a docstring that names each of its arguments, and the build warns
about nothing. pdoc runs in a process of its own, as `make docs` runs it."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import gateway


def arguments(obj: object) -> list[str]:
    """The named arguments a caller passes: a class's constructor's, a function's (not *args, **kwargs)."""
    if inspect.isclass(obj):
        if issubclass(obj, BaseException) and "__init__" not in vars(obj):
            return []  # an exception raised with its message only
        obj = obj.__init__  # type: ignore[misc]
    if not callable(obj):
        return []
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in params if p.name not in ("self", "cls") and p.kind not in skip]


def docstring(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and "__init__" in vars(obj):
        doc += "\n" + (inspect.getdoc(vars(obj)["__init__"]) or "")
    return doc


def test_every_public_name_has_a_docstring_naming_its_arguments() -> None:
    missing = {}
    for name in gateway.__all__:
        if name == "__version__":
            continue
        obj = getattr(gateway, name)
        doc = docstring(obj)
        assert doc.strip(), f"gateway.{name} has no docstring"
        absent = [a for a in arguments(obj) if not re.search(rf"\b{a}\b", doc)]
        if absent:
            missing[name] = absent
    assert missing == {}, "document the arguments listed, in the class's or its constructor's docstring"


def test_the_reference_builds_without_a_warning_and_holds_every_public_name(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pdoc", "gateway", "-o", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", (done.stdout, done.stderr)
    page = (tmp_path / "gateway.html").read_text()
    absent = [name for name in gateway.__all__ if name != "__version__" and f'id="{name}"' not in page]
    assert not absent, f"not in the reference: {absent}"
