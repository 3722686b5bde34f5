"""A lab: N hosts (network namespaces) on one Linux bridge, with its own /24 and multicast groups.

Every object a lab creates carries its id (``zl`` + 3 hex digits) as a name prefix: the bridge
``zl3a9-br``, root-side veth ends ``zl3a9-v1``..., namespaces ``zl3a9-pub``..., the record
/run/netlab/zl3a9.json and the iptables rule naming the bridge. That is what lets two labs coexist and
:func:`down_all` find the leftovers of a crashed run without touching anything else.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netlab import firewall, ns, state
from netlab.procs import HostProcess

PREFIX = "zl"
LAB_NET = ipaddress.IPv4Network("10.250.0.0/16")
GROUP_NET = ipaddress.IPv4Network("239.192.0.0/16")
HOST_IFNAME = "lab0"
MAX_HOSTS = 250
ROOT_MESSAGE = "netlab needs root (network namespaces): run as root, e.g. with sudo"
# netlab's optional parts (Docker labs, packet capture and injection) come with the project's lab extra.
EXTRA_MESSAGE = "{what} needs {module}, which is not installed: pip install 'zeps-gateway[lab]'"

_OBJECT_RE = re.compile(r"^(zl[0-9a-f]{3})-")
_PREFIX_RE = re.compile(r"^zl[0-9a-f]{0,3}-?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_EEXIST, _ENODEV = 17, 19


class LabError(RuntimeError):
    """A lab could not be built or removed; the message says why and what to do."""


class ExtraMissing(LabError):
    """An optional part needs a module of the lab extra (EXTRA_MESSAGE): an install to fix, exit 2 as in zeps."""


@dataclass(frozen=True)
class Host:
    """One lab host: a network namespace with one interface on the lab bridge."""

    name: str
    netns: str  # namespace name, under /run/netns
    ifname: str  # its interface on the lab LAN (inside the namespace)
    ip: str  # IPv4 address of ``ifname``
    veth: str  # the peer end, enslaved to the bridge in the root namespace

    @property
    def netns_path(self) -> str:
        return str(ns.netns_path(self.netns))


def _check_name(kind: str, name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"bad {kind} name {name!r}: use 1-32 of [A-Za-z0-9_.-], starting with a letter or digit")
    return name


def pick_subnet(
    lab_id: str, used: Iterable[ipaddress.IPv4Network], net: ipaddress.IPv4Network = LAB_NET
) -> ipaddress.IPv4Network:
    """The /24 of ``net`` for ``lab_id``: derived from the id, moving on past any that overlap ``used``."""
    used = list(used)
    subnets = list(net.subnets(new_prefix=24))
    start = int(lab_id[-3:], 16) % len(subnets)
    for candidate in subnets[start:] + subnets[:start]:
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise LabError(f"every /24 of {net} is in use on this machine; remove old labs: netlab down --all")


def claim_id(
    prefix: str,
    net: ipaddress.IPv4Network,
    taken: Iterable[str],
    used: Iterable[ipaddress.IPv4Network],
    create: Callable[[str, ipaddress.IPv4Network], bool],
) -> tuple[str, ipaddress.IPv4Network]:
    """A free lab id (``prefix`` + 3 hex digits) and its /24 of ``net``: ``create(id, subnet)`` makes the lab's
    network object (a bridge, a Docker network) and returns False if another program took that id meanwhile."""
    taken, used = set(taken), list(used)
    for _ in range(64):
        lab_id = f"{prefix}{secrets.randbelow(4096):03x}"
        if lab_id not in taken and create(lab_id, subnet := pick_subnet(lab_id, used, net)):
            return lab_id, subnet
    raise LabError("found no free lab id in 64 tries; remove old labs: netlab down --all")


def _used_networks(ipr: IPRoute) -> list[ipaddress.IPv4Network]:
    """IPv4 networks in use: root-namespace addresses and routes (not the default), and other labs' subnets."""
    used = []
    for msg in ipr.addr("dump", family=2):
        used.append(ipaddress.IPv4Network(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}", strict=False))
    for msg in ipr.route("dump", family=2):
        if msg["dst_len"] and msg.get_attr("RTA_DST"):
            used.append(ipaddress.IPv4Network(f"{msg.get_attr('RTA_DST')}/{msg['dst_len']}", strict=False))
    used.extend(ipaddress.IPv4Network(r["subnet"]) for r in state.load_all())
    return used


def _disable_ipv6(ifname: str) -> None:
    """Keep the root namespace off the lab LAN: no IPv6 link-local address on the bridge or its ports."""
    knob = Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6")
    if knob.exists():
        knob.write_text("1")


class Lab:
    """Throw-away LAN of network namespaces. Use as a context manager, or call :meth:`up` / :meth:`down`.

    ``hosts`` is a count (hosts h1..hN) or a list of host names. ``persistent`` labs (``netlab up``) have
    no owner process; others record their creator so ``down_all`` leaves labs of running programs alone.
    """

    def __init__(self, hosts: int | Sequence[str] = 2, name: str | None = None, *, persistent: bool = False):
        names = [f"h{i}" for i in range(1, hosts + 1)] if isinstance(hosts, int) else list(hosts)
        if not 1 <= len(names) <= MAX_HOSTS:
            raise ValueError(f"a lab has 1 to {MAX_HOSTS} hosts, not {len(names)}")
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique: {names}")
        self._host_names = [_check_name("host", n) for n in names]
        self.name = _check_name("lab", name) if name else ""
        self.persistent = persistent
        self.id = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.forward_rule = False
        self.created = 0.0
        self._hosts: dict[str, Host] = {}
        self._popens: list[subprocess.Popen[Any]] = []
        self._handles: list[HostProcess] = []
        self._lock = threading.Lock()
        self._up = False

    # --- identity -----------------------------------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"{self.id}-br"

    @property
    def hosts(self) -> list[Host]:
        return list(self._hosts.values())

    def host(self, host: str | Host) -> Host:
        """The Host called ``host`` (a Host is returned as is)."""
        if isinstance(host, Host):
            return host
        try:
            return self._hosts[host]
        except KeyError:
            raise KeyError(f"lab {self.name!r} has no host {host!r}; hosts: {', '.join(self._hosts)}") from None

    def group(self, n: int = 1) -> str:
        """Multicast group number ``n`` (1-255) of this lab, in 239.192.0.0/16 (organisation-local scope).

        The third octet is the lab's subnet octet, so labs up at the same time never share a group.
        """
        if not 1 <= n <= 255 or self.subnet is None:
            raise ValueError(f"group number must be 1-255 on a lab that is up (got {n})")
        return f"239.192.{self.subnet.network_address.packed[2]}.{n}"

    def __repr__(self) -> str:
        hosts = ", ".join(f"{h.name}={h.ip}" for h in self._hosts.values())
        return f"<Lab {self.name or '?'} id={self.id or '-'} subnet={self.subnet} [{hosts}]>"

    # --- records --------------------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        owner = None
        if not self.persistent:
            owner = {"pid": os.getpid(), "start": state.process_start_time(os.getpid())}
        return {
            "name": self.name,
            "id": self.id,
            "subnet": str(self.subnet),
            "bridge": self.bridge,
            "forward_rule": self.forward_rule,
            "owner": owner,
            "created": self.created,
            "hosts": [asdict(h) for h in self._hosts.values()],
        }

    @classmethod
    def load(cls, name: str) -> Lab:
        """The lab called ``name`` (or with that id), as recorded in /run/netlab by whoever created it."""
        records = state.load_all()
        for record in records:
            if name in (record["name"], record["id"]):
                lab = cls([h["name"] for h in record["hosts"]], record["name"], persistent=record["owner"] is None)
                lab.id = record["id"]
                lab.subnet = ipaddress.IPv4Network(record["subnet"])
                lab.forward_rule = record["forward_rule"]
                lab.created = record["created"]
                lab._hosts = {h["name"]: Host(**h) for h in record["hosts"]}
                lab._up = True
                return lab
        known = ", ".join(r["name"] for r in records) or "none"
        raise LabError(f"no lab named {name!r} (labs: {known}); see netlab status")

    # --- life cycle -----------------------------------------------------------------------------------

    def __enter__(self) -> Lab:
        return self.up()

    def __exit__(self, *exc_info: object) -> None:
        self.down()

    def up(self) -> Lab:
        """Create bridge, namespaces, veths, addresses and routes. On any failure, undo and raise."""
        if self._up:
            return self
        if os.geteuid() != 0:
            raise LabError(ROOT_MESSAGE)
        try:
            self._claim()
            self._build()
        except BaseException:
            if self.id:
                self._teardown()
            raise
        self._up = True
        return self

    def _claim(self) -> None:
        """Under the machine-wide lock: choose a free id and /24, create the bridge, record the lab."""
        with state.locked():
            records = state.load_all()
            if self.name and any(self.name in (r["name"], r["id"]) for r in records):
                raise LabError(f"a lab named {self.name!r} already exists: netlab down {self.name}")
            with IPRoute() as ipr:

                def create_bridge(lab_id: str, _subnet: ipaddress.IPv4Network) -> bool:
                    try:
                        ipr.link("add", ifname=f"{lab_id}-br", kind="bridge", br_mcast_snooping=0)
                    except NetlinkError as exc:
                        if exc.code == _EEXIST:
                            return False
                        raise
                    return True

                lab_id, subnet = claim_id(PREFIX, LAB_NET, lab_ids_present(), _used_networks(ipr), create_bridge)
                self.id, self.subnet, self.created = lab_id, subnet, time.time()
                self.name = self.name or lab_id
                index = ipr.link_lookup(ifname=self.bridge)[0]
                ipr.link("set", index=index, ifalias=f"netlab lab={self.name} subnet={subnet}")
            addresses = list(subnet.hosts())
            for i, name in enumerate(self._host_names):
                self._hosts[name] = Host(
                    name=name,
                    netns=f"{self.id}-{name}",
                    ifname=HOST_IFNAME,
                    ip=str(addresses[i]),
                    veth=f"{self.id}-v{i + 1}",
                )
            state.save(self.id, self.to_record())

    def _build(self) -> None:
        # Snooping is off (set at creation): without an IGMP querier on the LAN, a snooping bridge can
        # stop forwarding a group once memberships expire. Flooding is what a test LAN wants.
        with IPRoute() as ipr:
            bridge = ipr.link_lookup(ifname=self.bridge)[0]
            _disable_ipv6(self.bridge)
            ipr.link("set", index=bridge, state="up")
            for host in self._hosts.values():
                ns.create_netns(host.netns)
                self._attach(ipr, bridge, host, multicast_route=True)
        self.forward_rule = firewall.allow_bridge(self.bridge)
        state.save(self.id, self.to_record())

    def _attach(self, ipr: IPRoute, bridge: int, host: Host, *, multicast_route: bool) -> None:
        """Plug ``host``'s namespace (it exists) into the bridge: the veth pair, the address, the links up."""
        assert self.subnet is not None  # allocated before any host is attached
        ipr.link("add", ifname=host.veth, kind="veth", peer={"ifname": host.ifname, "net_ns_fd": host.netns})
        veth = ipr.link_lookup(ifname=host.veth)[0]
        _disable_ipv6(host.veth)
        ipr.link("set", index=veth, master=bridge, state="up")
        with IPRoute(netns=host.netns, flags=0) as inside:
            inside.link("set", index=inside.link_lookup(ifname="lo")[0], state="up")
            lan = inside.link_lookup(ifname=host.ifname)[0]
            inside.addr("add", index=lan, address=host.ip, prefixlen=self.subnet.prefixlen)
            inside.link("set", index=lan, state="up")
            if multicast_route:
                # Without it, multicast sends fail (ENETUNREACH): a host has no default route.
                inside.route("add", dst="224.0.0.0/4", oif=lan)

    def plug(self, name: str, netns: str, ifname: str) -> Host:
        """Give namespace ``netns``, which this lab did not make (another lab's router, say), a leg on this LAN:
        interface ``ifname`` at the LAN's highest free address, known here as host ``name``.

        The leg's veth is named after this lab, so ``down`` removes it; the namespace stays with its owner. The
        leg gets no multicast route (the namespace has its own LAN for that).
        """
        self._check_up()
        assert self.subnet is not None  # the lab is up
        if name in self._hosts:
            raise ValueError(f"lab {self.name!r} has a host {name!r} already")
        used = {h.ip for h in self._hosts.values()}
        address = next(str(a) for a in reversed(list(self.subnet.hosts())) if str(a) not in used)
        host = Host(_check_name("host", name), netns, ifname, address, f"{self.id}-v{len(self._hosts) + 1}")
        with IPRoute() as ipr:
            self._attach(ipr, ipr.link_lookup(ifname=self.bridge)[0], host, multicast_route=False)
        with self._lock:
            self._hosts[name] = host
        state.save(self.id, self.to_record())
        return host

    def down(self) -> None:
        """Kill the lab's processes, delete namespaces, veths, bridge, iptables rule and record. Idempotent."""
        if self._up:
            self._teardown()
            self._up = False

    def _teardown(self) -> None:
        with self._lock:
            popens, handles = self._popens[:], self._handles[:]
        errors: list[str] = []
        for handle in handles:
            _attempt(errors, f"stop pid {handle.pid}", handle.terminate)
        for proc in popens:
            if proc.poll() is None:
                _attempt(errors, f"kill pid {proc.pid}", ns.kill_pids, [proc.pid])
            _attempt(errors, f"reap pid {proc.pid}", proc.wait, 5.0)
        errors.extend(_remove_objects(self.id))
        if errors:
            raise LabError(f"lab {self.name} was not fully removed: {'; '.join(errors)}. Retry: netlab down --all")

    # --- running things inside hosts ----------------------------------------------------------------

    def _check_up(self) -> None:
        if not self._up:
            raise LabError(f"lab {self.name or '(new)'} is not up: use it inside `with Lab(...)` or call up()")

    def popen(self, host: str | Host, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **popen_kwargs)`` with the child in ``host``'s namespace; killed on down()."""
        self._check_up()
        h = self.host(host)
        proc = ns.call_in_netns(h.netns, functools.partial(subprocess.Popen, list(argv), **popen_kwargs))
        with self._lock:
            self._popens.append(proc)
        return proc

    def start(self, host: str | Host, fn: Callable[..., Any], *args: Any) -> HostProcess:
        """Run ``fn(*args)`` in a new Python process inside ``host``; stopped on down() if still running.

        ``fn`` must be a module-level callable (use functools.partial for keyword arguments); arguments and
        result must be picklable. Queues/events passed as arguments come from ``netlab.procs.MP``.
        """
        self._check_up()
        h = self.host(host)
        handle = HostProcess(h.name, h.netns_path, fn, args)
        with self._lock:
            self._handles.append(handle)
        return handle

    def run(self, host: str | Host, fn: Callable[..., Any], *args: Any, timeout: float | None = 60.0) -> Any:
        """:meth:`start` and wait for the result; exceptions in ``fn`` are re-raised here.

        On timeout the process is killed and TimeoutError raised.
        """
        handle = self.start(host, fn, *args)
        if not handle.join(timeout):
            handle.terminate()
            raise TimeoutError(f"{handle.fn_name} in host {handle.host!r} did not finish within {timeout} s")
        return handle.result(0)


def _attempt(errors: list[str], what: str, fn: Callable[..., Any], *args: Any) -> None:
    """Run one teardown step; record its failure and go on, so one broken object does not strand the rest."""
    try:
        fn(*args)
    except Exception as exc:
        errors.append(f"{what}: {exc}")


def _remove_objects(lab_id: str) -> list[str]:
    """Remove everything named after ``lab_id``; return what could not be removed."""
    errors: list[str] = []
    netns_names = [n for n in ns.list_netns() if n.startswith(f"{lab_id}-")]
    for name in netns_names:
        stuck = ns.kill_pids(ns.pids_in_netns(name))
        if stuck:
            errors.append(f"processes {stuck} in namespace {name} survived SIGKILL")
    _attempt(errors, "iptables rule", firewall.remove_bridge_rule, f"{lab_id}-br")
    with IPRoute() as ipr:
        links = [(m["index"], m.get_attr("IFLA_IFNAME")) for m in ipr.link("dump")]
        # veths first: a bridge with ports would also go, but this order leaves no port dangling on error
        for index, ifname in sorted(links, key=lambda link: link[1].endswith("-br")):
            if ifname.startswith(f"{lab_id}-"):
                _attempt(errors, f"delete link {ifname}", _delete_link, ipr, index)
    for name in netns_names:
        _attempt(errors, f"delete namespace {name}", ns.remove_netns, name)
    state.remove(lab_id)
    return errors


def _delete_link(ipr: IPRoute, index: int) -> None:
    try:
        ipr.link("del", index=index)
    except NetlinkError as exc:
        if exc.code != _ENODEV:  # already gone: deleting one veth end removes its peer too
            raise


def lab_ids_present() -> set[str]:
    """Ids of labs that have any object on this machine: namespace, root link, iptables rule or record."""
    names = set(ns.list_netns())
    with IPRoute() as ipr:
        names |= {m.get_attr("IFLA_IFNAME") for m in ipr.link("dump")}
    names |= set(firewall.bridges_with_rules())
    ids = {m.group(1) for n in names if (m := _OBJECT_RE.match(n))}
    return ids | {r["id"] for r in state.load_all()}


def down_all(prefix: str = PREFIX, *, force: bool = False) -> list[str]:
    """Remove every lab whose id starts with ``prefix``; return their ids.

    Meant for leftovers of crashed runs: labs whose recorded owner process is still running are kept
    unless ``force``. Persistent labs (``netlab up``) have no owner and are removed.
    """
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix {prefix!r} is not a netlab prefix (zl, or a lab id such as zl3a9)")
    prefix = prefix.rstrip("-")
    with state.locked():
        live = set()
        if not force:
            live = {r["id"] for r in state.load_all() if state.owner_alive(r.get("owner"))}
        doomed = sorted(i for i in lab_ids_present() if i.startswith(prefix) and i not in live)
        errors = [e for lab_id in doomed for e in _remove_objects(lab_id)]
    if errors:
        raise LabError(f"some lab objects could not be removed: {'; '.join(errors)}")
    return doomed
