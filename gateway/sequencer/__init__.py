"""The gateway process: ingest, sequencing into lanes, the journal's write-ahead, multicast and confirms."""
