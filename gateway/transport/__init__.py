"""How bytes leave and enter a process: NORM and UDP multicast, CURVE on TCP, metrics over HTTP."""
