"""The short version of tests/reliability/test_retries.py for the normal suite: the same
faults (flusher SIGSTOPped past the flush timeout, supervisor SIGKILLed and restarted
between a put and its retry) over 2,000 messages (the first two cycles at once: a stop,
then a stop and a kill); each stored exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mqstore import PutMessageStatus, PutResult, StoreClient, _native
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


def test_a_batch_retried_across_a_flush_timeout_is_stored_once_up_to_the_window(
    make_store: StoreFactory,
) -> None:
    """`put_batch_until_ok` with the flusher stopped past syncFlushTimeout: a batch of
    `IDEM_WINDOW` messages (the puts of a producer the store remembers) answers
    FLUSH_DISK_TIMEOUT, then, retried once the flusher runs, PUT_OK with its first
    results: stored once. One message more is refused (ValueError) before anything is
    stored: the retry of such a batch found its first keys pushed out of the window by
    its own later ones and stored the whole batch again (200 messages retried: 400
    stored)."""
    st = make_store({"sync_flush_timeout_ms": 300})
    st.wait_workers_running()
    flusher = int(next(w for w in st.status()["workers"] if w["name"] == "flusher")["pid"])
    window = _native.IDEM_WINDOW
    with StoreClient.attach(st.path) as client:
        assert client.put("rb", b"warm", queue_id=0).ok
        longer = [{"topic": "rb", "body": b"%d" % i, "queue_id": 0} for i in range(window + 1)]
        with pytest.raises(ValueError, match=f"at most {window} messages"):
            client.put_batch_until_ok(longer)
        tries: list[list[PutResult]] = []
        real_batch = client.put_batch

        def resume_after_a_timeout(messages: Any, **kw: Any) -> list[PutResult]:
            got = real_batch(messages, **kw)
            tries.append(got)
            if got[0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT:
                os.kill(flusher, signal.SIGCONT)
            return got

        client.put_batch = resume_after_a_timeout  # type: ignore[method-assign]
        os.kill(flusher, signal.SIGSTOP)
        try:
            got = client.put_batch_until_ok(longer[:window], timeout_s=30)
        finally:
            os.kill(flusher, signal.SIGCONT)
        assert tries[0][0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT and len(tries) >= 2
        assert all(r.ok and r.reason.startswith("duplicate") for r in got), got[0]
        assert [r.physical_offset for r in got] == [r.physical_offset for r in tries[0]]
        # right after the warm-up put: the refused batch stored nothing
        assert [r.queue_offset for r in got] == list(range(1, window + 1))
        wait_for(lambda: client.max_offset("rb", 0) == 1 + window, 30, "the batch dispatched")
