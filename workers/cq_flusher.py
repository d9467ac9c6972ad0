"""The dispatcher's flush thread: RocketMQ's FlushConsumeQueueService, beside dispatch.

RocketMQ forces consume queues in a service thread of its own, apart from
ReputMessageService, and the index file a roll filled in a thread started for it. Here
both run in one thread of the dispatcher process, so that dispatch never waits on a
disk sync (measured in bench/results/dispatch.md: the consume-queue fdatasync and an
index roll's flush of the full file stalled dispatch for 10-60 ms each, the p99 lag).

Ownership. The dispatcher's thread owns every consume queue, index file and position;
it plans a `FlushJob` (`plan_job`) without a syscall: per file a `FileSync` (a
duplicate descriptor, `filesync.FileSync`) and the position to mark flushed. This
thread only runs jobs, one at a time: force the files, fsync the directories listed,
then write the checkpoint when the job says so. The positions move back in the
dispatcher's thread when it collects the finished job (`SegmentQueue.note_flushed`).
The checkpoint file is this thread's while it runs; the dispatcher's thread keeps the
timestamps of what it dispatched in memory (`CheckpointFields`).

Checkpoint contract (spec §5, docs/durability.md). The file's logics timestamp is
advanced only by a thorough job, to the dispatched logics timestamp as it was when the
job was planned: every unit up to it was in the mappings then and every file holding one
is forced by the job before the checkpoint is written. The index timestamp is advanced
to the end timestamp of a rolled (full) index file only after that file was forced. The
physic timestamp is the flusher's (`Positions.flushed_ts`). A job that fails writes no
checkpoint.

Failure. A `StoreIOError` (or any error) in this thread ends it; the dispatcher's thread
raises it at its next tick (`FlushThread.collect`, woken at once through the context's
wake-up), so the store fails closed with the dispatcher's name, the syscall and the errno
(`workers.service`), exactly as if the dispatch loop had failed the sync itself. No job
runs after a failure, and nothing is retried: a failed fsync is never retried.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mqstore.engine import fileio
from mqstore.engine.checkpoint import StoreCheckpoint
from mqstore.engine.consumequeue import ConsumeQueue
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.filesync import FileSync
from mqstore.engine.indexservice import IndexService
from mqstore.engine.segment import Segment, segment_file_name
from mqstore.engine.segment_files import PREPARED_SUFFIX
from mqstore.engine.segment_queue import SegmentQueue


@dataclass
class FlushJob:
    """One run of the flush thread, planned by the dispatcher's thread."""

    files: list[FileSync] = field(default_factory=list)  # forced in this order
    dirs: list[str] = field(default_factory=list)  # fsynced after the files
    logics: int = 0  # > 0: thorough; the checkpoint's logics timestamp once forced
    index: int = 0  # > 0: rolled index files forced; the checkpoint's index timestamp
    write_checkpoint: bool = False
    # files made ahead of need, after the rest: the next consume-queue file of each
    # queue listed (its start offset), the next index file; and stale ones deleted
    prepare_queues: list[tuple[SegmentQueue, int]] = field(default_factory=list)
    prepare_index: IndexService | None = None
    unlink: list[str] = field(default_factory=list)
    # the dispatcher's bookkeeping once the job is done (`note_flushed`)
    marks: list[tuple[SegmentQueue, Segment, int]] = field(default_factory=list)
    seconds: float = 0.0  # how long it ran

    @property
    def empty(self) -> bool:
        return not (
            self.files or self.marks or self.dirs or self.write_checkpoint
            or self.prepare_queues or self.prepare_index or self.unlink
        )  # fmt: skip

    def close(self) -> None:
        """Close every duplicate descriptor (and mapping hold) the job took."""
        for f in self.files:
            f.close()

    def apply(self) -> None:
        """The dispatcher's thread, after the job ran: the positions it forced."""
        for queue, seg, pos in self.marks:
            queue.note_flushed(seg, pos)


def plan_job(
    disp: Dispatcher,
    *,
    cq_pages: int | None,
    thorough: bool,
    all_index: bool = False,
    prepare: bool = True,
    queues: Iterable[ConsumeQueue] | None = None,
) -> FlushJob:
    """A job for `disp`'s files, planned in the thread that dispatches, without a
    syscall but `dup`: the queue files `ConsumeQueueStore.flush_plan(cq_pages)` lists
    (None: none), the index files a roll filled since the last plan (`IndexService.rolled`;
    the checkpoint's index time becomes the newest one's end), and when `thorough` the
    current index file (`all_index`: every one) and the checkpoint with the logics time
    dispatched so far (`disp.checkpoint`): every unit up to it is in a file the job
    forces. Also the directories a prepared file was renamed into since (fsynced before
    the checkpoint is written), prepared files no roll can use (deleted), and, when
    `prepare`, the next files to make ahead of need (`SegmentQueue.want_prepared`,
    `IndexService.want_prepared`), so that a roll in the dispatch loop is a rename, not
    an allocation with two fsyncs. `queues`: look only at these for directories to
    fsync, stale files and files to make ahead (None: every queue; the dispatcher's
    checks between periodic jobs pass the queues it wrote since). Raises StoreIOError
    (dup)."""
    job = FlushJob()
    try:
        if cq_pages is not None:
            for queue, seg, pos in disp.queues.flush_plan(cq_pages):
                if pos > seg.flushed_position:
                    job.files.append(seg.sync_handle(pos))
                job.marks.append((queue, seg, pos))
        for cq in disp.queues if queues is None else queues:
            q = cq.queue
            if q.dir_unsynced:
                job.dirs.append(q.directory)
                q.dir_unsynced = False
            job.unlink.extend(q.stale_prepared())
            if prepare and (start := q.want_prepared()) is not None:
                job.prepare_queues.append((q, start))
        index = disp.index
        if index is not None:
            if index.dir_unsynced:
                job.dirs.append(index.directory)
                index.dir_unsynced = False
            if prepare and index.want_prepared():
                job.prepare_index = index
            rolled, index.rolled = index.rolled, []
            forced = index.files if all_index else rolled
            if thorough and not all_index and index.files and index.files[-1] not in rolled:
                forced = [*rolled, index.files[-1]]
            job.files.extend(f.sync_handle() for f in forced)
            job.index = max((f.end_timestamp for f in rolled), default=0)
        if thorough and disp.checkpoint is not None:
            job.logics = disp.checkpoint.logics_msg_timestamp
        job.write_checkpoint = thorough or job.index > 0
    except BaseException:
        job.close()
        raise
    return job


