"""ZEPS gateway: reliable multicast pub-sub for Python.

A gateway sequences and journals every published record and multicasts record batches over PGM/NORM; a replay
sidecar serves the journal over TCP; the client merges both connections into one gap-free, in-order stream.
"""

__version__ = "0.1.0"
