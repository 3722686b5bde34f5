"""The Python snippets of README.md's quick start, as a test runs them (with its own addresses)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start_snippets() -> list[str]:
    """The ```python blocks of the "Quick start in Python" section, in order."""
    text = README.read_text()
    section = text.split("## Quick start in Python", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)
