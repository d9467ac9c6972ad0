"""Fault seam at the runtime level: fsync or pwrite raise EIO or ENOSPC inside the worker
that does them (MQSTORE_FAULTS through the engine/fileio seam, after some successful
calls). The store turns read-only, every waiter gets an error, nothing is acknowledged
falsely (every PUT_OK that waited for the flush is in the log after a clean restart),
the processes live on, and `mqstore status` says the store is read-only."""

from __future__ import annotations

import threading

import pytest

from mqstore import PutMessageStatus, StoreClient
from tests.reliability.conftest import FIGURES
from tests.reliability.workload import message
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for

CASES = [
    ("fdatasync", "EIO", "flusher"),
    ("fdatasync", "ENOSPC", "flusher"),
    ("pwrite", "EIO", "flusher"),  # under SYNC_FLUSH the flusher commits the pool
    ("pwrite", "ENOSPC", "flusher"),
]


@pytest.mark.parametrize(("op", "err", "worker"), CASES)
def test_io_fault_turns_the_store_read_only(
    make_store: StoreFactory, op: str, err: str, worker: str
) -> None:
    env = {"MQSTORE_FAULTS": f"{op}:{err}", "MQSTORE_FAULTS_FOR": worker,
           "MQSTORE_FAULTS_AFTER": "3"}  # fmt: skip
    st = make_store(env=env)
    acked: dict[int, int] = {}  # waited for the flush: must survive
    unwaited: dict[int, int] = {}  # wait_store=False: may be lost to the failed disk
    failed: list[PutMessageStatus] = []
    lock = threading.Lock()

    def produce(t: int) -> None:
        with StoreClient.attach(st.path) as c:
            for i in range(t * 1000, t * 1000 + 300):
                wait = i % 3 != 0
                r = c.put(**message("flt", i), wait_store=wait)  # type: ignore[arg-type]
                with lock:
                    if r.ok:
                        (acked if wait else unwaited)[i] = r.physical_offset
                    else:
                        failed.append(r.status)
                        if r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE:
                            return

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failed, f"no put failed under {op}:{err} in the {worker}"
    assert set(failed) <= {
        PutMessageStatus.FLUSH_DISK_FAILED,
        PutMessageStatus.SERVICE_NOT_AVAILABLE,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
    }, failed
    doc = wait_for(lambda: "read_only" in st.status()["flags"] and st.status(), 30, "read-only")
    assert all(w["restarts"] == 0 for w in doc["workers"]), doc["workers"]
    with StoreClient.attach(st.path) as c:
        r = c.put("t", b"refused")
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "read-only" in r.reason
    st.stop()  # exits non-zero (something was not flushed), leaves abort
    st.start(env={})  # the disk is "fixed": recovery at start
    st.stop()
    recs = {r.physical_offset: r for r in st.read_log()}
    for i, off in acked.items():
        want = message("flt", i)
        assert off in recs and recs[off].body == want["body"], f"acknowledged {i} lost"
    # docs/durability.md: a put that did not wait is in memory only, so a write the disk
    # refused may take it (the pool dies with the store); it is counted, not failed.
    lost = [i for i, off in unwaited.items() if off not in recs]
    FIGURES[f"faults injected: {op}:{err}"] += 1
    FIGURES["acknowledged messages checked (faults)"] += len(acked)
    FIGURES["unwaited acknowledged lost to I/O faults (allowed)"] += len(lost)
