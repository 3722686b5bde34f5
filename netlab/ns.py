"""Network-namespace primitives: enter one, find and kill the processes inside, resolve addresses.

Entering uses setns(2) on the calling *thread* only (a network namespace is per thread on Linux), so a
parent with other threads (pyzmq I/O threads, for instance) is never moved and needs no fork-unsafe
``preexec_fn``.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from pyroute2 import IPRoute
from pyroute2 import netns as _pyroute2_netns

NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

T = TypeVar("T")


def netns_path(name: str) -> Path:
    """Where ``ip netns`` and pyroute2 bind-mount the namespace called ``name``."""
    return NETNS_DIR / name


def list_netns() -> list[str]:
    """Names of all named network namespaces on the machine."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def create_netns(name: str) -> None:
    """Create a named network namespace (like ``ip netns add``)."""
    _pyroute2_netns.create(name)


def remove_netns(name: str) -> None:
    """Unmount and delete a named namespace; a missing one is not an error."""
    if netns_path(name).exists():
        _pyroute2_netns.remove(name)


def setns_fd(fd: int) -> None:
    """Move the calling thread into the network namespace behind ``fd``."""
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)} (needs root)")


def enter(path: str | os.PathLike[str]) -> None:
    """Move the calling thread into the namespace bind-mounted at ``path``. Threads it starts follow."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns_fd(fd)
    finally:
        os.close(fd)


def call_in_netns(name: str, fn: Callable[..., T], *args: object, timeout: float = 60.0) -> T:
    """Run ``fn(*args)`` in a fresh thread inside namespace ``name`` and return its result.

    The thread ends afterwards, so nothing has to switch back; what ``fn`` forks or spawns starts inside
    the namespace.
    """
    path = netns_path(name)
    if not path.exists():
        raise FileNotFoundError(f"network namespace {name!r} does not exist ({path}); is the lab up?")
    value: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            enter(path)
            value.append(fn(*args))
        except BaseException as exc:
            error.append(exc)

    worker = threading.Thread(target=body, name=f"netns-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"{fn!r} did not return within {timeout} s inside namespace {name!r}")
    if error:
        raise error[0]
    return value[0]


def _netns_id(path: str | os.PathLike[str]) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def pids_in_netns(name: str) -> list[int]:
    """Pids of all processes whose network namespace is ``name`` (children of lab processes included)."""
    try:
        target = _netns_id(netns_path(name))
    except FileNotFoundError:
        return []
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if _netns_id(f"/proc/{entry.name}/ns/net") == target:
                found.append(int(entry.name))
        except OSError:  # exited meanwhile, or a zombie (its ns links are gone)
            continue
    return sorted(found)


def kill_pids(pids: Iterable[int], grace: float = 2.0, timeout: float = 5.0) -> list[int]:
    """SIGTERM each pid, SIGKILL what is still alive after ``grace`` s; return pids still alive after that.

    Pid file descriptors make this immune to pid reuse and let us wait for exit without polling.
    """
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
    try:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, timeout)):
            for fd in fds.values():
                try:
                    signal.pidfd_send_signal(fd, sig)
                except ProcessLookupError:
                    continue
            _wait_exited(fds, wait)
            if not fds:
                return []
        return sorted(fds)
    finally:
        for fd in fds.values():
            os.close(fd)


def _wait_exited(fds: dict[int, int], timeout: float) -> None:
    """Drop from ``fds`` (closing them) every process that exits within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        poller = select.poll()
        by_fd = {fd: pid for pid, fd in fds.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(left * 1000):
            os.close(fd)
            del fds[by_fd[fd]]


def interface_ipv4(ifname: str, netns: str | None = None) -> str:
    """IPv4 address of ``ifname`` in namespace ``netns`` (None: the caller's own namespace).

    OpenPGM resolves the interface part of ``epgm://IFACE;GROUP:PORT`` through the resolver, which fails
    inside a namespace; build the endpoint from this address instead.
    """
    with IPRoute(netns=netns, flags=0) if netns else IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            where = f"namespace {netns!r}" if netns else "this namespace"
            raise LookupError(f"no interface {ifname!r} in {where}")
        addrs = [a.get_attr("IFA_ADDRESS") for a in ipr.addr("dump", index=index[0], family=socket.AF_INET)]
    if not addrs:
        raise LookupError(f"interface {ifname!r} has no IPv4 address")
    return str(addrs[0])
