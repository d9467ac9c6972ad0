"""The dispatcher process in a running store: consume queues and index follow the log,
up to the flushed offset under SYNC_FLUSH and the committed one under ASYNC_FLUSH; it
survives being killed and a crash of the whole store, without duplicates or holes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mqstore import PutMessageStatus, StoreClient
from mqstore.conf.load import load_settings
from mqstore.engine.reader import GetStatus, StoreReader
from mqstore.ipc.commit import pid_alive
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for

OK = PutMessageStatus.PUT_OK


def _dispatched_up_to_flushed(st: Store) -> bool:
    pos = st.status()["positions"]
    return bool(pos["dispatched"] == pos["flushed"] == pos["reserved"])


def _pull_all(path: Path, topic: str, queue_id: int) -> list[Any]:
    reader = StoreReader.open(path, load_settings(path).settings)
    try:
        out: list[Any] = []
        offset = 0
        while True:
            got = reader.get_messages(topic, queue_id, offset, 32)
            if got.status is not GetStatus.FOUND or not got.messages:
                return out
            out.extend(got.messages)
            offset = got.next_offset
    finally:
        reader.close()


def _put_many(st: Store, n: int, tag: str) -> list[Any]:
    with StoreClient.attach(st.path) as client:
        rs = [
            client.put("orders", f"{tag}-{i}".encode(), keys=[f"{tag}-k{i}"], queue_id=i % 2)
            for i in range(n)
        ]
    assert all(r.status is OK for r in rs), {r.reason for r in rs}
    return rs


def test_queues_and_index_follow_a_sync_store(make_store: StoreFactory) -> None:
    st = make_store()
    rs = _put_many(st, 40, "a")
    wait_for(lambda: _dispatched_up_to_flushed(st), 30, "the dispatcher to catch up")
    doc = st.status()
    assert doc["dispatch_lag_bytes"] == 0 and doc["dispatched_records"] >= 40
    # new queues: their first batch is the Python path's, the rest the C round's
    assert 1 <= doc["dispatch_python_batches"] < doc["dispatched_records"], doc
    table = subprocess.run(
        [sys.executable, "-m", "mqstore", "status", str(st.path)],
        capture_output=True, text=True, cwd=str(REPO), timeout=60,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    row = [ln for ln in table.stdout.splitlines() if "dispatch batches by the Python path" in ln]
    assert len(row) == 1 and row[0].split()[-2] == f"{doc['dispatch_python_batches']:,}", row
    for qid in (0, 1):
        got = _pull_all(st.path, "orders", qid)
        want = [r for r in rs if r.queue_id == qid]
        assert [m.physical_offset for m in got] == [r.physical_offset for r in want]
        assert [m.queue_offset for m in got] == list(range(len(want)))
    reader = StoreReader.open(st.path, load_settings(st.path).settings)
    try:
        hits = reader.query_by_key("orders", "a-k7")
        assert [h.body for h in hits] == [b"a-7"]
        assert reader.get_by_msg_id(rs[3].msg_id).body == b"a-3"  # type: ignore[union-attr]
    finally:
        reader.close()
    assert st.stop() == 0


@pytest.mark.slow
def test_killed_dispatcher_resumes_without_duplicates(make_store: StoreFactory) -> None:
    st = make_store({"flush_disk_type": "ASYNC_FLUSH"})
    first = _put_many(st, 30, "b")
    wait_for(lambda: _dispatched_up_to_flushed(st), 30, "the dispatcher to catch up")
    before = next(w for w in st.status()["workers"] if w["name"] == "dispatcher")
    os.kill(before["pid"], signal.SIGKILL)

    def restarted() -> bool:
        w = next(w for w in st.status()["workers"] if w["name"] == "dispatcher")
        # At least one restart: a loaded machine may also see a slow restart killed once.
        return bool(w["restarts"] >= 1 and w["pid"] and w["pid"] != before["pid"])

    wait_for(restarted, 30, "the dispatcher to be restarted")
    second = _put_many(st, 30, "c")
    wait_for(lambda: _dispatched_up_to_flushed(st), 30, "the restarted dispatcher to catch up")
    for qid in (0, 1):
        got = _pull_all(st.path, "orders", qid)
        want = [r for r in first + second if r.queue_id == qid]
        assert [m.physical_offset for m in got] == [r.physical_offset for r in want]
    assert st.stop() == 0


@pytest.mark.slow
def test_crash_of_the_whole_store_recovers_queues_from_the_log(make_store: StoreFactory) -> None:
    st = make_store()
    rs = _put_many(st, 50, "d")  # SYNC_FLUSH: acknowledged means on disk
    assert st.proc is not None
    workers = [w["pid"] for w in st.status()["workers"]]
    st.proc.kill()  # the supervisor dies; its workers follow it
    st.proc.wait()
    st.proc = None
    st._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 30, "workers to exit")
    # Lose the consume queue's tail too, as lost pages leave it (zeros): recovery must
    # rebuild it from the log.
    for f in (st.path / "consumequeue" / "orders" / "1").iterdir():
        with open(f, "r+b") as fh:
            fh.seek(20 * 3)
            fh.write(bytes(20 * 30))
    assert (st.path / "abort").exists()
    st.start()
    report = json.loads((st.path / "recovery.json").read_text())
    assert report["mode"] == "abnormal" and report["end_offset"] >= rs[-1].physical_offset
    for qid in (0, 1):
        got = _pull_all(st.path, "orders", qid)
        want = [r for r in rs if r.queue_id == qid]
        assert [m.physical_offset for m in got] == [r.physical_offset for r in want]
    with StoreClient.attach(st.path) as client:
        nxt = client.put("orders", b"after", queue_id=1)
    assert nxt.status is OK and nxt.queue_offset == 25
    assert st.stop() == 0
    check = subprocess.run(
        [sys.executable, "-m", "mqstore", "check", str(st.path)],
        capture_output=True, text=True, cwd=str(REPO), timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert st.shm_leftovers() == []


def test_status_shows_the_disk_as_the_cleaner_sees_it(make_store: StoreFactory) -> None:
    st = make_store()
    disk = wait_for(lambda: st.status()["cleaner"].get("disk"), 30, "the cleaner's disk check")
    assert disk["disk_full"] is False
    assert 0.0 < disk["ratio"] <= 1.0
    table = subprocess.run(
        [sys.executable, "-m", "mqstore", "status", str(st.path)],
        capture_output=True, text=True, cwd=str(REPO), timeout=60,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "disk used" in table.stdout and "dispatch lag" in table.stdout
    assert st.stop() == 0


def test_a_failed_sync_in_the_flush_thread_makes_the_store_read_only(
    make_store: StoreFactory,
) -> None:
    """The consume-queue flush runs in the dispatcher's flush thread (workers.cq_flusher):
    its failed fdatasync (EIO through the fault seam) still fails the store closed with
    the dispatcher, the syscall, the errno and the queue file in status, the dispatcher
    halted (IO_FAILED) and nothing restarted; messages dispatched before stay readable."""
    st = make_store(
        {  # a flush of whatever is new every 100 ms
            "flush_disk_type": "ASYNC_FLUSH",
            "flush_consume_queue_interval_ms": 100,
            "flush_consume_queue_least_pages": 0,
        },
        env={"MQSTORE_FAULTS": "fdatasync:EIO", "MQSTORE_FAULTS_FOR": "dispatcher"},
    )
    st.wait_workers_running()
    with StoreClient.attach(st.path) as client:
        first = client.put("orders", b"before", keys=["k0"], queue_id=0)
        assert first.status is OK, first
        doc = wait_for(
            lambda: (d := st.status()).get("read_only") and d, 60, "the store to turn read-only"
        )
        r = client.put("orders", b"after", queue_id=0)
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "read-only" in r.reason
    ro = doc["read_only"]
    assert (ro["worker"], ro["op"], ro["errno"]) == ("dispatcher", "fdatasync", "EIO"), ro
    assert f"{os.sep}consumequeue{os.sep}orders{os.sep}0{os.sep}" in ro["path"], ro
    assert "dispatcher" in doc["read_only_reason"] and "fdatasync" in doc["read_only_reason"]

    def halted() -> dict[str, Any] | None:
        rows = {w["name"]: w for w in st.status()["workers"]}
        return rows if rows["dispatcher"]["state"] == "halted" else None

    rows = wait_for(halted, 30, "the dispatcher to be halted")
    assert (rows["dispatcher"]["restarts"], rows["dispatcher"]["last_exit"]) == (0, 6), rows
    assert all(w["restarts"] == 0 for w in rows.values()), rows
    assert st.stop() == 5  # read-only: the supervisor does not flush, abort stays
    assert [m.body for m in _pull_all(st.path, "orders", 0)] == [b"before"]


def test_async_puts_with_the_pool_are_committed_as_they_arrive_not_per_interval(
    make_store: StoreFactory,
) -> None:
    """RocketMQ's put path wakes the committer after every put: a stream of puts is
    committed (and so dispatched: the limit under ASYNC_FLUSH with the pool) whenever
    `commit_least_pages` are there, and the rest, under a page here, at the committer's
    first tick without new puts; neither waits for an interval (an hour here)."""
    hour = 3_600_000
    st = make_store(
        {
            "flush_disk_type": "ASYNC_FLUSH",
            "commit_interval_ms": hour,
            "commit_thorough_interval_ms": hour,
            "commit_least_pages": 4,
        }
    )
    bodies = [b"%d" % i + b"x" * 4096 for i in range(8)] + [b"small"] * 3
    with StoreClient.attach(st.path) as client:
        for body in bodies:
            assert client.put("arrive", body, queue_id=0).status is OK
        wait_for(lambda: client.max_offset("arrive", 0) == len(bodies), 60, "all dispatched")
    assert [m.body for m in _pull_all(st.path, "arrive", 0)] == bodies


def test_rolls_find_their_files_made_ahead_between_periodic_jobs(
    make_store: StoreFactory,
) -> None:
    """With the periodic consume-queue flush an hour away, the next queue file (once the
    current is half written) and the next index file (once the newest holds a key) are
    still made ahead by the flush thread: the dispatcher looks at the queues it wrote
    and the index every `PREPARE_CHECK_S`. Every roll is then a rename, and the
    dispatcher has no roll to report at stop that made its file in the loop."""
    hour = 3_600_000
    st = make_store(
        {
            "flush_disk_type": "ASYNC_FLUSH",
            "flush_consume_queue_interval_ms": hour,
            "flush_consume_queue_thorough_interval_ms": hour,
            "consume_queue_file_size_bytes": 40 * 20,  # 40 units a file
            "max_hash_slot_num": 16,
            "max_index_num": 64,  # 63 keys a file: a message has two (UNIQ_KEY, its key)
        }
    )
    queue_dir = st.path / "consumequeue" / "ahead" / "0"
    index_next = st.path / "index" / "next.tmp"
    sent = 0

    def put(n: int) -> None:
        nonlocal sent
        with StoreClient.attach(st.path) as client:
            for i in range(sent, sent + n):
                r = client.put("ahead", b"m%d" % i, keys=[f"k{i}"], queue_id=0)
                assert r.status is OK, r
            wait_for(lambda: client.max_offset("ahead", 0) == sent + n, 60, "dispatched")
        sent += n

    def queue_ahead() -> bool:
        return any(p.name.endswith(".next.tmp") for p in queue_dir.iterdir())

    put(1)
    wait_for(index_next.exists, 30, "the next index file made ahead")
    put(24)  # 25 units, past half the queue file; 50 keys
    wait_for(queue_ahead, 30, "the next queue file made ahead")
    put(10)  # 70 keys: the index rolls into next.tmp
    wait_for(index_next.exists, 30, "the index file after it made ahead")
    put(20)  # 55 units: the queue rolls into its file made ahead; 110 keys
    assert st.stop() == 0
    names = sorted(p.name for p in queue_dir.iterdir() if not p.name.endswith(".tmp"))
    assert names == [f"{0:020d}", f"{800:020d}"], names
    assert len([p for p in (st.path / "index").iterdir() if p.name.isdigit()]) == 2
    assert "made their file in the loop" not in st.output(), st.output()
