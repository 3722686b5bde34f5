"""TLS for a group's TCP: the peer link between its nodes (mutual TLS, certificates signed by the group's CA) and
the nodes' etcd client connections; and the certificates themselves, made with the `openssl` command.

Why TLS and not CURVE on the peer link: the link is a plain socket that the gateway's loop polls itself
(gateway.transport.link says why), and Python's `ssl` wraps exactly such a socket, non-blocking, with no thread
of its own. Each node presents a certificate signed by the group's CA and verifies its peer's: whoever holds a
key signed by that CA is a node of the group, nobody else can connect, read or change the link. Host names
are not checked (a follower connects to the address its leader put in etcd, and a node's address may change):
the CA is what admits (docs/security.md, "The group's TCP"). Node names are: a follower takes the leader's link
only from the certificate of the node etcd names as leader, and the leader counts an ack for node N only from
a link whose certificate is N's, so one node's key cannot speak for another.

Threading contract: a `Handshake` belongs to the thread that polls its socket; `PeerTls` is read-only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError

HANDSHAKE_S = 1.0  # a connection that has not finished its handshake by then is closed (a peer that sends nothing)
DAYS = 3650  # lifetime of the certificates `zeps keygen` makes


def _readable(option: str, path: str | Path) -> Path:
    """`path`, if it is a readable file; else ConfigError naming `option`, the file and the fix."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{option} {file}: no such file: make one with `zeps keygen --tls-ca` (docs/security.md)")
    if not os.access(file, os.R_OK):
        raise ConfigError(f"{option} {file}: cannot be read by this user: check its owner and mode")
    return file


