"""How gateways and sidecars make themselves found: LAN announcements and, beyond one subnet, etcd."""
