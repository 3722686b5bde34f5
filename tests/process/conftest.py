"""Fixtures shared by the process tests: one local Spark for every Spark test module (a session starts in 4-30 s)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local Spark for the whole test session: two cores, a failed task tried up to 4 times (local[N,F]: local
    mode retries only when the master says so), small, quiet, loopback only."""
    from gateway.spark import get_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = get_session(
        "zeps-tests",
        master="local[2,4]",
        conf={
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        },
    )
    try:
        yield session
    finally:
        session.stop()
