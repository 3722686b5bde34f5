"""The server processes' cores: the gateway (ingest, sequencing, journal, multicast) and the replay session."""
