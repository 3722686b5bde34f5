"""The refused-send policy (gateway.transport.send_errors): one log line per episode and one when it ends,
every refusal counted by op and errno; and the CLI's last line for an OS error that still ends a command."""

from __future__ import annotations

import errno
import logging

import pytest
from prometheus_client import generate_latest

from gateway.cli.main import _explain
from gateway.transport.metrics import Registry
from gateway.transport.send_errors import MAX_EPISODES, SendErrors, errno_name

EPERM = PermissionError(errno.EPERM, "Operation not permitted")
UNREACH = OSError(errno.ENETUNREACH, "Network is unreachable")


def _count(registry: Registry, op: str, name: str) -> float:
    value = registry.get_sample_value("zeps_test_send_errors_total", {"op": op, "errno": name})
    assert value is not None
    return value


def test_an_episode_is_logged_once_and_again_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry()
    errors = SendErrors("test", ["multicast", "etcd"], registry)
    with caplog.at_level(logging.WARNING, "gateway.transport.send_errors"):
        for _ in range(1000):
            errors.refused("multicast", "udp://10.0.0.1;239.1.1.1:7700", EPERM)
        errors.refused("multicast", "udp://10.0.0.1;239.1.1.1:7700", UNREACH)
        errors.refused("etcd", "http://10.0.0.9:2379", UNREACH, "tried again next tick")
        assert len(caplog.records) == 2
        start = caplog.records[0].getMessage()
        assert "multicast to udp://10.0.0.1;239.1.1.1:7700 refused (EPERM: Operation not permitted)" in start
        assert "dropped" in start and "firewall" in start
        assert "tried again next tick" in caplog.records[1].getMessage()
        errors.sent("multicast", "udp://10.0.0.1;239.1.1.1:7700")
        errors.sent("multicast", "udp://10.0.0.1;239.1.1.1:7700")  # no episode open: nothing to say
        assert len(caplog.records) == 3
        end = caplog.records[2].getMessage()
        assert "goes through again, after 1001 refused (last ENETUNREACH)" in end
    assert errors.open_episodes() == {("etcd", "http://10.0.0.9:2379"): "ENETUNREACH"}
    assert _count(registry, "multicast", "EPERM") == 1000
    assert _count(registry, "multicast", "ENETUNREACH") == 1
    assert _count(registry, "etcd", "ENOBUFS") == 0  # the usual errnos show from the start, at 0
    with caplog.at_level(logging.WARNING, "gateway.transport.send_errors"):
        errors.refused("multicast", "udp://10.0.0.1;239.1.1.1:7700", EPERM)  # a new episode: logged again
    assert len(caplog.records) == 4


def test_episodes_are_per_endpoint() -> None:
    errors = SendErrors("test", [], Registry())
    errors.refused("fill-answer", "10.0.0.2:4000", EPERM)
    errors.refused("fill-answer", "10.0.0.3:4000", EPERM)
    errors.sent("fill-answer", "10.0.0.2:4000")
    assert errors.open_episodes() == {("fill-answer", "10.0.0.3:4000"): "EPERM"}


def _wrapped() -> Exception:
    """An OSError two wrappers deep, the way requests and etcd3gw hand one on."""
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        except OSError as exc:
            raise RuntimeError("connection failed") from exc
    except RuntimeError:
        try:
            raise ValueError("request failed")  # raised while handling: the wrapped error is its context
        except ValueError as outer:
            return outer


def test_errno_names() -> None:
    assert errno_name(_wrapped()) == "ECONNREFUSED"
    assert errno_name(EPERM) == "EPERM"
    assert errno_name(OSError("no errno")) == "OSError"
    assert errno_name(OSError(99999, "made up")) == "99999"


def test_the_exposition_names_the_process() -> None:
    registry = Registry()
    SendErrors("test", ["announce"], registry)
    text = generate_latest(registry).decode()
    assert 'zeps_test_send_errors_total{errno="EPERM",op="announce"} 0.0' in text


def _raised(exc: OSError) -> OSError:
    try:
        raise exc
    except OSError as caught:
        return caught


def test_the_cli_never_prints_a_bare_errno() -> None:
    code, line = _explain(_raised(PermissionError(errno.EPERM, "Operation not permitted")))
    assert code == 1 and not line.startswith("[Errno")
    assert "(EPERM)" in line and "_raised (tests" not in line and "firewall" in line
    assert "a system call failed" in line  # raised outside zeps' own code: said so
    code, line = _explain(_raised(OSError(errno.ENETUNREACH, "Network is unreachable")))
    assert "ENETUNREACH" in line and "ip route" in line
    code, line = _explain(_raised(FileNotFoundError(errno.ENOENT, "No such file or directory", "/nowhere/j")))
    assert "on /nowhere/j" in line and "check the path" in line


def test_episodes_that_never_end_are_bounded() -> None:
    errors = SendErrors("test", [], Registry())
    for port in range(MAX_EPISODES + 10):  # e.g. a leader restarted on a new port each time
        errors.refused("peer-link", f"tcp://10.0.0.1:{port}", EPERM)
    episodes = errors.open_episodes()
    assert len(episodes) == MAX_EPISODES and ("peer-link", f"tcp://10.0.0.1:{MAX_EPISODES + 9}") in episodes
