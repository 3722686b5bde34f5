"""etcd as the coordinator: leases, create-if-absent keys, and the directory's entries, every call bounded by a
timeout.

We talk to etcd through its HTTP/JSON gateway with etcd3gw: it is maintained, needs only `requests`, is typed,
and takes a per-request timeout, which our deadlines need. (python-etcd3 is unmaintained and breaks with
protobuf >= 4; aetcd is asyncio and grpc, more than a lease and a transaction need.)

Given several URLs (the members of one cluster), a request that cannot reach one tries the next, once each;
the one that answered is used first from then on. Errors are one CoordinatorError naming every URL tried.
A `Cluster` carries the TLS (CA, client certificate) that https:// members want, wherever its URLs go.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import etcd3gw
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception
from requests.exceptions import RequestException

from gateway.errors import ConfigError, CoordinatorError
from gateway.transport.send_errors import SendErrors
from gateway.transport.tls import EtcdTls


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


@dataclass(frozen=True, slots=True)
class Entry:
    """One key under a prefix: its value and the revisions that created and last changed it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int


def check_url(url: str) -> str:
    """`url` if it is an etcd client URL we can use (http[s]://HOST:PORT), else CoordinatorError saying so."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise CoordinatorError(f"etcd URL {url!r}: expected http://HOST:PORT, e.g. http://127.0.0.1:2379")
    return url


class Cluster(tuple[str, ...]):
    """The client URLs of one etcd cluster, and the TLS to reach them with (None: none of ours)."""

    tls: EtcdTls | None

    def __new__(cls, urls: Iterable[str], tls: EtcdTls | None = None) -> Cluster:
        cluster = super().__new__(cls, urls)
        if tls is not None and any(urlsplit(u).scheme != "https" for u in cluster):
            raise ConfigError("etcd with --etcd-ca, --etcd-cert and --etcd-key: give its URLs as https://HOST:PORT")
        cluster.tls = tls
        return cluster


class Etcd:
    """etcd at `url` (`http://HOST:PORT`, or several members of one cluster). Not thread-safe: one per thread."""

    def __init__(self, url: str | Sequence[str], timeout_s: float = 0.5, *, errors: SendErrors | None = None) -> None:
        """`errors`: where requests the network refuses (a member unreachable) are reported."""
        self.errors = errors
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise CoordinatorError("no etcd URL given: give --etcd http://HOST:PORT")
        self.urls = [check_url(u) for u in urls]
        self.timeout_s = timeout_s
        tls = url.tls if isinstance(url, Cluster) else None
        self._clients = [_client(u, timeout_s, tls) for u in self.urls]
        self._first = 0  # the member that answered last

    @property
    def url(self) -> str:
        return self.urls[self._first]

    def grant(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds (etcd's unit); returns its id."""
        return int(self._call(lambda c: c.lease(ttl_s).id))

    def keepalive(self, lease: int) -> int:
        """Renews `lease`; returns its TTL from now, or -1 when etcd no longer has it."""
        result = self._call(lambda c: c.post(c.get_url("/lease/keepalive"), json={"ID": lease}))
        return int(result.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        self._call(lambda c: c.post(c.get_url("/kv/lease/revoke"), json={"ID": lease}))

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
        result = self._call(lambda c: c.transaction(txn))
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
        return bool(self._call(lambda c: c.transaction(txn)).get("succeeded"))

    def get(self, key: str) -> str | None:
        found = self.holder(key)
        return None if found is None else found.value

    def holder(self, key: str) -> Holder | None:
        found = self._call(lambda c: c.get(key, metadata=True))
        if not found:
            return None
        value, meta = found[0]
        return Holder(_text(value), int(meta["create_revision"]), int(meta.get("lease", 0)), int(meta["mod_revision"]))

    def put(self, key: str, value: str | bytes, lease: int = 0) -> None:
        """Sets `key` to `value` (text as UTF-8), bound to `lease` (0: none)."""
        data = value.encode() if isinstance(value, str) else value
        request: dict[str, Any] = {"key": _b64(key), "value": base64.b64encode(data).decode()}
        if lease:
            request["lease"] = lease
        self._call(lambda c: c.post(c.get_url("/kv/put"), json=request))

    def delete(self, key: str) -> None:
        self._call(lambda c: c.delete(key))

    def get_prefix(self, prefix: str) -> list[Entry]:
        """Every key under `prefix`, in key order."""
        found = self._call(lambda c: c.get_prefix(prefix))
        return [
            Entry(_text(meta["key"]), value, int(meta["create_revision"]), int(meta["mod_revision"]))
            for value, meta in found
        ]

    def _call(self, request: Callable[[Any], Any]) -> Any:
        """`request` of the member that answered last; one that cannot be reached leaves it to the next, once each."""
        failures = []
        for _ in self._clients:
            try:
                answer = request(self._clients[self._first])
            except (ConnectionFailedError, ConnectionTimeoutError, RequestException) as exc:
                if refused := _tls_refused(exc):  # a setting, not an outage: the other members would refuse too
                    raise CoordinatorError(f"etcd at {self.url}: {refused}") from exc
                # RequestException: what etcd3gw does not wrap (a body cut short, a reset while it is read)
                if self.errors and not isinstance(exc, ConnectionTimeoutError):
                    self.errors.refused("etcd", self.url, exc, "the next member is tried, or the same again later")
                failures.append(f"{self.url} {_unreachable(exc, self.timeout_s)}")
                self._first = (self._first + 1) % len(self._clients)
            except Etcd3Exception as exc:  # etcd answers with a JSON body; an empty one is something else
                detail = exc.detail_text or f"HTTP {exc}, not an answer of etcd: is this its client URL?"
                raise CoordinatorError(f"etcd at {self.url}: {detail}") from exc
            else:
                if self.errors:
                    self.errors.sent("etcd", self.url)
                return answer
        raise CoordinatorError(f"etcd unreachable ({'; '.join(failures)}): is etcd running there? Check the --etcd URL")


def _client(url: str, timeout_s: float, tls: EtcdTls | None) -> Any:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None  # check_url
    ca, cert, key = (tls.ca, tls.cert, tls.key) if tls is not None else (None, None, None)
    client = etcd3gw.client(host=parts.hostname, port=parts.port, protocol=parts.scheme, timeout=timeout_s,
                            ca_cert=ca, cert_cert=cert, cert_key=key)  # fmt: skip
    # No proxy and no .netrc from the environment: requests looks both up on every request (a fifth of its
    # Python time here, with the GIL held, beside a gateway's loop), and etcd is reached directly.
    if hasattr(client, "session"):
        client.session.trust_env = False
    return client


def _tls_refused(exc: Etcd3Exception | RequestException) -> str:
    """Why etcd's TLS and ours did not agree, or "" (the failure was not TLS)."""
    cause = str(exc.__context__ or "")
    if "SSL" not in cause:
        return ""
    reason = next((w.strip("[]") for w in cause.replace("]", "] ").split() if w.isupper() and "_" in w), "TLS failed")
    return (
        f"TLS refused ({reason}): give --etcd-ca (the CA of etcd's certificate), and --etcd-cert and --etcd-key "
        "(a client certificate signed by the CA of etcd's --trusted-ca-file)"
    )


def _unreachable(exc: Etcd3Exception | RequestException, timeout_s: float) -> str:
    if isinstance(exc, ConnectionTimeoutError):
        return f"did not answer within {timeout_s:g} s"
    return "refused the connection or cannot be reached"
