"""Records on stdout in the format the user picked: json (one object a line), raw (bodies), text (for people)."""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Iterable
from typing import BinaryIO

from gateway.client.snapshot_view import KeyedRecord

FORMATS = ("json", "raw", "text")


def add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="json",
        help='json: {"seq", "ts_ns", "key", "body_b64"[, "ttl_ms"]} a line (default); raw: each body as it is, '
        "then a newline; text: seq, publish time (UTC), key and body (UTF-8, other bytes escaped) a line",
    )


def write_records(records: Iterable[KeyedRecord], out: BinaryIO, fmt: str = "json") -> int:
    """Write records to `out` in `fmt`; returns how many."""
    n = 0
    for rec in records:
        out.write(_LINE[fmt](rec))
        n += 1
    return n


def _json(rec: KeyedRecord) -> bytes:
    line = {"seq": rec.seq, "ts_ns": rec.ts_ns, "key": rec.key, "body_b64": base64.b64encode(rec.body).decode()}
    if rec.ttl_ms:
        line["ttl_ms"] = rec.ttl_ms
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _raw(rec: KeyedRecord) -> bytes:
    return bytes(rec.body) + b"\n"


def _text(rec: KeyedRecord) -> bytes:
    from gateway.journal import iso_utc

    text = bytes(rec.body).decode("utf-8", "backslashreplace")
    body = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"{rec.seq} {iso_utc(rec.ts_ns)} {rec.key} {body}\n".encode()


_LINE = {"json": _json, "raw": _raw, "text": _text}
