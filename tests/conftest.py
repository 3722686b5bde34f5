"""Shared fixtures. netlab ones: ``make_lab`` builds labs that are removed at test end, pass or fail."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, settings

from gateway.mcast import LibzmqSub
from netlab import Lab

# Property tests judge results, never speed: no per-example deadline, and no health check that fails a test
# because the machine is busy (CI and parallel work share two cores). Speed lives in `zeps bench`.
settings.register_profile("zeps", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("zeps")

NEEDS_ROOT = "netlab needs root (network namespaces): run the tests as root"
UNIT = Path(__file__).parent / "unit"


class TierBreach(BaseException):
    """A unit test opened a socket or started a process. BaseException: no `except Exception` swallows it."""


@pytest.fixture(autouse=True)
def unit_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """tests/unit opens no socket and starts no process (docs/architecture.md, the test tiers): each attempt
    raises TierBreach and fails the test, even when it happened in a thread that swallowed the error."""
    if UNIT not in request.node.path.parents:
        yield
        return
    breaches: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*_: object, **__: object) -> Any:
            breaches.append(what)
            raise TierBreach(f"a unit test {what}: move it to tests/process (tests/unit: no sockets, no processes)")

        return refused

    monkeypatch.setattr(socket.socket, "__init__", refuse("opened a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("started a process"))
    monkeypatch.setattr(os, "fork", refuse("forked a process"))
    yield
    if breaches:
        pytest.fail(f"tests/unit {breaches[0]}: move the test to tests/process", pytrace=False)


@pytest.fixture
def make_lab() -> Iterator[Callable[..., Lab]]:
    """Factory: ``make_lab(hosts=["pub", "sub"], name=None)`` returns a lab that is up.

    Fails (does not skip) without root: a skipped multicast suite would look like a passing one.
    """
    if os.geteuid() != 0:
        pytest.fail(NEEDS_ROOT, pytrace=False)
    labs: list[Lab] = []

    def factory(hosts: int | Sequence[str] = 2, name: str | None = None) -> Lab:
        lab = Lab(hosts, name).up()
        labs.append(lab)
        return lab

    yield factory
    errors = []
    for lab in reversed(labs):
        try:
            lab.down()
        except Exception as exc:
            errors.append(f"{lab.name}: {exc}")
    if errors:
        pytest.fail(f"lab teardown failed: {errors}", pytrace=False)


@pytest.fixture
def lab(make_lab: Callable[..., Lab]) -> Lab:
    """A lab with hosts "pub" and "sub"."""
    return make_lab(["pub", "sub"])


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[object]:
    """A real etcd of the test's own (support.etcd.EtcdProcess), killed at its end; a module may define its own."""
    from support.etcd import EtcdProcess

    server = EtcdProcess(tmp_path).start()
    yield server
    server.kill()


# One local Spark for every Spark test module (a session starts in 4-30 s). Here, not in a conftest.py of its own:
# lab hosts import this module by its name, "conftest", which a second conftest.py would take over.
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


# The unit tier's feed: here, not in tests/unit/conftest.py, for the same reason as above (lab hosts import this
# module by its name, "conftest", which a second conftest.py would take over).
@pytest.fixture
def feed() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """An inproc PUSH -> PULL pair standing in for a multicast feed: (sender, receiver); the
    receiver a `LibzmqSub`, as open_sub makes for libzmq's PGM (read_burst asks it `waiting()`)."""
    ctx = zmq.Context.instance()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL, socket_class=LibzmqSub)
    address = f"inproc://feed-{time.monotonic_ns()}"
    pull.bind(address)
    push.connect(address)
    yield push, pull
    push.close(linger=0)
    pull.close(linger=0)
