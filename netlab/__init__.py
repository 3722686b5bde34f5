"""netlab: throw-away LANs of network namespaces (or Docker containers) for multicast tests and demos, and two
sites of them joined by a router over an impaired WAN (:class:`Sites`)."""

from netlab import impair, packets
from netlab.dockerlab import DockerLab
from netlab.impair import Impairment, LinkCounters
from netlab.lab import GROUP_NET, HOST_IFNAME, LAB_NET, PREFIX, Host, Lab, LabError, down_all
from netlab.ns import interface_ipv4
from netlab.packets import Capture, Flow, Probe
from netlab.procs import MP, HostError, HostProcess, RemoteTraceback
from netlab.sites import Sites
from netlab.wallclock import WallClock

__all__ = [
    "GROUP_NET",
    "HOST_IFNAME",
    "LAB_NET",
    "MP",
    "PREFIX",
    "Capture",
    "DockerLab",
    "Flow",
    "Host",
    "HostError",
    "HostProcess",
    "Impairment",
    "Lab",
    "LabError",
    "LinkCounters",
    "Probe",
    "RemoteTraceback",
    "Sites",
    "WallClock",
    "down_all",
    "impair",
    "interface_ipv4",
    "packets",
]
