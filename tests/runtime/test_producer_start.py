"""A producer process's whole life (import, attach, the README's sync put, close) loads
neither the read side nor `dataclasses` and what it imports: each was part of every
producer's start (~75M instructions together, bench/results/client_start.md), paid by the
64 clients of the sync checks starting beside the ones already putting. A real store and a
real client process; the put must be PUT_OK."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.runtime.harness import Store

NOT_LOADED = (
    "mqstore.ipc.reads",
    "mqstore.ipc.read_results",
    "mqstore.engine.get_result",
    "mqstore.engine.record_decode",
    "dataclasses",
    "inspect",
    "ast",
    "dis",
    "tokenize",
)

PRODUCER = """
import json, sys
from mqstore import PutMessageStatus, StoreClient
with StoreClient.attach(sys.argv[1]) as client:
    r = client.put("orders", b"...", tags="new", keys=["o-17"])
    status = r.status is PutMessageStatus.PUT_OK
print(json.dumps([status, [m for m in sys.argv[2:] if m in sys.modules]]))
"""


def test_a_producer_attaches_puts_and_closes_without_the_read_side(store: Store) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PRODUCER, str(store.path), *NOT_LOADED],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    ok, loaded = json.loads(out.stdout)
    assert ok is True
    assert loaded == []