def run_job(job: FlushJob, cp: StoreCheckpoint, physic_ms: Callable[[], int]) -> None:
    """Make the files the job makes ahead of need, force its files and directories, then
    write the checkpoint if the job says so, with `physic_ms()` as the physic timestamp
    when it is newer, and delete stale prepared files. The preparations go first: a
    roll that finds no file ready makes it in the dispatch loop, while the forcing only
    makes durable what the loop already wrote (behind a busy disk both wait alike). The
    flush thread's work, or the caller's own at the end of a drain. Raises StoreIOError
    (checkpoint untouched when a sync failed)."""
    t0 = time.perf_counter()
    try:
        for queue, start in job.prepare_queues:
            if not _no_space_ok(Segment.prepare, queue.directory, start,
                                queue.segment_size_bytes, PREPARED_SUFFIX):  # fmt: skip
                break
            queue.prepared[start] = os.path.join(
                queue.directory, segment_file_name(start) + PREPARED_SUFFIX
            )
        if job.prepare_index is not None:
            _no_space_ok(job.prepare_index.prepare_next)
        for f in job.files:
            f.run()
        for d in job.dirs:
            fileio.fsync_dir(d)
        if job.write_checkpoint:
            if job.logics > 0:
                cp.logics_msg_timestamp = job.logics
            if job.index > cp.index_msg_timestamp:
                cp.index_msg_timestamp = job.index
            physic = physic_ms()
            if physic > cp.physic_msg_timestamp:
                cp.physic_msg_timestamp = physic
            cp.flush()
        for path in job.unlink:
            fileio.unlink(path, missing_ok=True)
    finally:
        job.close()
        job.seconds = time.perf_counter() - t0


def _no_space_ok(fn: Callable[..., object], *args: object) -> bool:
    """Run a preparation; False when the disk is full (nothing is left behind: the roll
    then makes the file itself, and the dispatcher waits a full disk out there, said
    once). Any other error fails the store closed, as any sync."""
    try:
        fn(*args)
    except fileio.StoreIOError as e:
        if not fileio.is_no_space(e):
            raise
        return False
    return True


class FlushThread:
    """Runs `FlushJob`s one at a time in a thread of its own. See the module doc.

    The dispatcher's thread calls `submit` (only while not `busy`), `collect` every tick
    and `stop` once; nothing else touches the checkpoint file until `stop` returned."""

    def __init__(
        self, cp: StoreCheckpoint, physic_ms: Callable[[], int], wake: Callable[[], None]
    ) -> None:
        self._cp = cp
        self._physic_ms = physic_ms
        self._wake = wake
        self._cv = threading.Condition()
        self._job: FlushJob | None = None
        self._done: FlushJob | None = None
        self._error: BaseException | None = None
        self._stopping = False
        self.jobs_run = 0
        self._thread = threading.Thread(target=self._loop, name="mqstore-cq-flush", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A job is running, or ran and was not collected yet."""
        return self._job is not None or self._done is not None

    def submit(self, job: FlushJob) -> None:
        with self._cv:
            if self._error is not None:
                job.close()
                raise self._error  # the thread is gone: nothing runs after a failure
            if self._job is not None or self._done is not None or self._stopping:
                job.close()
                raise RuntimeError("submit() while a flush job is out or after stop()")
            self._job = job
            self._cv.notify()

    def collect(self) -> FlushJob | None:
        """The finished job, if any, with its positions applied; raises the error that
        ended the thread (a StoreIOError fails the store closed). Nothing finished (the
        common tick): no lock taken; a job finishing meanwhile is collected next tick."""
        if self._done is None and self._error is None:
            return None
        with self._cv:
            if self._error is not None:
                raise self._error
            done, self._done = self._done, None
        if done is not None:
            done.apply()
        return done

    def stop(self) -> None:
        """Let the job that is out finish, end the thread, collect; raises its error."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        self.collect()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._stopping:
                    self._cv.wait()
                job = self._job
                if job is None:
                    return
            try:
                run_job(job, self._cp, self._physic_ms)
            except BaseException as e:  # re-raised in the dispatcher's thread
                with self._cv:
                    self._error = e
                    self._job = None
                self._wake()
                return
            with self._cv:
                self._done, self._job = job, None
                self.jobs_run += 1
