"""`--body text|base64|hex` on `dump`, `get`, `query` and `tail`, through the real
commands against a real running store: text where the body is valid UTF-8, base64 where
it is not (and `body_encoding` says which), the bytes always given back exactly."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

import pytest

from mqstore.ipc.client import StoreClient
from mqstore.ipc.reads import for_client
from tests.runtime.harness import REPO, Store, wait_for

TEXT = "zürich 42 \u2603".encode()
BINARY = b"\xff\xfe\x00\x81 not utf-8"


def _cli(*args: str) -> list[dict[str, Any]]:
    p = subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


@pytest.fixture
def two_bodies(store: Store) -> Store:
    with StoreClient.attach(store.path) as c, for_client(c) as reads:
        assert c.put("bf", TEXT, keys=["k-text"], queue_id=0).ok
        assert c.put("bf", BINARY, keys=["k-bin"], queue_id=0).ok
        wait_for(lambda: reads.max_offset("bf", 0) == 2, 30, "dispatch")
    return store


def _printed(store: Store, fmt: list[str]) -> dict[str, list[tuple[str, str]]]:
    """(body, body_encoding) of TEXT then BINARY, as each command prints them."""
    d = str(store.path)
    got = {
        "dump": _cli("dump", d, *fmt),
        "get": _cli("get", d, "--topic", "bf", "--queue", "0", "--offset", "0", "--limit", "2",
                    *fmt),
        "query": _cli("query", d, "--topic", "bf", "--key", "k-text", *fmt)
        + _cli("query", d, "--topic", "bf", "--key", "k-bin", *fmt),
        "tail": _cli("tail", d, "--topic", "bf", "--from-beginning", "--limit", "2", *fmt),
    }  # fmt: skip
    return {cmd: [(r["body"], r["body_encoding"]) for r in recs] for cmd, recs in got.items()}


def test_text_is_the_default_and_falls_back_to_base64(two_bodies: Store) -> None:
    want = [(TEXT.decode(), "text"), (base64.b64encode(BINARY).decode(), "base64")]
    for cmd, got in _printed(two_bodies, []).items():
        assert got == want, cmd
    for cmd, got in _printed(two_bodies, ["--body", "text"]).items():
        assert got == want, cmd


@pytest.mark.parametrize("fmt", ["base64", "hex"])
def test_base64_and_hex_are_always_that(two_bodies: Store, fmt: str) -> None:
    def enc(b: bytes) -> str:
        return base64.b64encode(b).decode() if fmt == "base64" else b.hex()

    want = [(enc(TEXT), fmt), (enc(BINARY), fmt)]
    for cmd, got in _printed(two_bodies, ["--body", fmt]).items():
        assert got == want, cmd


def test_an_unknown_body_format_is_refused(two_bodies: Store) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "mqstore", "dump", str(two_bodies.path), "--body", "utf16"],
        capture_output=True, text=True, cwd=str(REPO), timeout=120,
    )  # fmt: skip
    assert p.returncode == 2 and "invalid choice" in p.stderr and not p.stdout
