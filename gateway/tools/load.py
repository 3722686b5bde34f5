"""A generated load: numbered bodies over a set of keys, optionally paced (zeps publish --count, the demo)."""

from __future__ import annotations

import time
from collections.abc import Iterator


def generated(count: int, size: int, keys: int, rate: float) -> Iterator[tuple[str, bytes]]:
    """(key, body) pairs; each body starts with its index so receivers can check content."""
    pad = b"x" * size
    start = time.monotonic()
    for i in range(count):
        if rate > 0:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        yield f"key{i % keys:03d}", (b"%d:" % i + pad)[: max(size, len(b"%d:" % i))]
