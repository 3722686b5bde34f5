"""Keys without a network: stream key tags, the verifier, key files, CURVE key files, `zeps keygen`."""

from __future__ import annotations

import hashlib
import hmac
import logging
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.errors import AuthError, McastError, Unauthenticated
from gateway.transport.curve import (
    CurveClientKeys,
    CurveServerKeys,
    client_keys,
    create_curve_certificates,
    server_keys,
)
from gateway.wire import batch as B
from gateway.wire.heartbeat import Heartbeat
from gateway.wire.streamkey import AUTH, StreamKey, Verifier, message

STREAM = b"md.eq"


def batch() -> bytes:
    return B.encode(41, [(7, b"eu.fr", b"body one"), (8, b"us.ny", b"body two")], ts_ns=9)


def test_the_tag_is_truncated_hmac_sha256_of_label_stream_and_payload() -> None:
    key = StreamKey(bytes(range(32)))
    payload = batch()
    mac = hmac.new(key.secret, b"zeps-mcast-v1\0" + bytes([len(STREAM)]) + STREAM + payload, hashlib.sha256)
    assert key.tag(STREAM, payload) == mac.digest()[:16]
    frames = key.frames(STREAM, payload)
    assert frames[:2] == (STREAM, payload)
    assert AUTH.unpack(frames[2]) == (b"ZA", 1, key.id, mac.digest()[:16])
    assert message(None, STREAM, payload) == (STREAM, payload)
    assert message(key, STREAM, payload) == frames


def test_any_change_to_stream_payload_or_tag_is_refused() -> None:
    key = StreamKey.generate()
    verifier = Verifier(STREAM.decode(), [key])
    for payload in (batch(), Heartbeat(10**6, 5, "tcp://10.0.0.2:5580", 7).encode()):
        stream, _, auth = key.frames(STREAM, payload)
        assert verifier.open([stream, payload, auth]) == payload
        for i in range(len(payload)):  # every byte: the header with its sequences, the records, the heartbeat
            mutated = bytearray(payload)
            mutated[i] ^= 0x01
            with pytest.raises(Unauthenticated) as refused:
                verifier.open([stream, bytes(mutated), auth])
            assert refused.value.kind == "bad-tag"
        for i in range(AUTH.size - 16, AUTH.size):
            mutated = bytearray(auth)
            mutated[i] ^= 0x80
            with pytest.raises(Unauthenticated):
                verifier.open([stream, payload, bytes(mutated)])
        with pytest.raises(Unauthenticated):  # signed for one stream, presented as another
            Verifier("md.fx", [key]).open([b"md.fx", payload, auth])


def test_a_keyed_verifier_refuses_unsigned_foreign_and_malformed_messages() -> None:
    key, other = StreamKey.generate(), StreamKey.generate()
    verifier = Verifier(STREAM.decode(), [key])
    payload = batch()
    cases = {
        "unsigned": [STREAM, payload],
        "unknown-key": list(other.frames(STREAM, payload)),
        "malformed": [STREAM, payload, b"ZA\x01"],
    }
    for kind, frames in cases.items():
        with pytest.raises(Unauthenticated) as refused:
            verifier.open(frames)
        assert refused.value.kind == kind
    bad_magic = b"XX" + key.frames(STREAM, payload)[2][2:]
    with pytest.raises(Unauthenticated, match="magic"):
        verifier.open([STREAM, payload, bad_magic])
    with pytest.raises(McastError, match="2 or 3 frames"):
        verifier.open([STREAM, payload, b"", b""])


def test_two_keys_during_a_rotation() -> None:
    old, new = StreamKey.generate(), StreamKey.generate()
    assert old.id != new.id
    verifier = Verifier(STREAM.decode(), [old, new])
    payload = batch()
    assert verifier.open(old.frames(STREAM, payload)) == payload
    assert verifier.open(new.frames(STREAM, payload)) == payload
    with pytest.raises(Unauthenticated):
        Verifier(STREAM.decode(), [new]).open(old.frames(STREAM, payload))


def test_each_kind_of_failure_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    key = StreamKey.generate()
    verifier = Verifier(STREAM.decode(), [key])
    payload = batch()
    with caplog.at_level(logging.WARNING, logger="gateway.wire.streamkey"):
        for _ in range(5):
            for frames in ([STREAM, payload], [STREAM, payload, AUTH.pack(b"ZA", 1, key.id, bytes(16))]):
                with pytest.raises(Unauthenticated):
                    verifier.open(frames)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "unsigned" in messages[0] and "--stream-key" in messages[0]
    assert f"does not match key {key.id:08x}" in messages[1]


def test_without_a_key_signed_and_unsigned_messages_pass_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    key = StreamKey.generate()
    verifier = Verifier(STREAM.decode())
    payload = batch()
    with caplog.at_level(logging.WARNING, logger="gateway.wire.streamkey"):
        assert verifier.open([STREAM, payload]) == payload
        for _ in range(3):
            assert verifier.open(key.frames(STREAM, payload)) == payload
    assert [r.getMessage() for r in caplog.records] == [
        f"the multicast feed of md.eq is signed (key {key.id:08x}) but no stream key is configured here: its "
        "messages are NOT verified; give --stream-key FILE"
    ]


