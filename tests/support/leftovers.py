"""What a lab left on the machine: its objects by name, and whether a process of it still runs."""

from __future__ import annotations

from pathlib import Path

from pyroute2 import IPRoute

from netlab import firewall, ns, state

NOTHING = {"netns": [], "links": [], "rules": [], "record": []}


def objects_of(lab_id: str) -> dict[str, list[str]]:
    """Everything on the machine named after ``lab_id``."""
    with IPRoute() as ipr:
        links = [m.get_attr("IFLA_IFNAME") for m in ipr.link("dump")]
    return {
        "netns": [n for n in ns.list_netns() if n.startswith(f"{lab_id}-")],
        "links": [n for n in links if n.startswith(f"{lab_id}-")],
        "rules": [b for b in firewall.bridges_with_rules() if b.startswith(f"{lab_id}-")],
        "record": [str(p) for p in [state.path_for(lab_id)] if p.exists()],
    }


def alive(pid: int) -> bool:
    """Running (zombies count as gone: they have exited and only wait to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
