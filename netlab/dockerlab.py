"""Docker backend of netlab: the same kind of LAN as :class:`~netlab.lab.Lab`, with containers as its hosts.

A container has a network namespace like a namespace-lab host. DockerLab attaches each container's namespace
under /run/netns (as ``ip netns attach`` does) and records the lab like Lab does, so everything that works on
namespaces works on containers unchanged: impairments (netlab.impair), captures and probes (netlab.packets),
``run``/``start`` of Python callables, ``netlab status``. What differs: the Docker engine makes the hosts, and
:meth:`DockerLab.popen` runs a command *inside* a container (its filesystem, the project as installed in the
image), not just in its network namespace.

Every object carries the lab id (``zd`` + 3 hex digits) as its name or name prefix, and Docker objects carry
the label ``netlab.id``: network ``zd3a9`` (bridge ``zd3a9-br``), containers ``zd3a9-<host>``, namespaces
``/run/netns/zd3a9-<host>``, the record /run/netlab/zd3a9.json and the iptables rule naming the bridge.
Cleanup removes only objects that match both, so other containers and networks on the engine are left alone.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests
from pyroute2 import IPRoute
from pyroute2 import netns as pyroute2_netns

from netlab import dockerimage, firewall, ns, state
from netlab import lab as lab_mod
from netlab.lab import EXTRA_MESSAGE, ROOT_MESSAGE, ExtraMissing, Host, Lab, LabError

try:
    import docker
    import docker.errors
except ModuleNotFoundError:  # no lab extra: namespace labs work, and Docker ones say how to get it (client())
    docker = None  # type: ignore[assignment]

PREFIX = "zd"
BACKEND = "docker"
DOCKER_NET = ipaddress.IPv4Network("10.251.0.0/16")  # netns labs use 10.250.0.0/16; Docker's pools are elsewhere
HOST_IFNAME = "eth0"
IMAGE_PYTHON = "python3"
LABEL_ID, LABEL_LAB, LABEL_HOST = "netlab.id", "netlab.lab", "netlab.host"
ENGINE_MESSAGE = "the Docker engine does not answer ({}): start it with scripts/setup.sh (it runs dockerd)"

_ENTER = Path(__file__).with_name("dockerenter.py")
_ID_RE = re.compile(r"^zd[0-9a-f]{3}$")
_OBJECT_RE = re.compile(r"^(zd[0-9a-f]{3})-")
_PREFIX_RE = re.compile(r"^zd[0-9a-f]{0,3}-?$")
_CONFLICT = 409


def client() -> docker.DockerClient:
    """A client of the local Docker engine; LabError saying how to start it when it does not answer, or how
    to install the Docker SDK when it is missing."""
    if docker is None:
        raise ExtraMissing(EXTRA_MESSAGE.format(what="the Docker backend", module="the docker SDK"))
    try:
        engine = docker.from_env(timeout=120)
        engine.ping()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise LabError(ENGINE_MESSAGE.format(exc)) from exc
    return engine


def running_client() -> docker.DockerClient | None:
    """:func:`client`, or None when no engine answers (status and cleanup carry on without it)."""
    try:
        return client()
    except LabError:
        return None


def _labels(lab_id: str, lab_name: str, host: str | None = None) -> dict[str, str]:
    labels = {LABEL_ID: lab_id, LABEL_LAB: lab_name}
    return labels | {LABEL_HOST: host} if host else labels


def _engine_subnets(engine: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    """IPv4 subnets of every Docker network, ours and others'."""
    subnets = []
    for net in engine.networks.list():
        for pool in (net.attrs.get("IPAM") or {}).get("Config") or []:
            if ":" not in pool.get("Subnet", ":"):
                subnets.append(ipaddress.IPv4Network(pool["Subnet"], strict=False))
    return subnets


