"""The dispatcher's flush thread (`workers.cq_flusher`), in this process on real files:
jobs planned from a real dispatcher, forced by the thread, the checkpoint's contract
(never past what was forced), and a failed sync raised in the dispatching thread with
no checkpoint written. The whole store's side is in test_dispatch.py (read-only with
the reason) and tests/reliability/test_power_loss.py (the checkpoint after a power cut).
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.engine import fileio
from mqstore.engine.checkpoint import CheckpointFields, StoreCheckpoint
from mqstore.engine.commitlog import AppendResult
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.indexservice import IndexService
from mqstore.workers.cq_flusher import FlushThread, plan_job, run_job
from tests.engine.storebuild import CQ_FILE, ENTRIES, SLOTS, open_log, write_messages
from tests.runtime.harness import wait_for

PHYSIC = 1_800_000_000_000


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


class Parts:
    """A log of `n` messages over 3 queues, a dispatcher as the dispatcher process opens
    it (index rolls deferred), its in-memory checkpoint fields and the checkpoint file."""

    def __init__(self, store: Path, n: int) -> None:
        self.log = open_log(store)
        self.results: list[AppendResult] = write_messages(self.log, n, queues=3)
        self.fields = CheckpointFields()
        index = IndexService(store, SLOTS, ENTRIES, defer_roll_flush=True)
        self.disp = Dispatcher(
            self.log, ConsumeQueueStore(store, CQ_FILE), index, checkpoint=self.fields
        )
        self.cp = StoreCheckpoint.open_in(store)
        self.path = store / "checkpoint"

    def dispatch(self, upto: int) -> None:
        """Dispatch the records of messages [.., upto)."""
        last = self.results[upto - 1]
        end = last.wrote_offset + last.wrote_bytes
        self.disp.dispatch(self.disp.resume_offset(), end)

    def on_disk(self) -> CheckpointFields:
        return CheckpointFields.from_bytes(self.path.read_bytes())

    def close(self) -> None:
        self.disp.close()
        self.cp.close()


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    p = Parts(tmp_path, 90)
    yield p
    p.close()


def test_thorough_job_writes_the_logics_time_it_planned(parts: Parts) -> None:
    """Units dispatched after the plan may be in the files the job forces, but the
    checkpoint only claims what was dispatched when the job was planned."""
    parts.dispatch(30)
    planned = parts.results[29].store_timestamp
    assert parts.fields.logics_msg_timestamp == planned
    job = plan_job(parts.disp, cq_pages=0, thorough=True)
    assert job.files and job.write_checkpoint and job.logics == planned
    parts.dispatch(60)  # the loop goes on while the thread forces
    assert parts.fields.logics_msg_timestamp > planned
    run_job(job, parts.cp, lambda: PHYSIC)
    job.apply()
    disk = parts.on_disk()
    assert (disk.logics_msg_timestamp, disk.physic_msg_timestamp) == (planned, PHYSIC)
    # the positions the job forced moved; what came after it is the next job's
    for cq in parts.disp.queues:
        assert 0 < cq.queue.flushed_where < cq.queue.max_offset()
    nxt = plan_job(parts.disp, cq_pages=0, thorough=True)
    run_job(nxt, parts.cp, lambda: PHYSIC)
    nxt.apply()
    assert parts.on_disk().logics_msg_timestamp == parts.results[59].store_timestamp
    for cq in parts.disp.queues:
        assert cq.queue.flushed_where == cq.queue.max_offset()
    assert plan_job(parts.disp, cq_pages=0, thorough=False).files == []  # nothing left


def test_a_periodic_job_forces_queues_and_writes_no_checkpoint(parts: Parts) -> None:
    """flushConsumeQueueLeastPages: a file with fewer new pages is left for later (each
    queue holds 7 units here, less than a page, in a file of 10)."""
    parts.dispatch(21)  # 63 keys: the index file is full, not rolled yet
    assert parts.disp.index is not None and not parts.disp.index.rolled
    before = parts.path.read_bytes()
    assert plan_job(parts.disp, cq_pages=2, thorough=False).files == []
    job = plan_job(parts.disp, cq_pages=0, thorough=False)
    assert len(job.files) == 3 and not job.write_checkpoint and job.logics == 0
    run_job(job, parts.cp, lambda: PHYSIC)
    job.apply()
    assert parts.path.read_bytes() == before
    assert plan_job(parts.disp, cq_pages=0, thorough=False).files == []


def test_index_time_moves_only_after_the_rolled_file_was_forced(parts: Parts) -> None:
    """A roll forces nothing in the loop (the full file waits in `rolled`); the job that
    forces it moves the checkpoint's index time to its end, and a job whose sync fails
    moves nothing."""
    parts.dispatch(90)  # 3 keys per message, 63 per file: files roll
    index = parts.disp.index
    assert index is not None and len(index.rolled) >= 2
    last_rolled = index.rolled[-1].end_timestamp
    fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected"), after=1)
    failing = plan_job(parts.disp, cq_pages=None, thorough=False)
    assert failing.write_checkpoint and failing.index == last_rolled and not index.rolled
    with pytest.raises(fileio.StoreIOError):
        run_job(failing, parts.cp, lambda: PHYSIC)
    assert parts.on_disk() == CheckpointFields()
    fileio.clear_faults()
    index.rolled = index.files[:-1]  # as if that job had not been planned
    job = plan_job(parts.disp, cq_pages=None, thorough=False)
    run_job(job, parts.cp, lambda: PHYSIC)
    disk = parts.on_disk()
    assert (disk.index_msg_timestamp, disk.logics_msg_timestamp) == (last_rolled, 0)


def test_thread_runs_jobs_and_a_failed_sync_is_raised_in_the_loop(parts: Parts) -> None:
    """The loop's side: submit, collect (positions applied there); an injected EIO in
    the thread's fdatasync wakes the loop and `collect` raises it, naming the file; no
    checkpoint is written, the thread is gone and takes no other job."""
    woken = threading.Event()
    flusher = FlushThread(parts.cp, lambda: PHYSIC, woken.set)
    try:
        parts.dispatch(30)
        flusher.submit(plan_job(parts.disp, cq_pages=0, thorough=True))
        assert flusher.busy
        done = wait_for(flusher.collect, 30, "the first job")
        assert done.seconds > 0 and not flusher.busy
        assert parts.on_disk().logics_msg_timestamp == parts.results[29].store_timestamp
        before = parts.path.read_bytes()
        parts.dispatch(60)
        fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected EIO"))
        flusher.submit(plan_job(parts.disp, cq_pages=0, thorough=True))
        assert woken.wait(30), "the loop was not woken"
        with pytest.raises(fileio.StoreIOError) as ei:
            flusher.collect()
        e = ei.value
        assert (e.op, e.errno) == ("fdatasync", errno.EIO) and "consumequeue" in e.path, e
        assert parts.path.read_bytes() == before
        with pytest.raises(fileio.StoreIOError):
            flusher.submit(plan_job(parts.disp, cq_pages=0, thorough=True))
    finally:
        with pytest.raises(fileio.StoreIOError):
            flusher.stop()


def test_files_are_made_ahead_and_a_roll_renames_them(parts: Parts) -> None:
    """A queue file half written and an index file half full get their next file made
    by the thread (allocated and fsynced under a .tmp name); the roll in the loop is a
    rename, and the directory's fsync is the next job's, before its checkpoint."""
    parts.dispatch(18)  # 6 units per queue in files of 10; 54 of 63 index keys
    job = plan_job(parts.disp, cq_pages=None, thorough=False)
    queues = {q.directory: start for q, start in job.prepare_queues}
    assert len(queues) == 3 and set(queues.values()) == {CQ_FILE}
    assert job.prepare_index is parts.disp.index
    run_job(job, parts.cp, lambda: PHYSIC)
    for d in queues:
        ahead = Path(d) / f"{CQ_FILE:020d}.next.tmp"
        assert ahead.stat().st_size == CQ_FILE
    index = parts.disp.index
    assert index is not None and index.prepared is not None
    assert Path(index.prepared).name == "next.tmp"
    assert plan_job(parts.disp, cq_pages=None, thorough=False).empty  # nothing twice
    parts.dispatch(45)  # every queue rolls into its prepared file; the index too
    for d in queues:
        names = sorted(p.name for p in Path(d).iterdir())
        assert names[:2] == ["00000000000000000000", f"{CQ_FILE:020d}"], names
        assert f"{CQ_FILE:020d}.next.tmp" not in names
    assert not (Path(index.directory) / "next.tmp").exists() and index.prepared is None
    nxt = plan_job(parts.disp, cq_pages=0, thorough=True)
    assert set(queues) | {index.directory} <= set(nxt.dirs)
    run_job(nxt, parts.cp, lambda: PHYSIC)
    nxt.apply()
    assert parts.on_disk().logics_msg_timestamp == parts.results[44].store_timestamp


def test_prepared_files_do_not_outlive_the_dispatcher(tmp_path: Path) -> None:
    """close() deletes files made ahead and never used; a store loaded after a crash
    deletes them (writable loads only)."""
    p = Parts(tmp_path, 18)
    p.dispatch(18)
    job = plan_job(p.disp, cq_pages=None, thorough=False)
    run_job(job, p.cp, lambda: PHYSIC)
    made = sorted(tmp_path.rglob("*.tmp"))
    assert len(made) == 4, made
    p.close()
    assert sorted(tmp_path.rglob("*.tmp")) == []
    for f in made:  # as a crash leaves them
        f.write_bytes(b"x")
    cqs = ConsumeQueueStore(tmp_path, CQ_FILE).load()
    index = IndexService(tmp_path, SLOTS, ENTRIES)
    index.load()
    assert sorted(tmp_path.rglob("*.tmp")) == []
    cqs.close()
    index.close()


def test_a_check_between_jobs_looks_only_at_the_queues_written_since(parts: Parts) -> None:
    """The dispatcher keeps the queues it gave units since it last took the set
    (`Dispatcher.touched`); a plan over those makes ahead only their next files, and
    the index's as soon as its newest file holds a key (not at half full)."""
    parts.dispatch(3)  # a unit in each of 3 queues, 6 of 63 index keys
    touched, parts.disp.touched = parts.disp.touched, set()
    assert {cq.key for cq in touched} == {cq.key for cq in parts.disp.queues}
    job = plan_job(parts.disp, cq_pages=None, thorough=False, queues=set())
    assert job.prepare_queues == [] and job.prepare_index is parts.disp.index
    run_job(job, parts.cp, lambda: PHYSIC)
    parts.dispatch(18)  # 6 units per queue in files of 10: each past half
    written = {cq.key[1]: cq for cq in parts.disp.touched}
    only = plan_job(parts.disp, cq_pages=None, thorough=False, queues=[written[1]])
    assert [start for _q, start in only.prepare_queues] == [CQ_FILE]
    assert only.prepare_queues[0][0] is written[1].queue and only.prepare_index is None
    only.close()


