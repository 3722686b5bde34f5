"""netlab: labs come up, connect their hosts, isolate them, run code inside them, and leave nothing behind."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path

import pytest
from conftest import NEEDS_ROOT
from pyroute2 import IPRoute
from support.leftovers import NOTHING, alive, objects_of
from support.tcpprobes import echo_client, echo_server

import netlab
from netlab import MP, HostError, Lab, LabError, RemoteTraceback, down_all, firewall, ns, state
from netlab.cli import resolve_host
from netlab.lab import pick_subnet

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
NETLAB_CLI = Path(sys.executable).parent / "netlab"


# --- functions run inside lab hosts (module level: they are pickled by reference) -------------------


def netns_link() -> str:
    return os.readlink("/proc/self/ns/net")


def interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def routes() -> list[tuple[str, str]]:
    """(destination, mask) of every IPv4 route, as /proc/net/route shows them (hex, little-endian)."""
    lines = Path("/proc/net/route").read_text().splitlines()[1:]
    return [(line.split()[1], line.split()[7]) for line in lines]


def connect_errno(ip: str, port: int) -> int:
    """0 if a TCP connection to ip:port succeeds within 1 s, else the errno (ETIMEDOUT on timeout)."""
    try:
        socket.create_connection((ip, port), timeout=1.0).close()
    except TimeoutError:
        return errno.ETIMEDOUT
    except OSError as exc:
        return exc.errno or -1
    return 0


def _icmp_checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def ping(dst: str, timeout: float = 2.0) -> bool:
    """One ICMP echo over a raw socket (there is no ping binary here); True if ``dst`` replied."""
    ident = os.getpid() & 0xFFFF
    payload = b"netlab-ping"
    header = struct.pack("!BBHHH", 8, 0, 0, ident, 1)
    packet = struct.pack("!BBHHH", 8, 0, _icmp_checksum(header + payload), ident, 1) + payload
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        try:
            sock.sendto(packet, (dst, 0))
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                data, (src, _) = sock.recvfrom(2048)
                kind, _, _, rid, _ = struct.unpack_from("!BBHHH", data, (data[0] & 0x0F) * 4)
                if kind == 0 and rid == ident and src == dst:
                    return True
        except OSError:  # timeout, or no route / host unreachable
            return False
    return False


def fail_with(message: str) -> None:
    raise ValueError(message)


def exit_hard(code: int) -> None:
    os._exit(code)


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


def pid_and_netns() -> tuple[int, str]:
    return os.getpid(), netns_link()


def big_result(ready: Queue[int], size: int) -> bytes:
    data = b"x" * size
    ready.put(os.getpid())
    return data  # far more than a pipe holds: the child blocks in sending it until the parent reads


def report_then_sleep(started: Queue[int], seconds: float) -> None:
    started.put(os.getpid())
    time.sleep(seconds)


# --- helpers -----------------------------------------------------------------------------------------


def tcp_echo(lab: Lab, server: str, client: str, payload: bytes) -> bytes:
    ready = MP.Queue()
    srv = lab.start(server, echo_server, lab.host(server).ip, ready)
    port = ready.get(timeout=30)
    echoed = lab.run(client, echo_client, lab.host(server).ip, port, payload, timeout=30)
    assert srv.result(timeout=30) == len(payload)
    return echoed


def netlab_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert NETLAB_CLI.exists(), f"{NETLAB_CLI} missing: install the project (pip install -e .)"
    proc = subprocess.run([str(NETLAB_CLI), *args], capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, f"netlab {' '.join(args)} -> {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc


# --- life cycle --------------------------------------------------------------------------------------


def test_up_creates_everything_and_down_leaves_nothing() -> None:
    with Lab(["pub", "sub", "gw"]) as lab:
        found = objects_of(lab.id)
        assert sorted(found["netns"]) == sorted(f"{lab.id}-{n}" for n in ("pub", "sub", "gw"))
        assert sorted(found["links"]) == sorted([lab.bridge, f"{lab.id}-v1", f"{lab.id}-v2", f"{lab.id}-v3"])
        assert all(len(name) <= 15 for name in found["links"])
        assert found["rules"] == ([lab.bridge] if firewall.bridge_nf_active() else [])
        assert json.loads(state.path_for(lab.id).read_text())["hosts"][2]["name"] == "gw"
        assert [h.name for h in lab.hosts] == ["pub", "sub", "gw"]
        assert ipaddress.IPv4Network(str(lab.subnet)).subnet_of(netlab.LAB_NET)
        assert all(ipaddress.IPv4Address(h.ip) in lab.subnet for h in lab.hosts)
    assert objects_of(lab.id) == NOTHING
    lab.down()  # idempotent


def test_default_hosts_and_names() -> None:
    with Lab(3) as lab:
        assert [h.name for h in lab.hosts] == ["h1", "h2", "h3"]
        assert lab.name == lab.id
        assert lab.host("h2").netns == f"{lab.id}-h2"
        assert lab.host("h2").ifname == netlab.HOST_IFNAME
        with pytest.raises(KeyError, match="no host 'nope'"):
            lab.host("nope")
    with pytest.raises(ValueError, match="unique"):
        Lab(["a", "a"])
    with pytest.raises(ValueError, match="bad host name"):
        Lab(["a/b"])


def test_teardown_after_error_in_body() -> None:
    with pytest.raises(RuntimeError, match="test body failed"), Lab(2) as lab:
        raise RuntimeError("test body failed")
    assert objects_of(lab.id) == NOTHING


def test_failed_up_removes_what_it_built(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real_create = ns.create_netns

    def create_twice_then_fail(name: str) -> None:
        if len(made) == 2:
            raise OSError("injected failure")
        made.append(name)
        real_create(name)

    monkeypatch.setattr(ns, "create_netns", create_twice_then_fail)
    lab = Lab(3)
    with pytest.raises(OSError, match="injected failure"):
        lab.up()
    assert len(made) == 2
    assert objects_of(lab.id) == NOTHING


def test_two_labs_coexist(make_lab: Callable[..., Lab]) -> None:
    one, two = make_lab(2), make_lab(2)
    assert one.id != two.id and one.subnet != two.subnet and one.bridge != two.bridge
    assert one.group(1) != two.group(1)
    assert tcp_echo(one, "h1", "h2", b"lab one") == b"lab one"
    assert tcp_echo(two, "h2", "h1", b"lab two") == b"lab two"
    # Same host names, different LANs: lab one cannot reach lab two.
    assert not one.run("h1", ping, two.host("h2").ip, 1.0)


def test_lab_name_must_be_unique(make_lab: Callable[..., Lab]) -> None:
    name = f"t{os.getpid()}"
    make_lab(1, name)
    with pytest.raises(LabError, match="already exists"):
        Lab(1, name).up()


# --- connectivity and isolation ---------------------------------------------------------------------


def test_tcp_echo_between_hosts(lab: Lab) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB, several segments and windows
    assert tcp_echo(lab, "pub", "sub", payload) == payload


def test_ping_between_hosts(lab: Lab) -> None:
    assert lab.run("pub", ping, lab.host("sub").ip)
    assert lab.run("sub", ping, lab.host("pub").ip)
    unused = str(lab.subnet.network_address + 200)
    assert not lab.run("pub", ping, unused, 1.0)


def test_hosts_are_isolated_from_the_root_namespace(lab: Lab) -> None:
    assert lab.run("pub", interfaces) == sorted(["lo", netlab.HOST_IFNAME])
    assert ("00000000", "00000000") not in lab.run("pub", routes)  # no default route
    with IPRoute() as ipr:
        root_addrs = [a.get_attr("IFA_ADDRESS") for a in ipr.addr("dump", family=socket.AF_INET)]
    outside = [a for a in root_addrs if not a.startswith("127.")] or ["192.0.2.1"]
    for address in outside:
        assert lab.run("pub", connect_errno, address, 9) == errno.ENETUNREACH
    assert not {h.ip for h in lab.hosts} & set(root_addrs)


def test_multicast_route_and_address_helper(lab: Lab) -> None:
    pub = lab.host("pub")
    assert netlab.interface_ipv4(pub.ifname, pub.netns) == pub.ip
    assert lab.run("pub", netlab.interface_ipv4, pub.ifname) == pub.ip
    with pytest.raises(LookupError, match="no interface"):
        netlab.interface_ipv4("nope0", pub.netns)
    assert ("000000E0", "000000F0") in lab.run("sub", routes)  # 224.0.0.0/4 on the lab interface
    group = ipaddress.IPv4Address(lab.group(7))
    assert group in netlab.GROUP_NET and str(group).endswith(".7")
    with pytest.raises(ValueError):
        lab.group(256)


# --- running code inside hosts ----------------------------------------------------------------------


def test_run_start_popen_enter_the_namespace(lab: Lab) -> None:
    mine = netns_link()
    in_pub = lab.run("pub", netns_link)
    in_sub = lab.start("sub", netns_link).result(timeout=30)
    assert len({mine, in_pub, in_sub}) == 3
    proc = lab.popen("pub", ["readlink", "/proc/self/ns/net"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == in_pub
    assert netns_link() == mine  # the parent never moved


def test_start_handle(lab: Lab) -> None:
    handle = lab.start("pub", sleep_for, 30)
    assert not handle.join(0.2)
    assert handle.is_alive()
    with pytest.raises(TimeoutError, match="did not finish"):
        handle.result(timeout=0.1)
    handle.terminate()
    assert not handle.is_alive()
    with pytest.raises(HostError, match="died without a result"):
        handle.result(timeout=5)


def test_a_child_killed_while_sending_its_result_died_without_one(lab: Lab) -> None:
    # terminate() lands in the child's write of a large result: the parent reads a message cut short
    # (multiprocessing's OSError "got end of file during message"), which is the child dying, not an error of
    # the teardown (CI once failed a lab's teardown with that line).
    ready = MP.Queue()
    handle = lab.start("pub", big_result, ready, 64 << 20)
    ready.get(timeout=30)
    time.sleep(0.5)  # into the send
    handle.terminate()
    assert not handle.is_alive()
    with pytest.raises(HostError, match="died without a result"):
        handle.result(timeout=5)


def test_run_reraises_the_exception_with_the_child_traceback(lab: Lab) -> None:
    with pytest.raises(ValueError, match="inside pub") as info:
        lab.run("pub", fail_with, "inside pub")
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fail_with" in str(cause) and "ValueError: inside pub" in str(cause)


def test_run_reports_a_crashed_child(lab: Lab) -> None:
    with pytest.raises(HostError, match="exit code 3"):
        lab.run("sub", exit_hard, 3)


def test_run_timeout_kills_the_child(lab: Lab) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 1\.0 s"):
        lab.run("sub", sleep_for, 60, timeout=1.0)
    assert time.monotonic() - started < 10
    assert ns.pids_in_netns(lab.host("sub").netns) == []


def test_down_kills_every_process_of_the_lab() -> None:
    with Lab(["a", "b"]) as lab:
        started = MP.Queue()
        handle = lab.start("a", report_then_sleep, started, 300)
        assert started.get(timeout=30) == handle.pid  # it is inside the namespace now
        child_pid, _ = lab.run("a", pid_and_netns)  # finished already: must not be touched
        sleeper = lab.popen("b", ["sleep", "300"])
        shell = lab.popen("b", ["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
        grandchild = int(shell.stdout.readline())
        inside = ns.pids_in_netns(lab.host("a").netns) + ns.pids_in_netns(lab.host("b").netns)
        assert {handle.pid, sleeper.pid, shell.pid, grandchild} <= set(inside)
        assert child_pid not in inside
    assert not [pid for pid in inside if alive(pid)]
    assert sleeper.returncode is not None and shell.returncode is not None


# --- leftovers ---------------------------------------------------------------------------------------

_CRASHING_RUN = """
import os, subprocess, netlab
lab = netlab.Lab(2).up()
proc = lab.popen("h1", ["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(lab.id, proc.pid, flush=True)
os._exit(0)  # a crash: no teardown
"""


def test_down_all_removes_a_crashed_lab_and_keeps_live_ones(lab: Lab) -> None:
    out = subprocess.run([sys.executable, "-c", _CRASHING_RUN], capture_output=True, text=True, timeout=60, check=True)
    crashed_id, sleeper = out.stdout.split()
    assert objects_of(crashed_id)["netns"] and alive(int(sleeper))

    assert down_all(crashed_id) == [crashed_id]
    assert objects_of(crashed_id) == NOTHING
    assert not alive(int(sleeper))

    assert down_all(lab.id) == []  # owned by this (running) process
    assert objects_of(lab.id)["links"]
    assert down_all(lab.id, force=True) == [lab.id]
    assert objects_of(lab.id) == NOTHING


def test_down_all_refuses_foreign_prefixes() -> None:
    for prefix in ("", "eth", "z", "zl12345", "veth"):
        with pytest.raises(ValueError, match="not a netlab prefix"):
            down_all(prefix)


# --- the Docker trap: bridged frames through iptables FORWARD ---------------------------------------


def test_bridge_nf_decision(tmp_path: Path) -> None:
    knob = tmp_path / "bridge-nf-call-iptables"
    assert not firewall.bridge_nf_active(knob)
    knob.write_text("0\n")
    assert not firewall.bridge_nf_active(knob)
    assert not firewall.allow_bridge("zl000-br", knob)  # decides without calling iptables
    knob.write_text("1\n")
    assert firewall.bridge_nf_active(knob)


def test_forward_rule_lets_frames_cross_a_dropping_firewall(lab: Lab) -> None:
    """A DROP rule for this lab's bridge only stands in for Docker's FORWARD policy DROP."""
    if shutil.which("iptables") is None:
        pytest.skip("iptables is not installed: apt-get install iptables")
    assert lab.forward_rule == firewall.bridge_nf_active()
    drop = ["FORWARD", "-i", lab.bridge, "-o", lab.bridge, "-j", "DROP"]
    subprocess.run(["iptables", "-w", "10", "-A", *drop], check=True, timeout=30)
    try:
        assert tcp_echo(lab, "pub", "sub", b"through") == b"through"
        firewall.remove_bridge_rule(lab.bridge)
        assert lab.bridge not in firewall.bridges_with_rules()
        reachable = lab.run("pub", ping, lab.host("sub").ip, 1.0)
        refused = lab.run("pub", connect_errno, lab.host("sub").ip, 9) == errno.ECONNREFUSED
    finally:
        subprocess.run(["iptables", "-w", "10", "-D", *drop], check=True, timeout=30)
    # Bridged frames meet iptables only when the sysctl is on; then, without the rule, they are dropped.
    assert reachable == refused == (not lab.forward_rule)


# --- subnets and CLI helpers (no root needed, but kept here with the rest) --------------------------


def test_pick_subnet() -> None:
    net = ipaddress.IPv4Network
    assert pick_subnet("zl003", []) == net("10.250.3.0/24")
    assert pick_subnet("zl103", []) == net("10.250.3.0/24")  # 0x103 % 256
    assert pick_subnet("zl003", [net("10.250.3.0/24"), net("10.250.4.128/25")]) == net("10.250.5.0/24")
    assert pick_subnet("zl0ff", [net("10.250.255.0/24")]) == net("10.250.0.0/24")
    with pytest.raises(LabError, match="in use"):
        pick_subnet("zl003", [net("10.0.0.0/8")])


def test_resolve_host() -> None:
    records = [
        {"name": "a", "id": "zl001", "hosts": [{"name": "h1"}, {"name": "pub"}]},
        {"name": "b", "id": "zl002", "hosts": [{"name": "h1"}]},
    ]
    assert resolve_host("pub", records) == ("a", "pub")
    assert resolve_host("b/h1", records) == ("b", "h1")
    assert resolve_host("zl001/h1", records) == ("a", "h1")
    with pytest.raises(LabError, match="several labs"):
        resolve_host("h1", records)
    with pytest.raises(LabError, match="no host"):
        resolve_host("a/zz", records)


# --- CLI ---------------------------------------------------------------------------------------------


def test_cli_up_status_exec_down() -> None:
    name = f"cli{os.getpid()}"
    for command in ([], ["up"], ["status"], ["exec"], ["down"]):
        assert "usage: netlab" in netlab_cli(*command, "--help").stdout
    try:
        up = netlab_cli("up", "--hosts", "3", "--name", name)
        assert name in up.stdout and "h3" in up.stdout
        record = next(r for r in json.loads(netlab_cli("status", "--json").stdout)["labs"] if r["name"] == name)
        assert [h["name"] for h in record["hosts"]] == ["h1", "h2", "h3"]
        assert record["owner"] is None
        assert record["hosts"][0]["ip"] in netlab_cli("status").stdout

        assert netlab_cli("exec", f"{name}/h2", "--", "sh", "-c", "exit 7", check=False).returncode == 7
        dev = netlab_cli("exec", f"{name}/h1", "--", "cat", "/proc/net/dev").stdout
        assert f"{netlab.HOST_IFNAME}:" in dev and "eth0:" not in dev
        link = netlab_cli("exec", f"{name}/h1", "--", "readlink", "/proc/self/ns/net").stdout.strip()
        assert link.startswith("net:[") and link != netns_link()
        missing = netlab_cli("exec", f"{name}/h9", "--", "true", check=False)
        assert missing.returncode == 1 and "no host" in missing.stderr
        assert netlab_cli("exec", f"{name}/h1", "--", "no-such-cmd", check=False).returncode == 127

        # The lab outlives the commands: a Python process reaches h1 from h2.
        lab = Lab.load(name)
        assert lab.run("h2", ping, lab.host("h1").ip)
    finally:
        down = netlab_cli("down", name, check=False)
    assert down.returncode == 0, down.stderr
    assert name not in netlab_cli("status").stdout
    assert objects_of(record["id"]) == NOTHING


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
ONE_LAB_TEST = "tests/lab/test_netlab.py::test_ping_between_hosts"


def test_fixture_fails_without_root() -> None:
    """Run one lab test as user nobody: it must fail with the root message, not skip."""
    proc = subprocess.run(
        [*AS_NOBODY, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", ONE_LAB_TEST],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert proc.returncode != 0
    assert NEEDS_ROOT in proc.stdout
    assert "1 error" in proc.stdout and "skipped" not in proc.stdout
