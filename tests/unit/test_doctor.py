"""`zeps doctor`'s checks over a made-up machine (a directory standing in for /sys and /proc): each finding says
what it saw or the fix, and only what the transports asked about is required. The library checks run ldconfig:
tests/process/test_cli_errors.py has them."""

from __future__ import annotations

from pathlib import Path

from gateway.tools.doctor import SOCKET_BUFFER, system

ROUTE_HEAD = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
DEFAULT_ROUTE = "eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
LAN_ROUTE = "eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"


def machine(root: Path, links: dict[str, int], routes: str, rmem: int = SOCKET_BUFFER) -> Path:
    for name, flags in links.items():
        (root / "sys/class/net" / name).mkdir(parents=True)
        (root / "sys/class/net" / name / "flags").write_text(f"{flags:#x}\n")
    (root / "proc/net").mkdir(parents=True)
    (root / "proc/net/route").write_text(ROUTE_HEAD + routes)
    (root / "proc/sys/net/core").mkdir(parents=True)
    (root / "proc/sys/net/core/rmem_max").write_text(f"{rmem}\n")
    (root / "proc/sys/net/core/wmem_max").write_text(f"{SOCKET_BUFFER}\n")
    return root


def by_name(transports: list[str], root: Path) -> dict[str, tuple[bool, bool, str]]:
    return {f.name: (f.ok, f.needed, f.line) for f in system(transports, root)}


def test_a_multicast_machine_passes_and_names_its_interfaces(tmp_path: Path) -> None:
    root = machine(tmp_path, {"lo": 0x9, "eth0": 0x1003}, DEFAULT_ROUTE)
    found = by_name(["epgm"], root)
    assert found["multicast"] == (True, True, "interfaces up with multicast: eth0")
    assert found["rmem_max"][:2] == (True, False)


def test_no_multicast_route_is_required_only_for_multicast_transports(tmp_path: Path) -> None:
    root = machine(tmp_path, {"eth0": 0x1003}, LAN_ROUTE)
    ok, needed, line = by_name(["udp"], root)["multicast"]
    assert (ok, needed) == (False, True) and "ip route add 224.0.0.0/4 dev eth0" in line
    assert by_name(["tcp"], root)["multicast"][:2] == (False, False)  # a hint only


def test_an_interface_without_multicast_or_down_does_not_count(tmp_path: Path) -> None:
    root = machine(tmp_path, {"lo": 0x1009, "eth0": 0x1002, "eth1": 0x3}, DEFAULT_ROUTE)
    ok, _, line = by_name(["norm"], root)["multicast"]
    assert not ok and "ip link set IF up multicast on" in line


def test_small_socket_buffers_are_a_hint_with_the_sysctl(tmp_path: Path) -> None:
    root = machine(tmp_path, {"eth0": 0x1003}, DEFAULT_ROUTE, rmem=212_992)
    ok, needed, line = by_name(["epgm"], root)["rmem_max"]
    assert (ok, needed) == (False, False)
    assert line == (
        "net.core.rmem_max = 212,992 caps the 4 MiB socket buffers (loss in bursts): "
        f"sysctl -w net.core.rmem_max={SOCKET_BUFFER}"
    )
