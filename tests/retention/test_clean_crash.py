"""A clean that fails half way (the consume-queue or index unlink after the commit-log
segments went: what a crash of the cleaner between the two steps leaves), then an
abnormal recovery (`mqstore recover` with `abort` there): every read answers from what
the log still holds. A pull never reads into a deleted segment, each queue's min offset
is its first unit in the log, the queue offsets of the kept messages do not move, and a
key query for a deleted message finds nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore.engine.get_result import GetStatus
from mqstore.engine.reader import StoreReader
from tests.retention.helpers import HOUR_MS, SEG, Clock, set_mtime
from tests.retention.test_with_dispatcher import CQ_FILE, S, _dispatched_store

REPO = Path(__file__).resolve().parents[2]
CONF = (
    "[store]\n"
    f"segment_size_bytes = {SEG}\n"
    f"consume_queue_file_size_bytes = {CQ_FILE}\n"
    f"max_hash_slot_num = {S.max_hash_slot_num}\n"
    f"max_index_num = {S.max_index_num}\n"
)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _written(store: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """key -> (queue id, queue offset, physical offset, body) of every message."""
    with StoreReader.open(store, S) as r:
        out: dict[str, tuple[int, int, int, bytes]] = {}
        for qid in (0, 1):
            res = r.get_messages("T", qid, 0, 1000, max_bytes=1 << 30)
            for m in res.messages:
                assert m.keys is not None
                out[m.keys] = (qid, m.queue_offset, m.physical_offset, bytes(m.body))
        return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# where the clean stops (an injected EIO in unlink): after the 4 expired segments; after
# one queue file too; after every queue file below the new minimum, the index files left
@pytest.mark.parametrize("cut", ["segments-only", "one-queue-file", "no-index"])
def test_a_clean_cut_short_then_abnormal_recovery_reads_only_what_is_left(
    tmp_path: Path, cut: str
) -> None:
    store = tmp_path / "store"
    paths = _dispatched_store(store, 6)
    (store / "mqstore.toml").write_text(CONF)
    before = _written(store)
    assert len(before) > 30
    for p in paths[:4]:  # the walk stops at segment 4, which has not expired
        set_mtime(p, Clock().ms - 100 * HOUR_MS)
    # what a whole clean deletes, on a copy: 4 segments, then queue files, then index
    whole = _cli("clean", str(_copy(store, tmp_path / "copy")),
                 "--now", "--json")  # fmt: skip
    kinds = [d["kind"] for d in json.loads(whole.stdout)["deleted"]]
    n_cq = kinds.count("consumequeue")
    assert kinds[:4] == ["commitlog"] * 4 and n_cq > 1 and kinds.count("index") > 0
    after = 4 + {"segments-only": 0, "one-queue-file": 1, "no-index": n_cq}[cut]
    res = _cli(
        "clean", str(store), "--now", "--json",
        env={"MQSTORE_FAULTS": "unlink:EIO", "MQSTORE_FAULTS_AFTER": str(after)},
    )  # fmt: skip
    assert res.returncode != 0, res.stdout  # the injected EIO stopped the clean
    assert [os.path.exists(p) for p in paths] == [False] * 4 + [True] * 2
    new_min = 4 * SEG
    (store / "abort").touch()  # the cleaner's crash was a crash of the store
    rec = _cli("recover", str(store), "--json")
    assert rec.returncode == 0, rec.stdout + rec.stderr
    report = json.loads(rec.stdout)
    assert report["mode"] == "abnormal" and report["bytes_truncated"] == 0
    kept = {k: v for k, v in before.items() if v[2] >= new_min}
    gone = {k: v for k, v in before.items() if v[2] < new_min}
    assert kept and gone
    with StoreReader.open(store, S) as r:
        assert r.min_log_offset() == new_min
        for qid in (0, 1):
            mine = sorted(v[1] for v in kept.values() if v[0] == qid)
            assert r.min_offset("T", qid) == mine[0]  # the first unit the log holds
            assert r.max_offset("T", qid) == mine[-1] + 1
            low = r.get_messages("T", qid, 0, 32)
            assert not low.messages and low.status is not GetStatus.FOUND
            res_ = r.get_messages("T", qid, mine[0], 1000, max_bytes=1 << 30)
            got = [
                (m.keys, m.queue_offset, m.physical_offset, bytes(m.body)) for m in res_.messages
            ]
            want = sorted(
                ((k, v[1], v[2], v[3]) for k, v in kept.items() if v[0] == qid), key=lambda t: t[1]
            )
            assert got == want
        for key in gone:
            assert r.query_by_key("T", key) == []
        for key, (_qid, _qo, phy, body) in kept.items():
            found = r.query_by_key("T", key)
            assert [(m.physical_offset, bytes(m.body)) for m in found] == [(phy, body)]
    check = _cli("check", str(store))
    assert check.returncode == 0, check.stdout + check.stderr
    # the next clean deletes the queue and index files the cut-short one left
    left = [d["path"] for d in json.loads(whole.stdout)["deleted"]][after:]
    again = _cli("clean", str(store), "--now", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(not os.path.exists(p.replace(str(tmp_path / "copy"), str(store))) for p in left)