def test_the_key_id_is_derived_and_the_secret_never_shown() -> None:
    secret = bytes(range(100, 132))
    key = StreamKey(secret)
    assert key.id == int.from_bytes(hashlib.sha256(b"zeps-key-id\0" + secret).digest()[:4], "little")
    assert secret.hex() not in repr(key) and repr(key) == f"StreamKey(id={key.id:08x})"
    copy = pickle.loads(pickle.dumps(key))
    assert copy.secret == secret and copy.tag(STREAM, b"x") == key.tag(STREAM, b"x")
    for size in (15, 65):
        with pytest.raises(AuthError, match="16 to 64 bytes"):
            StreamKey(bytes(size))


def test_key_files_round_trip_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "stream.key"
    key = StreamKey.generate()
    key.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith(f"# zeps stream key {key.id:08x}")
    assert StreamKey.load(path).secret == key.secret
    with pytest.raises(AuthError, match="exists: remove it first"):
        StreamKey.generate().save(path)
    b64 = tmp_path / "b64.key"
    b64.write_text("# a comment\n\n" + "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n")
    b64.chmod(0o600)
    assert StreamKey.load(b64).secret == bytes(range(32))


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "not found: create it with `zeps keygen --stream-key"),
        ("", "must hold one line of hex or base64, found 0 lines"),
        ("00" * 32 + "\n" + "11" * 32, "found 2 lines"),
        ("not a key!", "neither hex nor base64"),
        ("00" * 8, "16 to 64 bytes, not 8"),
        (b"\xff\xfe", "cannot be read"),
    ],
)
def test_key_file_errors_say_what_to_do(tmp_path: Path, content: str | bytes | None, error: str) -> None:
    path = tmp_path / "stream.key"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(AuthError, match=error.replace("(", r"\(").replace("`", ".")) as refused:
        StreamKey.load(path)
    assert str(path) in str(refused.value)


def test_a_key_file_others_can_read_is_used_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "stream.key"
    path.write_text("ab" * 32)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="gateway.wire.streamkey"):
        StreamKey.load(path)
    assert f"chmod 600 {path}" in caplog.text


def test_curve_certificates_and_their_errors(tmp_path: Path) -> None:
    server_pub, server_sec = create_curve_certificates(tmp_path / "keys" / "server")
    _, client_sec = create_curve_certificates(tmp_path / "allow" / "client")
    assert stat.S_IMODE(server_sec.stat().st_mode) == 0o600
    assert stat.S_IMODE(server_pub.stat().st_mode) == 0o644
    with pytest.raises(AuthError, match="exists"):
        create_curve_certificates(tmp_path / "keys" / "server")

    server = CurveServerKeys.load(server_sec, tmp_path / "allow")
    assert server.clients == 1 and server.secret.decode() not in repr(server)
    client = CurveClientKeys.load(client_sec, server_pub)
    assert client.server == server.public and client.secret.decode() not in repr(client)
    assert server_keys(None, None) is None and client_keys(None, None) is None

    (tmp_path / "empty").mkdir()
    errors = {
        "holds no secret key: pass NAME.key_secret": lambda: CurveServerKeys.load(server_pub, tmp_path / "allow"),
        "is missing or not a ZeroMQ certificate": lambda: CurveServerKeys.load(tmp_path / "nope", tmp_path / "allow"),
        "no client public keys": lambda: CurveServerKeys.load(server_sec, tmp_path / "empty"),
        "is not a directory": lambda: CurveServerKeys.load(server_sec, tmp_path / "missing"),
        "holds the server's SECRET key": lambda: CurveClientKeys.load(client_sec, server_sec),
        "--curve-secret FILE and --curve-allow DIR go together": lambda: server_keys(str(server_sec), None),
        "--curve-key FILE and --curve-server FILE go together": lambda: client_keys(None, str(server_pub)),
    }
    for error, load in errors.items():
        with pytest.raises(AuthError, match=error):
            load()
    garbled = tmp_path / "garbled.key_secret"
    garbled.write_text(server_sec.read_text().replace('public-key = "', 'public-key = "~'))
    with pytest.raises(AuthError, match="malformed key"):
        CurveServerKeys.load(garbled, tmp_path / "allow")


def zeps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60)


def test_keygen_command(tmp_path: Path) -> None:
    done = zeps("keygen", "--stream-key", str(tmp_path / "s.key"), "--curve", str(tmp_path / "certs" / "gw"))
    assert done.returncode == 0, done.stderr
    key = StreamKey.load(tmp_path / "s.key")
    assert f"stream key {key.id:08x} written" in done.stdout
    CurveServerKeys.load(tmp_path / "certs" / "gw.key_secret", tmp_path / "certs")
    again = zeps("keygen", "--stream-key", str(tmp_path / "s.key"))
    assert again.returncode == 2 and "exists: remove it first" in again.stderr
    assert StreamKey.load(tmp_path / "s.key").secret == key.secret  # never overwritten
    none = zeps("keygen")
    assert none.returncode == 2 and "give --stream-key FILE, --curve DIR/NAME or --tls-ca DIR/CA" in none.stderr
    missing = zeps("gateway", "--stream", "s", "--journal", str(tmp_path / "j"), "--ingest", "tcp://127.0.0.1:1",
                   "--stream-key", str(tmp_path / "nope.key"))  # fmt: skip
    assert missing.returncode == 2 and "not found: create it with `zeps keygen --stream-key" in missing.stderr
