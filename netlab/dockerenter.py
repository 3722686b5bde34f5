"""Run a command inside a running container as a child of this process, so a ``subprocess.Popen`` of it is a
faithful handle: ``python -I -S dockerenter.py PID [--env K=V]... [--cwd DIR] -- CMD [ARG...]``.

Why not ``docker exec``: its client relays no signals, so terminating the Popen leaves the command running in
the container. Why not ``nsenter``: entering a pid namespace makes it fork, and it relays no signals either.
This enters the namespaces of the container's process PID (its init), forks the command into the container's
pid namespace with the container's environment, relays signals to it and exits as the command does (killed
by a signal: by the same signal). Should this process die first, the command gets SIGKILL (PR_SET_PDEATHSIG).
Signals from the terminal (si_code SI_KERNEL) are not relayed: they reach the command's process group directly.

The command runs with this process's privileges (root, all capabilities), not the container's restricted set.
Standard library only, and not imported as part of netlab: it starts in a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import warnings  # noqa: F401  os.execvpe imports it lazily, and after the chroot it could not
from collections.abc import Iterable

# (namespace, CLONE_ flag); mnt last: after it, /proc/PID/... paths would resolve inside the container.
_NAMESPACES = (("ipc", 0x08000000), ("uts", 0x04000000), ("net", 0x40000000), ("pid", 0x20000000), ("mnt", 0x00020000))
_RELAYED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}
_SI_KERNEL = 0x80
_PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _parse(argv: list[str]) -> tuple[int, dict[str, str], str, list[str]]:
    if "--" not in argv or not argv or not argv[0].isdigit():
        raise SystemExit("usage: dockerenter.py PID [--env K=V]... [--cwd DIR] -- CMD [ARG...]")
    split = argv.index("--")
    env, cwd = {}, "/"
    for opt in argv[1:split]:
        if opt.startswith("--env="):
            key, _, value = opt[len("--env=") :].partition("=")
            env[key] = value
        elif opt.startswith("--cwd="):
            cwd = opt[len("--cwd=") :]
        else:
            raise SystemExit(f"dockerenter: unknown option {opt!r}")
    command = argv[split + 1 :]
    if not command:
        raise SystemExit("dockerenter: no command after --")
    return int(argv[0]), env, cwd, command


def _container_env(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        items = [item.decode(errors="surrogateescape") for item in fh.read().split(b"\0") if b"=" in item]
    return dict(item.split("=", 1) for item in items)


def _enter(pid: int, cwd: str) -> None:
    """Join the namespaces of ``pid`` and its root directory, then ``cwd`` inside it."""
    fds = [(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), flag) for name, flag in _NAMESPACES]
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for fd, flag in fds:
        if _libc.setns(fd, flag) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the container's namespaces failed: {os.strerror(err)} (needs root)")
        os.close(fd)
    os.fchdir(root)
    os.chroot(".")
    os.close(root)
    os.chdir(cwd)


def _child(command: list[str], env: dict[str, str], mask: Iterable[int]) -> None:
    """In the forked child (pid namespace of the container): exec the command, or exit 127/126 like a shell."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != 0:  # the parent (outside this pid namespace, so seen as 0) died before prctl
        os._exit(128 + signal.SIGKILL)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; an exec'd program must not inherit that
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"netlab: cannot run {command[0]!r} in the container: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def main(argv: list[str]) -> int:
    pid, overrides, cwd, command = _parse(argv)
    env = {**_container_env(pid), **overrides}
    _enter(pid, cwd)
    waited = _RELAYED | {signal.SIGCHLD}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)  # before fork: no signal can slip past the relay
    child = os.fork()
    if child == 0:
        _child(command, env, mask)
    while True:
        info = signal.sigwaitinfo(waited)
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                break
        elif info.si_code != _SI_KERNEL:
            os.kill(child, info.si_signo)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die of the same signal, so our parent sees what the command saw
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
