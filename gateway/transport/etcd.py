"""etcd as the coordinator: leases and create-if-absent keys, every call bounded by a timeout.

We talk to etcd through its HTTP/JSON gateway with etcd3gw: it is maintained, needs only `requests`, is typed,
and takes a per-request timeout, which our deadlines need. (python-etcd3 is unmaintained and breaks with
protobuf >= 4; aetcd is asyncio and grpc, more than a lease and a transaction need.)
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import etcd3gw
from etcd3gw.exceptions import Etcd3Exception

from gateway.errors import CoordinatorError


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a key: its value, the revision that created it (the epoch) and its lease."""

    value: str
    create_revision: int
    lease: int
    mod_revision: int = 0


class Etcd:
    """One etcd endpoint (`http://HOST:PORT`). Not thread-safe: one per thread."""

    def __init__(self, url: str, timeout_s: float = 0.5) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise CoordinatorError(f"etcd URL {url!r}: expected http://HOST:PORT, e.g. http://127.0.0.1:2379")
        self.url = url
        self._client = etcd3gw.client(host=parts.hostname, port=parts.port, protocol=parts.scheme, timeout=timeout_s)

    def grant(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds (etcd's unit); returns its id."""
        return int(self._call(self._client.lease, ttl_s).id)

    def keepalive(self, lease: int) -> int:
        """Renews `lease`; returns its TTL from now, or -1 when etcd no longer has it."""
        url = self._client.get_url("/lease/keepalive")
        result = self._call(self._client.post, url, json={"ID": lease})
        return int(result.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        self._call(self._client.post, self._client.get_url("/kv/lease/revoke"), json={"ID": lease})

    def create(self, key: str, value: str, lease: int, unchanged: tuple[str, int] | None = None) -> int | None:
        """Creates `key` bound to `lease` if it does not exist (and, with `unchanged=(other, mod_revision)`, if
        `other` was not modified since): the revision it was created at, or None."""
        k = _b64(key)
        compare = [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": 0}]
        if unchanged is not None:
            other, revision = unchanged
            compare.append({"key": _b64(other), "result": "EQUAL", "target": "MOD", "mod_revision": revision})
        txn = {
            "compare": compare,
            "success": [{"request_put": {"key": k, "value": _b64(value), "lease": lease}}],
            "failure": [],
        }
        result = self._call(self._client.transaction, txn)
        return int(result["header"]["revision"]) if result.get("succeeded") else None

    def put_if_held(self, key: str, value: str, leader_key: str, epoch: int) -> bool:
        """Puts `key` only while `leader_key` is the one created at revision `epoch`: a write fenced by
        leadership (a deposed leader's write fails). Whether it was written."""
        k = _b64(leader_key)
        txn = {
            "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": epoch}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}],
            "failure": [],
        }
        return bool(self._call(self._client.transaction, txn).get("succeeded"))

    def get(self, key: str) -> str | None:
        found = self.holder(key)
        return None if found is None else found.value

    def put(self, key: str, value: str) -> None:
        self._call(self._client.put, key, value)

    def prefix(self, prefix: str) -> dict[str, str]:
        """Every key under `prefix` with its value."""
        found = self._call(self._client.get_prefix, prefix)
        return {_text(meta["key"]): _text(value) for value, meta in found}

    def holder(self, key: str) -> Holder | None:
        found = self._call(self._client.get, key, metadata=True)
        if not found:
            return None
        value, meta = found[0]
        return Holder(_text(value), int(meta["create_revision"]), int(meta.get("lease", 0)), int(meta["mod_revision"]))

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Etcd3Exception as exc:
            raise CoordinatorError(f"etcd at {self.url}: {exc.detail_text or exc}; is etcd running there?") from exc
