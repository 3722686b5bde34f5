"""A gateway's replication strategy: alone (`strategy.Solo`) or a node of a group (`group.GroupNode`) and its
parts: the peer-link server, the replica copier, the in-sync keeper, the elector and its leadership clock."""