def _context(purpose: ssl.Purpose, options: tuple[str, str, str], ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """A context that presents `cert` (with `key`) and requires a peer certificate signed by `ca`; `options`:
    the options that named the three files, for the errors."""
    ctx = ssl.create_default_context(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # the CA admits; see the module's docstring
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"{options[1]} {cert} with {options[2]} {key}: not a PEM certificate and its private key "
            f"({exc.strerror or exc})"
        ) from None
    try:
        ctx.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{options[0]} {ca}: not a PEM certificate ({exc.strerror or exc})") from None
    return ctx


@dataclass(frozen=True)
class PeerTls:
    """A node's TLS on the peer link: `server` for the connections its listener accepts, `client` for the one its
    follower makes."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def load(cls, cert: str | Path, key: str | Path, ca: str | Path) -> PeerTls:
        """From PEM files (--peer-tls-cert, --peer-tls-key, --peer-tls-ca); ConfigError naming a bad one."""
        options = ("--peer-tls-ca", "--peer-tls-cert", "--peer-tls-key")
        files = tuple(_readable(option, path) for option, path in zip(options, (ca, cert, key), strict=True))
        server = _context(ssl.Purpose.CLIENT_AUTH, options, *files)
        server.num_tickets = 0  # nodes do not resume sessions: no tickets to send
        return cls(server, _context(ssl.Purpose.SERVER_AUTH, options, *files))


@dataclass(frozen=True)
class EtcdTls:
    """Files for etcd's client TLS (--etcd-ca, --etcd-cert, --etcd-key), checked at start: requests would only
    find a bad one at the first request."""

    ca: str
    cert: str
    key: str

    @classmethod
    def load(cls, ca: str | Path, cert: str | Path, key: str | Path) -> EtcdTls:
        files = tuple(_readable(option, path) for option, path in zip(_ETCD_OPTIONS, (ca, cert, key), strict=True))
        _context(ssl.Purpose.SERVER_AUTH, _ETCD_OPTIONS, *files)
        return cls(*(str(f) for f in files))

    def context(self) -> ssl.SSLContext:
        """A client context for etcd's https:// (what its own client, etcd3gw, builds from the same files)."""
        return _context(ssl.Purpose.SERVER_AUTH, _ETCD_OPTIONS, Path(self.ca), Path(self.cert), Path(self.key))


_ETCD_OPTIONS = ("--etcd-ca", "--etcd-cert", "--etcd-key")


class Handshake:
    """A TLS handshake on a connected non-blocking socket, stepped by its owner's loop until done or `deadline`.
    `sock` is the wrapped socket (the same descriptor) from then on."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, *, server_side: bool) -> None:
        self.sock = ctx.wrap_socket(sock, server_side=server_side, do_handshake_on_connect=False)
        self.deadline = time.monotonic() + HANDSHAKE_S
        self.wants_write = False  # the handshake waits for room to send, not for the peer

    def step(self) -> bool:
        """Go on with the handshake as far as it can: whether it is done. ssl.SSLError or OSError if it failed,
        TimeoutError past the deadline."""
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.wants_write = False
        except ssl.SSLWantWriteError:
            self.wants_write = True
        else:
            self.wants_write = False
            return True
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"TLS handshake not done in {HANDSHAKE_S:g} s")
        return False


def names(sock: ssl.SSLSocket) -> frozenset[str]:
    """The names in a peer's verified certificate: its subjectAltName DNS entries and its common name (what
    `zeps keygen --tls-node tls/NAME` writes: the node's name)."""
    cert: dict[str, Any] = dict(sock.getpeercert() or {})  # typeshed types its values loosely
    dns = {value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"}
    common = {value for rdn in cert.get("subject", ()) for kind, value in rdn if kind == "commonName"}
    return frozenset[str](dns | common)


def failure(exc: OSError) -> str:
    """What a TLS error says, in one line: the verification's reason when there is one."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the peer's certificate is not trusted ({exc.verify_message}): is it signed by the group's CA?"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}: are both ends TLS with certificates of the group's CA?"
    return str(exc.strerror or exc)


# --- certificates -------------------------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError("the `openssl` command is not installed: apt-get install openssl") from None
    except subprocess.CalledProcessError as exc:
        raise ConfigError(f"openssl {args[0]} failed: {exc.stderr.decode(errors='replace').strip()}") from None


def _new(path: Path) -> Path:
    if path.exists():
        raise ConfigError(f"{path} exists: certificates are never overwritten; remove it or give another name")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def make_ca(base: Path) -> tuple[Path, Path]:
    """A group CA: `base`.crt and `base`.key (0600), ECDSA P-256, unless they exist (then they are used as they
    are). Returns (crt, key)."""
    crt, key = base.with_name(base.name + ".crt"), base.with_name(base.name + ".key")
    if crt.exists() and key.exists():
        return crt, key
    _key(_new(key))
    _openssl("req", "-new", "-x509", "-key", str(key), "-out", str(_new(crt)), "-days", str(DAYS), "-subj",
             f"/CN={base.name} zeps group CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return crt, key


def make_node(base: Path, ca: tuple[Path, Path], hosts: list[str]) -> tuple[Path, Path]:
    """A node's certificate `base`.crt and key `base`.key (0600), signed by the CA (crt, key); its name is
    `base`'s, and `hosts` (names or addresses) are in it too, for clients that check them (etcd's)."""
    crt, key = _new(base.with_name(base.name + ".crt")), _new(base.with_name(base.name + ".key"))
    names = [base.name, *hosts]
    san = ",".join(f"IP:{h}" if _is_address(h) else f"DNS:{h}" for h in dict.fromkeys(names))
    ext = f"subjectAltName={san}\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
    _key(key)
    with tempfile.TemporaryDirectory() as tmp:
        csr, extfile = Path(tmp, "node.csr"), Path(tmp, "node.ext")
        extfile.write_text(ext)
        _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={base.name}")
        serial = str(Path(tmp, "serial"))  # a random serial per certificate, no file left beside the CA
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
                 "-CAserial", serial, "-out", str(crt), "-days", str(DAYS), "-extfile", str(extfile))  # fmt: skip
    return crt, key


def _key(path: Path) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # owner only before a byte is in it
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
