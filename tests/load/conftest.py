"""The load suite's shared store: one supervisor for the whole session.

Run as `pytest -n 4 tests/load`. The controlling process (the xdist controller, or the
only process without xdist) starts one real supervisor in `pytest_configure`, before
any xdist worker exists, and hands its directory to every worker through the
environment (`MQSTORE_LOAD_DIR`). Each test appends what was acknowledged to a JSON-lines
file per worker. In `pytest_sessionfinish` the controller stops the supervisor (it must
exit 0) and checks the log against every acknowledgement:

* every acknowledged message is in the log exactly once, at its offset, with its
  topic, queue, queue offset and body;
* physical offsets chain without gaps (a BLANK may end a segment);
* queue offsets are dense from 0 per (topic, queue) (fillers included);
* no shared memory of the store is left.

A failed check fails the session (exit status 1) with the reason printed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest

from mqstore.engine.reader import StoreReader
from mqstore.engine.record import DecodedRecord
from mqstore.ipc.producer import host_ip
from tests.conftest import note_store_dirs
from tests.native.uniq_reference import month_bounds, parse
from tests.runtime.harness import Store, check_chain

ENV_DIR = "MQSTORE_LOAD_DIR"
LOAD_CONFIG = {
    "segment_size_bytes": 1 << 20,
    "transient_store_pool_size": 3,
    "flush_disk_type": "SYNC_FLUSH",
    "sync_flush_timeout_ms": 30000,
}

_store: Store | None = None
_root: Path | None = None


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    global _store, _root
    if not _is_controller(config) or os.environ.get(ENV_DIR):
        return
    _root = Path(tempfile.mkdtemp(prefix="mqstore-load-"))
    _store = Store(_root / "store", LOAD_CONFIG)
    (_root / "acks").mkdir()
    _store.start()
    os.environ[ENV_DIR] = str(_root)


def _verify(store: Store, acks_dir: Path) -> list[str]:
    problems: list[str] = []
    acks: list[dict[str, Any]] = []
    for f in sorted(acks_dir.glob("*.jsonl")):
        acks.extend(json.loads(line) for line in f.read_text().splitlines() if line)
    records = store.read_log(keep_fillers=True)
    try:
        check_chain(records, int(LOAD_CONFIG["segment_size_bytes"]))
    except AssertionError as e:
        problems.append(f"log chain: {e}")
    by_offset = {r.physical_offset: r for r in records}
    body_count: dict[bytes, int] = {}
    for r in records:
        body_count[r.body] = body_count.get(r.body, 0) + 1
    for a in acks:
        body = a["key"].encode() * a["repeat"]
        rec = by_offset.get(a["offset"])
        if rec is None:
            problems.append(f"acknowledged message {a['key']} missing at {a['offset']}")
            continue
        got = (rec.topic, rec.queue_id, rec.queue_offset, rec.body, rec.msg_id)
        want = (a["topic"], a["queue_id"], a["queue_offset"], body, a["msg_id"])
        if got != want:
            problems.append(f"message {a['key']}: on disk {got[:3]}, acknowledged {want[:3]}")
        if body_count.get(body, 0) != 1:
            problems.append(f"message {a['key']} is in the log {body_count.get(body, 0)} times")
        problems += _uniq_problems(a, rec)
        if len(problems) > 20:
            break
    if not acks:
        problems.append("no acknowledgement was recorded: the load tests did not run")
    with StoreReader.open(store.path) as rd:  # found through the index by its UNIQ_KEY
        for a in random.Random(len(acks)).sample(acks, min(200, len(acks))):
            hits = rd.query_by_key(a["topic"], a["uniq_key"], 8)
            found = [
                h.physical_offset for h in hits if h.properties.get("UNIQ_KEY") == a["uniq_key"]
            ]
            if found != [a["offset"]]:
                problems.append(f"UNIQ_KEY {a['uniq_key']} of {a['key']}: index finds {found}")
    print(f"\nmqstore load: {len(acks)} acknowledged messages checked against "
          f"{len(records)} records")  # fmt: skip
    return problems


def _uniq_problems(a: dict[str, Any], rec: DecodedRecord) -> list[str]:
    """The record carries the UNIQ_KEY its PUT_OK named, a MessageClientIDSetter id of this
    host (tests/native/uniq_reference.py parses as RocketMQ does) made this month."""
    key = rec.properties.get("UNIQ_KEY", "")
    if key != a["uniq_key"] or len(key) != 32:
        return [f"message {a['key']}: UNIQ_KEY {key!r}, acknowledged {a['uniq_key']!r}"]
    ip, _pid, _hash, span, _n = parse(key)
    start, _next = month_bounds(rec.born_timestamp)
    if ip != socket.inet_ntoa(host_ip()) or abs(start + span - rec.born_timestamp) > 1000:
        return [f"message {a['key']}: UNIQ_KEY {key} says {ip}, {start + span}"]
    return []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _store
    if _store is None or not _is_controller(session.config) or _root is None:
        return
    store, _store = _store, None
    note_store_dirs(_root)  # the root conftest cleans up what a failed stop left
    code = store.stop()
    problems = [] if code == 0 else [f"supervisor exited with {code}: {store.output()[-2000:]}"]
    problems += _verify(store, _root / "acks")
    left = store.shm_leftovers()
    if left:
        problems.append(f"shared memory left behind: {left}")
    if problems:
        print("\nmqstore load verification FAILED:\n  " + "\n  ".join(problems))
        print(f"store kept at {store.path}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        shutil.rmtree(_root, ignore_errors=True)


@pytest.fixture(scope="session")
def load_root() -> Path:
    root = os.environ.get(ENV_DIR)
    assert root, "the load suite's controller did not start a store"
    return Path(root)
