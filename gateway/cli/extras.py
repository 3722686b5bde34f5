"""The optional extras of pyproject.toml as the command line names them: which modules each brings, and the one
line that says how to install one that is missing.

A command that needs an extra checks it with `require` before it starts anything; an import that fails later
anyway (a module this table does not list) still ends in one line through `explain` (gateway.cli.main).
"""

from __future__ import annotations

import importlib.util

from gateway.errors import ConfigError

EXTRAS = {
    "lab": ("scapy", "docker", "packaging"),
    "top": ("rich",),
    "spark": ("pyspark", "pyarrow", "numpy", "matplotlib"),
}


def install(extra: str) -> str:
    return f"pip install 'zeps-gateway[{extra}]'"


def importable(module: str) -> bool:
    """Whether `module` can be imported, without importing it (scapy, say, must be imported inside a lab host)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # blocked, or a broken half-import
        return False


def missing(extra: str, modules: tuple[str, ...]) -> str:
    return f"this needs the {extra} extra ({', '.join(modules)} not installed): {install(extra)}"


def require(extra: str, *modules: str) -> None:
    """ConfigError naming the extra and the pip command unless `modules` (default: all of the extra's) import."""
    absent = tuple(m for m in modules or EXTRAS[extra] if not importable(m))
    if absent:
        raise ConfigError(missing(extra, absent))


def explain(exc: ModuleNotFoundError) -> str | None:
    """The one line for a missing module that belongs to an extra, or None for any other missing module."""
    top = (exc.name or "").partition(".")[0]
    return next((missing(extra, (top,)) for extra, modules in EXTRAS.items() if top in modules), None)
