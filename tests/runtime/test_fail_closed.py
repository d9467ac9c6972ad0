"""Fail closed (issue 15): a `StoreIOError` in any worker turns the store read-only with
the reason in status, and the worker is not restarted into the same failure. Before,
every `pwrite` of the committer failing under ASYNC puts made it crash and restart over
and over, `committed` stayed 0, the flags said `running` and every put said PUT_OK."""

from __future__ import annotations

import pytest

from mqstore import PutMessageStatus, StoreClient
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for

# (worker, syscall, errno): each worker's own writes; ENOSPC and EIO on the log's write.
CASES = [
    ("committer", "pwrite", "EIO"),
    ("committer", "pwrite", "ENOSPC"),
    ("allocator", "fallocate", "EIO"),
]


@pytest.mark.parametrize(("worker", "op", "err"), CASES)
def test_an_io_error_in_a_worker_makes_the_store_read_only(
    make_store: StoreFactory, worker: str, op: str, err: str
) -> None:
    st = make_store(
        {"flush_disk_type": "ASYNC_FLUSH"},
        env={"MQSTORE_FAULTS": f"{op}:{err}", "MQSTORE_FAULTS_FOR": worker},
    )
    st.wait_workers_running()
    body = b"x" * 16384
    with StoreClient.attach(st.path) as client:

        def refused() -> bool:
            r = client.put("t", body, queue_id=0)
            return r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "read-only" in r.reason

        # enough data to need a commit and new segments (1 MiB each)
        wait_for(refused, 120, f"puts refused after {worker} {op} {err}")
    doc = wait_for(
        lambda: (d := st.status()).get("read_only_reason") and d, 60, "the reason in status"
    )
    assert "read_only" in doc["flags"], doc["flags"]
    assert worker in doc["read_only_reason"] and op in doc["read_only_reason"], doc
    row = next(w for w in doc["workers"] if w["name"] == worker)
    assert (row["state"], row["restarts"], row["last_exit"]) == ("halted", 0, 6), row
    others = [w for w in doc["workers"] if w["name"] != worker]
    assert all(w["restarts"] == 0 for w in others), others
    assert st.stop() == 5  # FLUSH_FAILED: not everything reserved reached the disk
    assert (st.path / "abort").exists()


def test_the_reason_is_in_metrics_and_the_supervisors_words(make_store: StoreFactory) -> None:
    """The metrics name the failure (worker, syscall, errno) and so does the supervisor's
    log, at the failure and at the stop; before, any IO_FAILED was "read-only after a
    failed fsync", and the metrics had only the flag."""
    from tests.runtime.test_metrics import _free_port, _scrape, _v

    port = _free_port()
    st = make_store(
        {"flush_disk_type": "ASYNC_FLUSH", "metrics_port": port},
        env={"MQSTORE_FAULTS": "pwrite:EIO", "MQSTORE_FAULTS_FOR": "committer"},
    )
    labels = {"worker": "", "op": "", "errno": ""}
    assert _v(_scrape(port), "mqstore_read_only", **labels) == 0.0
    with StoreClient.attach(st.path) as client:
        wait_for(lambda: client.put("t", b"x" * 16384).status is not PutMessageStatus.PUT_OK,
                 120, "the committer's pwrite to fail")  # fmt: skip
    wait_for(lambda: st.status().get("read_only"), 60, "the reason in status")
    labels = {"worker": "committer", "op": "pwrite", "errno": "EIO"}
    assert _v(_scrape(port), "mqstore_read_only", **labels) == 1.0
    assert st.stop() == 5
    out = st.output()
    assert "committer exited with 6 (IO_FAILED); the store is read-only" in out, out
    assert "after a failed fsync" not in out
    assert "the store is read-only (committer: pwrite " in out, out
