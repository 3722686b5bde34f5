"""Lab tools: the demo, a gateway + sidecar deployment on a lab host, a rogue sender. The only users of netlab."""
