"""Prometheus exposition shared by servers and clients: one registry per object, so several live in one process."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


def parse_listen(addr: str) -> tuple[str, int]:
    """'HOST:PORT' or ':PORT' (all interfaces) -> (host, port), with an error that shows the form."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {addr!r}: expected HOST:PORT, e.g. 127.0.0.1:9108")
    return host or "0.0.0.0", int(port)


class Metrics:
    """Base: a private registry and an optional HTTP endpoint serving it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: WSGIServer | None = None

    def serve(self, addr: str) -> None:
        host, port = parse_listen(addr)
        self._server, _ = start_http_server(port, host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
