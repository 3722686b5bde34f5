"""Fixtures of the process tier (real processes on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.etcd import EtcdProcess


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A real etcd of the test's own, killed at its end (a test module may define its own `etcd`)."""
    server = EtcdProcess(tmp_path).start()
    yield server
    server.kill()
