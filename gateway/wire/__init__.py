"""Bytes <-> objects, no sockets: the record-batch format, the ZEPS protocol codec, heartbeats, the stream key."""
