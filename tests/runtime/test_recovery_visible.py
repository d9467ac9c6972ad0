"""A supervisor that recovers a crashed store whose consume queues and index are lost:
`mqstore status` says how far it is (not "no supervisor runs"), SIGTERM stops it
promptly with the store left for the next start, which finishes the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from mqstore.engine.commitlog import CommitLog
from mqstore.engine.record import Message
from mqstore.engine.recovery_progress import PROGRESS_FILE
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import DEFAULT_CONFIG, REPO, wait_for

RECORDS = 400_000
QUEUES = 4


def _status(store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", "status", store, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
        check=False,
    )


@pytest.mark.slow
def test_recovery_is_visible_and_answers_sigterm(make_store: StoreFactory) -> None:
    st = make_store({"flush_disk_type": "ASYNC_FLUSH"}, start=False)
    log = CommitLog.open(st.path / "commitlog", DEFAULT_CONFIG["segment_size_bytes"])
    for i in range(RECORDS):
        assert log.append(Message("t", b"m" * 16, {}, queue_id=i % QUEUES)).ok
    end = log.max_offset()
    log.close()
    (st.path / "abort").write_bytes(b"")  # a crash, and the queues and index are gone
    assert not (st.path / "consumequeue").exists() and not (st.path / "index").exists()
    st.start(wait=False)
    assert st.proc is not None
    progress = st.path / PROGRESS_FILE
    wait_for(progress.exists, 60, "the recovery's progress file")
    os.kill(st.proc.pid, signal.SIGSTOP)  # hold it mid-recovery while we look
    try:
        assert progress.exists(), "recovery finished before it could be looked at"
        out = _status(str(st.path))
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("recovering: "), out.stdout
        assert f"(supervisor pid {st.proc.pid})" in out.stdout
        doc = json.loads(_status(str(st.path), "--json").stdout)
        assert doc["state"] == "recovering" and doc["recovering"]["pid"] == st.proc.pid
        assert 0 < doc["recovering"]["done_bytes"] <= doc["recovering"]["total_bytes"]
        os.kill(st.proc.pid, signal.SIGTERM)
    finally:
        os.kill(st.proc.pid, signal.SIGCONT)
    assert st.proc.wait(30) == 0, st.output()
    assert st.stop() == 0  # it exited already: this only collects it
    assert "stopped while" in st.output()
    assert (st.path / "abort").exists() and not progress.exists()
    # the next start recovers again and finishes
    st.start()
    report = json.loads((st.path / "recovery.json").read_text())
    assert report["end_offset"] == end and report["mode"] == "abnormal"
    per_queue = RECORDS // QUEUES
    assert report["queue_offsets"] == {f"t/{q}": per_queue for q in range(QUEUES)}
    out = _status(str(st.path), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["positions"]["flushed"] == end
    assert st.stop() == 0
