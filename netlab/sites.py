"""Two sites: two LANs joined by a router, whose link to site B is a WAN with delay, loss and a rate cap.

```
 site A  zlAAA-br ── a hosts (.1, .2, ...) ── router leg "site-a" (.254) ─┐ router namespace zlBBB-router:
                                                                           │ IP forwarding on, no multicast routing
 site B  zlBBB-br ── b hosts (.2, .3, ...) ── router leg "lab0"  (.1) ────┘ <- the WAN: impairments here
```

Each site is a :class:`~netlab.lab.Lab` of its own: its bridge, its /24, its multicast groups (``lab.group(n)``),
its record. The router is the first host of site B, plugged into site A with :meth:`Lab.plug`; every object is
named after one of the two lab ids, so ``down`` (and ``netlab down --all`` after a crash) removes everything.

**The WAN** is the router's link on site B. Every packet that crosses sites passes it once, and nothing else
does: a-to-b is what the router sends into site B (direction ``out`` of that link in :mod:`netlab.impair`), b-to-a
what site B's bridge hands to the router (``in``). Both directions delayed by D give a round trip of 2 D. It is a
site B host's link like any other, so all of :mod:`netlab.impair` works on it, and ``netlab impair NAME-b/router``
too. Its rate cap is a TBF per direction (a full-duplex link): this kernel has no ``sch_netem``, and TBF is what
a WAN access shaper is, a bucket and a bounded queue that drops when full (netem's ``rate`` never drops).

**Multicast stays on its LAN.** Linux forwards multicast only along a multicast routing table that a daemon (pimd,
smcroute) programs, and none runs in the router; a FORWARD rule there drops 224.0.0.0/4 should one ever start. So
a datagram sent with any TTL (ZEPS sends with 16) reaches its own LAN only. Site B's bridge also does not flood
multicast to the router's port (``mcast_flood`` off): site B's feeds never meet the WAN's shaping (the rate cap's
budget, the delay process).

**ARP.** The WAN's loss would drop ARP too, and a lost ARP frame stalls a connection for a second. The router and
site B's hosts know each other's MAC addresses from permanent neighbour entries instead.

**Wire-sized packets.** A veth passes a TCP sender's segmentation-offload packets (up to 64 KB) whole, through the
bridge and the router: the WAN's loss stage would drop 45 segments at once, and 1% loss would be 1% of those. So
the hosts' TCP segmentation offload is off (``tso=False``, the default): their kernel cuts each send into wire
segments (software GSO, still cheap) before the veth, and the WAN loses, delays and counts what a real link
carries. Measured here: a TCP stream across the router fell from about 6 Gbit/s to about 1 Gbit/s, a LAN's speed.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pyroute2 import IPRoute
from pyroute2.ethtool import Ethtool

from netlab import impair, ns, state
from netlab.impair import Impairment, LinkCounters
from netlab.impair.iptables import iptables
from netlab.lab import Host, Lab, LabError
from netlab.procs import HostProcess

ROUTER = "router"
ROUTER_A_IFNAME = "site-a"  # the router's leg on site A; its leg on site B is lab0, as every site B host's
SITES = ("a", "b")
WanDirection = Literal["a-to-b", "b-to-a", "both"]
WanCut = Literal["ebpf", "drop"]
_FORWARD_DROP = ("FORWARD", "-m", "comment", "--comment", "netlab-wan-cut", "-j", "DROP")  # cut_wan("drop")
_WAN_DIRECTIONS: dict[str, str] = {"a-to-b": "out", "b-to-a": "in", "both": "both"}
_NUD_PERMANENT = 0x80  # include/uapi/linux/neighbour.h


def lab_names(name: str) -> tuple[str, str]:
    """The names of the two labs of the sites called ``name``."""
    return f"{name}-a", f"{name}-b"


class Sites:
    """Site A's and site B's LANs and the router between them. Use as a context manager, or up() / down().

    ``a`` and ``b`` name each site's hosts (unique across both); ``wan`` is the impairment of both directions
    once up (None: a perfect link). ``name`` names the labs ``NAME-a`` and ``NAME-b`` (default: their ids).
    ``tso`` keeps the hosts' TCP segmentation offload: faster TCP on each LAN, but the WAN then drops whole
    offload packets of up to 64 KB (see the module's doc).
    """

    def __init__(
        self,
        a: Sequence[str] = ("a1", "a2"),
        b: Sequence[str] = ("b1", "b2"),
        name: str | None = None,
        *,
        wan: Impairment | None = None,
        persistent: bool = False,
        tso: bool = False,
    ) -> None:
        clash = (set(a) & set(b)) | ({ROUTER} & (set(a) | set(b)))
        if clash:
            raise ValueError(f"host names must be unique across both sites and not {ROUTER!r}: {sorted(clash)}")
        names = lab_names(name) if name else (None, None)
        self.a = Lab(list(a), names[0], persistent=persistent)
        self.b = Lab([ROUTER, *b], names[1], persistent=persistent)
        self.name = name or ""
        self._wan = wan
        self._tso = tso
        self._up = False
        self._dropped = False  # cut_wan("drop")'s rule is in the router's FORWARD chain

    def __repr__(self) -> str:
        return f"<Sites {self.name or '?'} a={self.a!r} b={self.b!r}>"

    # --- where things are -------------------------------------------------------------------------------

    def lab(self, site: str) -> Lab:
        """Site ``site``'s LAN ("a" or "b")."""
        if site not in SITES:
            raise ValueError(f"site must be 'a' or 'b', not {site!r}")
        return self.a if site == "a" else self.b

    def site_of(self, host: str | Host) -> str:
        """The site a host lives on; the router's is "b" (its namespace and WAN link belong to site B)."""
        name = host.name if isinstance(host, Host) else host
        for site in SITES:
            lab = self.lab(site)
            if name in {h.name for h in lab.hosts} and lab.host(name).netns.startswith(f"{lab.id}-"):
                return site
        raise KeyError(f"no host {name!r} on either site; hosts: {', '.join(h.name for h in self.hosts)}")

    def lab_of(self, host: str | Host) -> Lab:
        return self.lab(self.site_of(host))

    def host(self, host: str | Host) -> Host:
        """A host by name, on its own site (the router: its WAN leg on site B)."""
        return self.lab_of(host).host(host)

    @property
    def hosts(self) -> list[Host]:
        """Every host, site A's first; the router once, by its WAN leg."""
        return [h for h in self.a.hosts if h.name != ROUTER] + self.b.hosts

    @property
    def router(self) -> Host:
        """The router's leg on site B: the WAN link."""
        return self.b.host(ROUTER)

    @property
    def router_a(self) -> Host:
        """The router's leg on site A (the gateway of site A's hosts towards site B)."""
        return self.a.host(ROUTER)

    # --- life cycle -------------------------------------------------------------------------------------

    def __enter__(self) -> Sites:
        return self.up()

    def __exit__(self, *exc_info: object) -> None:
        self.down()

    def up(self) -> Sites:
        """Both LANs, the router and its routes, then the WAN impairment. On any failure, undo and raise."""
        if self._up:
            return self
        try:
            self.a.up()
            self.b.up()
            self.a.plug(ROUTER, self.router.netns, ROUTER_A_IFNAME)
            self._route()
            self._up = True
            if self._wan is not None:
                self.set_wan(self._wan)
        except BaseException:
            self._up = True
            self.down()
            raise
        return self

    def down(self) -> None:
        """Both labs down (processes, namespaces, bridges, qdiscs, rules, records), even if one of them fails."""
        if not self._up:
            return
        self._up = False
        self._dropped = False  # the rule goes with the router's namespace
        errors = []
        for lab in (self.b, self.a):  # the router's namespace first: its processes go before site A's links
            try:
                lab.down()
            except Exception as exc:  # the other lab goes down all the same
                errors.append(f"{lab.name}: {exc}")
        if errors:
            raise LabError("; ".join(errors))

    def _route(self) -> None:
        assert self.a.subnet is not None and self.b.subnet is not None  # both labs are up
        router, router_a = self.router, self.router_a
        ns.call_in_netns(router.netns, Path("/proc/sys/net/ipv4/ip_forward").write_text, "1")
        iptables(router.netns, "-A", "FORWARD", "-d", "224.0.0.0/4", "-j", "DROP", table="filter")
        for host in self.a.hosts:
            if host.name != ROUTER:
                _add_route(host, self.b.subnet, router_a.ip)
        if not self._tso:
            for host in self.hosts:
                if host.name != ROUTER:
                    ns.call_in_netns(host.netns, _no_tcp_offload, host.ifname)
        router_mac = _mac(router)
        for host in self.b.hosts:
            if host.name != ROUTER:
                _add_route(host, self.a.subnet, router.ip)
                _add_neighbour(host, router.ip, router_mac)
                _add_neighbour(router, host.ip, _mac(host))
        _no_multicast_flood(router.veth)

    # --- the WAN ----------------------------------------------------------------------------------------

    def _check_up(self) -> None:
        if not self._up:
            raise LabError("the sites are not up: use them inside `with Sites(...)` or call up()")

    def set_wan(self, imp: Impairment, direction: WanDirection = "both") -> None:
        """Make the WAN behave as ``imp`` in ``direction`` ("a-to-b", "b-to-a" or "both"), now, under traffic
        (what was set there before is replaced; a cut stays)."""
        self._check_up()
        impair.impair(self.b, ROUTER, imp, _wan_direction(direction))

    def wan(self, direction: WanDirection = "a-to-b") -> Impairment | None:
        """The WAN's impairment in one direction, read back from the kernel (None: a perfect link)."""
        if direction == "both":
            raise ValueError("read one direction: 'a-to-b' or 'b-to-a'")
        self._check_up()
        return impair.current(self.b, ROUTER, _wan_direction(direction))

    def wan_counters(self, direction: WanDirection = "a-to-b") -> LinkCounters:
        """Packets the WAN's loss stage saw and dropped in one direction."""
        if direction == "both":
            raise ValueError("read one direction: 'a-to-b' or 'b-to-a'")
        self._check_up()
        return impair.counters(self.b, ROUTER, _wan_direction(direction))

    def clear_wan(self) -> None:
        """A perfect WAN again, both directions (a cut included)."""
        self._check_up()
        impair.clear(self.b, ROUTER)

    def cut_wan(self, how: WanCut = "ebpf") -> None:
        """Cut the sites apart: every packet across the WAN is dropped, silently (each LAN works on). ``how``:
        "ebpf", on the WAN link's wire (netlab's partition); "drop", an iptables DROP of everything the router
        forwards (its FORWARD chain), as a site's firewall or router cuts it. Either way no RST and no ICMP come
        back: a connect across hangs until its own timeout."""
        self._check_up()
        if how == "drop":
            if not self._dropped:
                iptables(self.router.netns, "-I", *_FORWARD_DROP, table="filter")
                self._dropped = True
        elif how == "ebpf":
            impair.partition(self.b, ROUTER)
        else:
            raise ValueError(f"a WAN cut is 'ebpf' or 'drop', not {how!r}")

    def heal_wan(self) -> None:
        """Undo :meth:`cut_wan`, either way; the WAN's other impairments stay."""
        self._check_up()
        impair.heal(self.b, ROUTER)
        if self._dropped:
            iptables(self.router.netns, "-D", *_FORWARD_DROP, table="filter")
            self._dropped = False

    # --- running things on the hosts --------------------------------------------------------------------

    def popen(self, host: str | Host, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """:meth:`Lab.popen` on the host's site."""
        return self.lab_of(host).popen(host, argv, **popen_kwargs)

    def start(self, host: str | Host, fn: Callable[..., Any], *args: Any) -> HostProcess:
        """:meth:`Lab.start` on the host's site."""
        return self.lab_of(host).start(host, fn, *args)

    def run(self, host: str | Host, fn: Callable[..., Any], *args: Any, timeout: float | None = 60.0) -> Any:
        """:meth:`Lab.run` on the host's site."""
        return self.lab_of(host).run(host, fn, *args, timeout=timeout)


def _wan_direction(direction: str) -> str:
    try:
        return _WAN_DIRECTIONS[direction]
    except KeyError:
        raise ValueError(f"WAN direction must be 'a-to-b', 'b-to-a' or 'both', not {direction!r}") from None


def _inside(host: Host) -> IPRoute:
    return IPRoute(netns=host.netns, flags=0)


def _index(ipr: IPRoute, host: Host) -> int:
    return int(ipr.link_lookup(ifname=host.ifname)[0])


def _add_route(host: Host, dst: ipaddress.IPv4Network, gateway: str) -> None:
    with _inside(host) as ipr:
        ipr.route("add", dst=str(dst), gateway=gateway, oif=_index(ipr, host))


def _mac(host: Host) -> str:
    with _inside(host) as ipr:
        return str(ipr.link("get", index=_index(ipr, host))[0].get_attr("IFLA_ADDRESS"))


def _add_neighbour(host: Host, ip: str, mac: str) -> None:
    with _inside(host) as ipr:
        ipr.neigh("replace", dst=ip, lladdr=mac, ifindex=_index(ipr, host), state=_NUD_PERMANENT)


def _no_tcp_offload(ifname: str) -> None:
    """In a host's namespace: TCP segmentation offload off on ``ifname`` (software GSO cuts segments instead)."""
    ethtool = Ethtool()
    try:
        features = ethtool.get_features(ifname)
        for name, feature in features.features.items():
            if name.startswith("tx-tcp") and name.endswith("segmentation"):
                feature.enable = False
        ethtool.set_features(ifname, features)
    finally:
        ethtool.close()


def _no_multicast_flood(port: str) -> None:
    """The bridge floods no multicast into ``port`` (IFLA_BRPORT_MCAST_FLOOD 0); broadcast and unicast pass."""
    with IPRoute() as ipr:
        ipr.brport("set", index=ipr.link_lookup(ifname=port)[0], mcast_flood=0)


def present(name: str) -> list[str]:
    """The labs of the sites called ``name`` that have a record (for ``netlab sites down``)."""
    recorded = {r["name"] for r in state.load_all()}
    return [lab for lab in lab_names(name) if lab in recorded]
