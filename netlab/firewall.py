"""The one iptables rule a lab may need: let frames cross its own bridge.

With br_netfilter loaded and ``net.bridge.bridge-nf-call-iptables=1`` (Docker turns both on), frames
crossing any Linux bridge traverse iptables FORWARD, whose policy Docker sets to DROP: lab traffic then
vanishes silently. pyroute2 cannot edit iptables, so this module shells out to ``iptables``.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger("netlab")

BRIDGE_NF_SYSCTL = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
_TIMEOUT = 30.0


def bridge_nf_active(sysctl: Path = BRIDGE_NF_SYSCTL) -> bool:
    """True when bridged IPv4 frames go through iptables, i.e. the sysctl exists and is 1."""
    try:
        return sysctl.read_text().strip() == "1"
    except FileNotFoundError:
        return False


def _rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # -w: wait for the xtables lock instead of failing when another lab (or Docker) holds it.
    return subprocess.run(
        ["iptables", "-w", "10", *args], capture_output=True, text=True, check=check, timeout=_TIMEOUT
    )


def allow_bridge(bridge: str, sysctl: Path = BRIDGE_NF_SYSCTL) -> bool:
    """Insert the ACCEPT rule for ``bridge`` if bridged frames hit iptables; return whether it was inserted."""
    if not bridge_nf_active(sysctl):
        return False
    if shutil.which("iptables") is None:
        log.warning(
            "%s is 1 but iptables is not installed: if a firewall (e.g. Docker) drops forwarded frames, "
            "lab traffic will vanish. Fix: apt-get install iptables",
            sysctl,
        )
        return False
    try:
        _iptables("-I", *_rule(bridge))
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"iptables -I {' '.join(_rule(bridge))} failed: {exc.stderr.strip()}. Bridged frames pass through "
            f"iptables here ({sysctl} is 1), so lab traffic would be dropped. Check that iptables works "
            "(iptables -S FORWARD)."
        ) from exc
    return True


def remove_bridge_rule(bridge: str) -> None:
    """Delete the ACCEPT rule for ``bridge`` (every copy); do nothing when there is none."""
    if shutil.which("iptables") is None:
        return
    for _ in range(16):  # bounded: one copy per insert, and a lab inserts once
        if _iptables("-C", *_rule(bridge), check=False).returncode != 0:
            return
        _iptables("-D", *_rule(bridge))


_RULE_RE = re.compile(r"^-A FORWARD -i (\S+) -o (\S+) -j ACCEPT$")


def bridges_with_rules() -> list[str]:
    """Bridges that have a netlab-style ACCEPT rule in FORWARD (for cleaning up after crashed runs)."""
    if shutil.which("iptables") is None:
        return []
    out = _iptables("-S", "FORWARD").stdout
    found = []
    for line in out.splitlines():
        m = _RULE_RE.match(line.strip())
        if m and m.group(1) == m.group(2):
            found.append(m.group(1))
    return found
