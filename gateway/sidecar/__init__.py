"""The replay sidecar's cores: the sans-IO replay session, the fill port, snapshot indexes, its metrics (the
process around them is gateway.replay)."""
