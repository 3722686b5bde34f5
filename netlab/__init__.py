"""netlab: throw-away LANs of network namespaces (or Docker containers) for multicast tests and demos."""

from netlab.lab import GROUP_NET, HOST_IFNAME, LAB_NET, PREFIX, Host, Lab, LabError, down_all
from netlab.ns import interface_ipv4
from netlab.procs import MP, HostError, HostProcess, RemoteTraceback

__all__ = [
    "GROUP_NET",
    "HOST_IFNAME",
    "LAB_NET",
    "MP",
    "PREFIX",
    "Host",
    "HostError",
    "HostProcess",
    "Lab",
    "LabError",
    "RemoteTraceback",
    "down_all",
    "interface_ipv4",
]
