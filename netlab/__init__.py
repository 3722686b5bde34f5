"""netlab: throw-away LANs of network namespaces (or Docker containers) for multicast tests and demos."""
