"""How the reading commands (`dump`, `get`, `query`, `tail`; `pipeline query` too) print
records: one JSON object per line, the body encoded as `--body` asks.

    --body text     the body as a string where it is valid UTF-8, else base64 (default)
    --body base64   always base64
    --body hex      always lowercase hex

Every object says which encoding its body got in `body_encoding` ("text", "base64" or
"hex"), so a reader decodes each line without guessing: with `--body text`, a body that
is not valid UTF-8 is printed as base64 and says so, never altered.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterable
from typing import Any

from mqstore.engine.record_decode import RecordFields

BODY_FORMATS = ("text", "base64", "hex")


def add_body_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--body",
        choices=BODY_FORMATS,
        default="text",
        help="body encoding: text where it is valid UTF-8, else base64 (default); "
        "base64; or hex. Each line's body_encoding says which it got",
    )


def encode_body(body: bytes, body_format: str) -> tuple[str, str]:
    """(encoded body, the encoding used) for one of BODY_FORMATS."""
    if body_format == "text":
        try:
            return body.decode("utf-8"), "text"
        except UnicodeDecodeError:
            body_format = "base64"
    if body_format == "hex":
        return body.hex(), "hex"
    if body_format != "base64":
        raise ValueError(f"body format must be one of {BODY_FORMATS}, not {body_format!r}")
    return base64.b64encode(body).decode("ascii"), "base64"


def record_json(rec: RecordFields, body_format: str) -> dict[str, Any]:
    """`rec.to_json_dict()` with its body in `body_format` and `body_encoding` after it,
    and `compression`: the codec the body was stored with (null: as given). The body is
    the original bytes (every read inflates a compressed one)."""
    out: dict[str, Any] = {}
    for k, v in rec.to_json_dict().items():
        if k == "body":
            out["body"], out["body_encoding"] = encode_body(bytes(rec.body), body_format)
            out["compression"] = rec.compression
        else:
            out[k] = v
    return out


def print_records(recs: Iterable[RecordFields], body_format: str) -> int:
    """One JSON object per line on stdout; returns how many were printed."""
    n = 0
    out = sys.stdout
    for rec in recs:
        out.write(json.dumps(record_json(rec, body_format), ensure_ascii=False))
        out.write("\n")
        n += 1
    out.flush()
    return n
