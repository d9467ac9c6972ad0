"""The short version of tests/reliability/test_retries.py for the normal suite: the same
faults (flusher SIGSTOPped past the flush timeout, supervisor SIGKILLed and restarted
between a put and its retry) over 2,000 messages (the first two cycles at once: a stop,
then a stop and a kill); each stored exactly once."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from mqstore import StoreClient
from tests.reliability.test_retries import run_retry_faults
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for


def test_retried_puts_are_stored_once_short(make_store: StoreFactory, tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(1 << 32)
    figures = run_retry_faults(make_store, tmp_path, seed, 2000)
    assert figures["lost"] == figures["duplicates"] == 0
    assert figures["supervisor kills"] >= 1 and figures["first tries not PUT_OK"] > 0, figures


def test_get_finds_a_message_by_its_uniq_key(store: Store) -> None:
    """`mqstore get DIR --topic T --uniq-key ID` finds the message through the index, and
    only the one whose UNIQ_KEY is ID (not one whose KEYS carry the same string)."""
    with StoreClient.attach(store.path) as client:
        r = client.put("T", b"by-id", keys=["other"])
        decoy = client.put("T", b"decoy", keys=[r.uniq_key])
        assert r.ok and decoy.ok and len(r.uniq_key) == 32
        twice = client.put_until_ok("T", b"by-id", properties={"UNIQ_KEY": r.uniq_key})
        assert twice.physical_offset == r.physical_offset and twice.reason.startswith("dup")

    def get(key: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mqstore", "get", str(store.path), "--topic", "T",
             "--uniq-key", key],
            capture_output=True, text=True, cwd=str(REPO), timeout=120,
        )  # fmt: skip

    got = wait_for(lambda: (g := get(r.uniq_key)).returncode == 0 and g, 60, "the index")
    rows = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
    assert [(x["physical_offset"], x["properties"]["UNIQ_KEY"]) for x in rows] == [
        (r.physical_offset, r.uniq_key)
    ]
    missing = get("0" * 32)
    assert missing.returncode == 1 and "UNIQ_KEY" in missing.stderr
