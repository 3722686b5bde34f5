"""`zeps doctor`: what this machine can run, checked one fact at a time, each with the fix when it fails.

Every check returns a `Finding`: what was looked at, whether it is fine, whether the requested setup needs it
(a missing need makes the command exit 1; a missing nicety is a hint), and one line that says what was seen
or what to install or set. The checks read only this machine (libraries, /proc, /sys, the routing table) and,
when given, the etcd URLs; they send nothing to a multicast group.
"""

from __future__ import annotations

import ipaddress
import json
import ssl
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.transport.tls import EtcdTls

MULTICAST_TRANSPORTS = ("epgm", "pgm", "norm", "udp")
TRANSPORTS = (*MULTICAST_TRANSPORTS, "tcp")
SOCKET_BUFFER = 4 * 1024 * 1024  # gateway.mcast.Tuning's sndbuf and rcvbuf
IFF_UP, IFF_LOOPBACK, IFF_MULTICAST = 0x1, 0x8, 0x1000
_PYZMQ_PGM = "PYZMQ_NO_BUNDLE=1 pip install --no-binary pyzmq pyzmq (after apt-get install libzmq3-dev)"


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    needed: bool  # by the transports asked about: a missing need fails the command
    line: str


def check(transports: Sequence[str], etcd: Sequence[str], etcd_tls: EtcdTls | None = None) -> list[Finding]:
    """Every finding for a setup using `transports` (none: report only) and the etcd cluster at `etcd` (over
    TLS with `etcd_tls`)."""
    return [*libraries(transports), *system(transports), *(_etcd(url, etcd_tls) for url in etcd)]


def libraries(transports: Sequence[str]) -> list[Finding]:
    """The engines and the compiled parts (loading a library runs ldconfig: this starts a process)."""
    from gateway.transport import norm, pgm

    wanted = set(transports)
    return [
        _library("openpgm", bool(wanted & {"epgm", "pgm"}), pgm.lib, "epgm:// and pgm:// need libpgm: apt-get install "
                 "libpgm-5.3-0", "libpgm loads: epgm:// and pgm:// run on OpenPGM (the default engine)"),
        _library("libnorm", "norm" in wanted, norm.lib, "norm:// needs libnorm: apt-get install libnorm1",
                 "libnorm loads: norm:// is available"),
        _pyzmq_engines(),
        *_compiled(),
    ]  # fmt: skip


def system(transports: Sequence[str], sys_root: Path = Path("/")) -> list[Finding]:
    """The machine's network settings, read from /sys and /proc under `sys_root`."""
    multicast = bool(set(transports) & set(MULTICAST_TRANSPORTS))
    return [_multicast_interface(multicast, sys_root), *_socket_buffers(multicast, sys_root)]


def _library(name: str, needed: bool, load: Callable[[], object], missing: str, present: str) -> Finding:
    """A library loaded with ctypes (`load` raises a ZepsError naming the package when it is absent)."""
    from gateway.errors import ZepsError

    try:
        load()
    except ZepsError:
        return Finding(name, False, needed, missing)
    return Finding(name, True, needed, present)


def _pyzmq_engines() -> Finding:
    import zmq

    has = [name for name in ("pgm", "norm", "curve") if zmq.has(name)]
    if "pgm" in has:
        return Finding(
            "pyzmq", True, False, f"pyzmq {zmq.__version__} on libzmq {zmq.zmq_version()} has {', '.join(has)}"
        )
    return Finding(
        "pyzmq",
        False,
        False,
        f"pyzmq's libzmq lacks pgm (has: {', '.join(has) or 'none'}); only --pgm-engine libzmq needs it: {_PYZMQ_PGM}",
    )


def _compiled() -> Iterable[Finding]:
    from gateway.transport import pgm
    from gateway.wire import record_loops

    fix = "reinstall with a C compiler (apt-get install gcc python3-dev): pip install --force-reinstall ."
    if record_loops.IMPLEMENTATION == "compiled":
        yield Finding("record loops", True, False, "the batch format's record loops are compiled")
    else:
        yield Finding("record loops", False, False, f"the record loops run in Python (slower): {fix}")
    if pgm._native_loop() is not None:
        yield Finding("pgm loop", True, False, "OpenPGM's I/O loops run in native threads")
    else:
        yield Finding(
            "pgm loop", False, False, f"OpenPGM's loops run in Python threads: apt-get install libpgm-dev; {fix}"
        )


def _multicast_interface(needed: bool, sys_root: Path) -> Finding:
    """An interface that is up, not loopback, with multicast on; and a route for 239.0.0.0/8 (or a default)."""
    up = []
    for flags in sorted((sys_root / "sys/class/net").glob("*/flags")):
        value = int(flags.read_text(), 16)
        if value & IFF_UP and value & IFF_MULTICAST and not value & IFF_LOOPBACK:
            up.append(flags.parent.name)
    if not up:
        return Finding(
            "multicast", False, needed, "no interface is up with multicast on: ip link set IF up multicast on"
        )
    if not _multicast_route(sys_root / "proc/net/route"):
        return Finding(
            "multicast",
            False,
            needed,
            f"no route for 239.0.0.0/8 and no default route: ip route add 224.0.0.0/4 dev {up[0]}",
        )
    shown = ", ".join(up[:4]) + (f" and {len(up) - 4} more" if len(up) > 4 else "")
    return Finding("multicast", True, needed, f"interfaces up with multicast: {shown}")


def _multicast_route(routes: Path) -> bool:
    group = ipaddress.IPv4Address("239.192.0.1")
    for line in routes.read_text().splitlines()[1:]:
        fields = line.split()
        dest, mask = (ipaddress.IPv4Address(bytes.fromhex(f)[::-1]) for f in (fields[1], fields[7]))
        net = ipaddress.IPv4Network(f"{dest}/{mask}", strict=False)
        if group in net:  # 0.0.0.0/0, the default route, included
            return True
    return False


def _socket_buffers(needed: bool, sys_root: Path) -> Iterable[Finding]:
    for name in ("rmem_max", "wmem_max"):
        path = sys_root / "proc/sys/net/core" / name
        value = int(path.read_text())
        if value >= SOCKET_BUFFER:
            yield Finding(name, True, False, f"net.core.{name} = {value:,}: socket buffers fit the feeds")
        else:
            yield Finding(
                name,
                False,
                False,
                f"net.core.{name} = {value:,} caps the 4 MiB socket buffers (loss in bursts): "
                f"sysctl -w net.core.{name}={SOCKET_BUFFER}",
            )


def _etcd(url: str, tls: EtcdTls | None, timeout_s: float = 2.0) -> Finding:
    context = tls.context() if tls is not None else None
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/version", timeout=timeout_s, context=context) as answer:
            version = json.loads(answer.read()).get("etcdserver", "?")
    except (OSError, ValueError) as exc:
        cause = getattr(exc, "reason", exc)  # urllib wraps a TLS failure in a URLError
        if isinstance(cause, ssl.SSLError):
            fix = "give --etcd-ca (the CA of etcd's certificate), --etcd-cert and --etcd-key (a client cert of that CA)"
            return Finding("etcd", False, True, f"etcd at {url} refused TLS ({cause.reason or cause}): {fix}")
        return Finding("etcd", False, True, f"etcd at {url} does not answer ({exc}): start it, or check the URL")
    secured = " over TLS, with our client certificate" if tls is not None else ""
    return Finding("etcd", True, True, f"etcd {version} answers at {url}{secured}")