class DockerLab(Lab):
    """Throw-away LAN of containers on a Docker bridge network. Use as a context manager, or up() / down().

    Same arguments and API as :class:`Lab`; ``image`` defaults to one built from this project
    (:func:`netlab.dockerimage.ensure_image`, about a minute the first time, cached after).
    """

    def __init__(
        self, hosts: int | Sequence[str] = 2, name: str | None = None, *, persistent: bool = False, image: str = ""
    ):
        super().__init__(hosts, name, persistent=persistent)
        self.image = image
        self._engine: docker.DockerClient | None = None

    @property
    def engine(self) -> docker.DockerClient:
        if self._engine is None:
            self._engine = client()
        return self._engine

    def to_record(self) -> dict[str, Any]:
        return {**super().to_record(), "backend": BACKEND, "image": self.image}

    @classmethod
    def load(cls, name: str) -> DockerLab:
        lab = super().load(name)
        record = json.loads(state.path_for(lab.id).read_text())
        if record.get("backend") != BACKEND:
            raise LabError(f"lab {name!r} is a namespace lab, not a Docker one")
        assert isinstance(lab, DockerLab)
        lab.image = record["image"]
        return lab

    # --- life cycle -----------------------------------------------------------------------------------

    def up(self) -> DockerLab:
        """Build the image if needed (outside the machine-wide lock), then network and containers."""
        if not self._up and not self.image:
            if os.geteuid() != 0:
                raise LabError(ROOT_MESSAGE)
            self.image = dockerimage.ensure_image(self.engine)
        super().up()
        return self

    def _claim(self) -> None:
        """Under the machine-wide lock: choose a free id and /24, create the network, record the lab."""
        with state.locked():
            if self.name and any(self.name in (r["name"], r["id"]) for r in state.load_all()):
                raise LabError(f"a lab named {self.name!r} already exists: netlab down {self.name}")
            with IPRoute() as ipr:
                used = lab_mod._used_networks(ipr) + _engine_subnets(self.engine)

            def create_network(lab_id: str, subnet: ipaddress.IPv4Network) -> bool:
                try:
                    self._create_network(lab_id, self.name or lab_id, subnet)
                except docker.errors.APIError as exc:
                    if exc.status_code == _CONFLICT:
                        return False
                    raise
                return True

            lab_id, subnet = lab_mod.claim_id(PREFIX, DOCKER_NET, lab_ids_present(self.engine), used, create_network)
            self.id, self.subnet, self.created = lab_id, subnet, time.time()
            self.name = self.name or lab_id
            addresses = list(subnet.hosts())
            for i, name in enumerate(self._host_names):
                ip = str(addresses[i])
                self._hosts[name] = Host(name=name, netns=f"{lab_id}-{name}", ifname=HOST_IFNAME, ip=ip, veth="")
            state.save(self.id, self.to_record())

    def _create_network(self, lab_id: str, name: str, subnet: ipaddress.IPv4Network) -> None:
        """Internal (no route off the LAN) and with no address on the bridge: the root namespace stays off it.

        Docker insists on a gateway address; .254 is never configured anywhere (inhibit_ipv4).
        """
        pool = docker.types.IPAMPool(subnet=str(subnet), gateway=str(subnet.network_address + 254))
        self.engine.networks.create(
            lab_id,
            driver="bridge",
            internal=True,
            check_duplicate=True,
            ipam=docker.types.IPAMConfig(pool_configs=[pool]),
            labels=_labels(lab_id, name),
            options={
                "com.docker.network.bridge.name": f"{lab_id}-br",
                "com.docker.network.bridge.inhibit_ipv4": "true",
            },
        )

    def _build(self) -> None:
        # Snooping off, as in a namespace lab: with no IGMP querier a snooping bridge can stop forwarding a group.
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=self.bridge)[0], kind="bridge", br_mcast_snooping=0)
        lab_mod._disable_ipv6(self.bridge)
        for host in self._hosts.values():
            self._start_container(host)
        for name, host in self._hosts.items():
            pyroute2_netns.attach(host.netns, self._pid(host))
            self._hosts[name] = dataclasses.replace(host, veth=_root_side_veth(host))
            lab_mod._disable_ipv6(self._hosts[name].veth)
        # Docker's isolation rules drop what is not addressed to the subnet, multicast included: accept it first.
        self.forward_rule = firewall.allow_bridge(self.bridge)
        state.save(self.id, self.to_record())

    def _start_container(self, host: Host) -> None:
        api = self.engine.api
        api.create_container(
            self.image,
            ["sleep", "infinity"],
            name=host.netns,
            hostname=host.name,
            labels=_labels(self.id, self.name, host.name),
            host_config=api.create_host_config(
                init=True,  # reaps orphans of the commands started in it
                network_mode=self.id,
                sysctls={"net.ipv6.conf.all.disable_ipv6": "1"},
            ),
            networking_config=api.create_networking_config(
                {self.id: api.create_endpoint_config(ipv4_address=host.ip)}  # type: ignore[arg-type]  # stub wrong: SDK takes name->config
            ),
        )
        api.start(host.netns)

    def _pid(self, host: Host) -> int:
        """Host pid of the container's init, whose namespaces commands join."""
        status = self.engine.api.inspect_container(host.netns)["State"]
        if not status["Running"]:
            raise LabError(f"container {host.netns} is {status['Status']}, not running: netlab down {self.name}")
        return int(status["Pid"])

    def _teardown(self) -> None:
        """Remove containers and network (everything in them gets SIGKILL), then what Lab's teardown removes."""
        errors: list[str] = []
        try:
            errors += _remove_engine_objects(self.engine, self.id)
        except LabError as exc:  # no engine: remove the rest all the same
            errors.append(str(exc))
        try:
            super()._teardown()
        except LabError as exc:
            errors.append(str(exc))
        if errors:
            raise LabError(f"Docker lab {self.name} was not fully removed: {'; '.join(errors)}")

    # --- running things inside hosts ----------------------------------------------------------------

    def popen(self, host: str | Host, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` of ``argv`` run inside ``host``'s container; killed on down().

        ``sys.executable`` as the program means the image's python3, which has this project installed, so code
        written for namespace labs (``[sys.executable, "-m", "gateway.cli", ...]``) runs unchanged. Paths are
        the container's; ``env`` adds to the container's environment; ``cwd`` is a directory in the container.
        The returned process relays signals to the command and exits as it does (netlab/dockerenter.py).
        """
        self._check_up()
        h = self.host(host)
        command = list(argv)
        if command[:1] == [sys.executable]:
            command[0] = IMAGE_PYTHON
        options = [f"--env={k}={v}" for k, v in (popen_kwargs.pop("env", None) or {}).items()]
        if (cwd := popen_kwargs.pop("cwd", None)) is not None:
            options.append(f"--cwd={os.fspath(cwd)}")
        launcher = [sys.executable, "-I", "-S", str(_ENTER), str(self._pid(h)), *options, "--", *command]
        proc = subprocess.Popen(launcher, **popen_kwargs)
        with self._lock:
            self._popens.append(proc)
        return proc


def _root_side_veth(host: Host) -> str:
    """Name of the root-namespace end of the veth whose other end is the container's eth0."""
    with IPRoute(netns=host.netns, flags=0) as inside:
        peer = inside.get_links(inside.link_lookup(ifname=host.ifname)[0])[0].get_attr("IFLA_LINK")
    with IPRoute() as ipr:
        return str(ipr.get_links(peer)[0].get_attr("IFLA_IFNAME"))


def _remove_engine_objects(engine: docker.DockerClient | None, lab_id: str) -> list[str]:
    """Remove the containers, then the network, of ``lab_id`` (label and name must both match)."""
    if engine is None:
        return []
    errors: list[str] = []
    label: dict[str, str | list[str] | bool] = {"label": f"{LABEL_ID}={lab_id}"}
    for container in engine.containers.list(all=True, filters=label):
        if (container.name or "").startswith(f"{lab_id}-"):
            lab_mod._attempt(
                errors, f"remove container {container.name}", functools.partial(container.remove, force=True)
            )
    for net in engine.networks.list(filters=label):
        if net.name == lab_id:
            lab_mod._attempt(errors, f"remove network {net.name}", net.remove)
    return errors


def lab_ids_present(engine: docker.DockerClient | None) -> set[str]:
    """Ids of Docker labs with any object here: container, network (when ``engine``), namespace, rule, record."""
    names = set(ns.list_netns()) | set(firewall.bridges_with_rules())
    ids = {m.group(1) for n in names if (m := _OBJECT_RE.match(n))}
    if engine is not None:
        label: dict[str, str | list[str] | bool] = {"label": LABEL_ID}
        for container in engine.containers.list(all=True, filters=label):
            lab_id = container.labels.get(LABEL_ID, "")
            if _ID_RE.match(lab_id) and (container.name or "").startswith(f"{lab_id}-"):
                ids.add(lab_id)
        for net in engine.networks.list(filters=label):
            if (
                net.name is not None
                and _ID_RE.match(net.name)
                and (net.attrs.get("Labels") or {}).get(LABEL_ID) == net.name
            ):
                ids.add(net.name)
    return ids | {r["id"] for r in state.load_all() if _ID_RE.match(r["id"])}


def down_all(prefix: str = PREFIX, *, force: bool = False) -> list[str]:
    """Remove every Docker lab whose id starts with ``prefix``; return their ids.

    As :func:`netlab.lab.down_all`: labs whose recorded owner process still runs are kept unless ``force``.
    Without a running engine, containers and networks cannot be listed: the rest is removed all the same.
    """
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix {prefix!r} is not a Docker netlab prefix (zd, or a lab id such as zd3a9)")
    prefix = prefix.rstrip("-")
    engine = running_client()
    with state.locked():
        live = set()
        if not force:
            live = {r["id"] for r in state.load_all() if state.owner_alive(r.get("owner"))}
        doomed = sorted(i for i in lab_ids_present(engine) if i.startswith(prefix) and i not in live)
        errors = [e for i in doomed for e in _remove_engine_objects(engine, i) + lab_mod._remove_objects(i)]
    if errors:
        raise LabError(f"some Docker lab objects could not be removed: {'; '.join(errors)}")
    return doomed