def test_preparations_run_before_the_syncs_of_a_job(parts: Parts) -> None:
    """A job makes its files ahead of need before it forces anything: a roll waits on
    them, the forcing does not. With every fdatasync failing, the job fails, yet the
    next files were made."""
    parts.dispatch(18)
    job = plan_job(parts.disp, cq_pages=0, thorough=True)
    assert job.files and job.prepare_queues and job.prepare_index is not None
    fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected EIO"))
    with pytest.raises(fileio.StoreIOError):
        run_job(job, parts.cp, lambda: PHYSIC)
    fileio.clear_faults()
    for queue, start in job.prepare_queues:
        assert Path(queue.prepared[start]).exists()
    index = parts.disp.index
    assert index is not None and index.prepared is not None and Path(index.prepared).exists()


def test_rolls_that_make_their_file_in_the_loop_are_counted(parts: Parts) -> None:
    """A roll that finds no file made ahead makes it itself (`rolls_in_place`, what the
    dispatcher reports at stop); one into a file made ahead is not counted, and neither
    is a queue's or the index's first file."""
    index = parts.disp.index
    assert index is not None

    def job() -> None:
        j = plan_job(parts.disp, cq_pages=None, thorough=False)
        run_job(j, parts.cp, lambda: PHYSIC)
        j.apply()

    parts.dispatch(33)  # 11 units per queue in files of 10; 99 keys in files of 63
    assert [cq.queue.rolls_in_place for cq in parts.disp.queues] == [1, 1, 1]
    assert index.rolls_in_place == 1
    job()  # the index's next file (its newest holds keys); no queue is half written
    parts.dispatch(45)  # 135 keys: the index rolls into it; 5 of 10 units per queue
    assert index.rolls_in_place == 1
    job()  # now each queue's next file
    parts.dispatch(63)  # 21 units per queue: each rolls into its file made ahead
    assert [cq.queue.rolls_in_place for cq in parts.disp.queues] == [1, 1, 1]
    assert index.rolls_in_place == 1
