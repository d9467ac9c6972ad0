"""Fencing: one running generation per store (DESIGN.md §10).

Every supervisor start is a new generation with its own control block (and pool). A
writer makes nothing visible unless its generation is the running one, so a producer
that slept (SIGSTOP, a debugger, a paused VM) through a stop, a restart or a recovery
finds itself fenced and gets SERVICE_NOT_AVAILABLE, never PUT_OK:

* **The fence** (`fence`, C `mqs_fence`): FENCED and REFUSE_WRITES in the block's flags
  (no reservation from then on), then `fence_seq`, 1 + the `seq` it read after the flag.
  Reservations below it are drained: completed by their producers, or claimed and
  filled (`ipc.commit.LogFiles.publish`, C `mqs_claim`: a compare-and-swap against the
  producer's own, so exactly one wins). A reservation committed later (its producer was
  stopped inside the reservation step, which the stop goes on without) is never
  published (`mqs_publish` stops at the fence) and its completion fails.
* **Who fences**: the stopping supervisor after the reservation fence, before its last
  drain (`Supervisor.shutdown`); an orphaned committer whose supervisor died
  (`workers.committer`); the next supervisor over the blocks a crashed run left, before
  its recovery (`quiesce_leftovers`: refused while their supervisor still maps one, else
  fence and wait for their workers' drain) and after it (`retire_leftovers`: claim
  everything unpublished, STOPPED, wake the waiters, then unlink). A sync waiter whose
  end the last flush did not cover stops at STOPPED with the fenced outcome
  (`mqs_wait_flushed_tick`): FLUSH_DISK_TIMEOUT naming the ended generation, never
  PUT_OK (its record was published and may be in the log, so never "not stored").
* **Files** (pool off: producers write into the segment files' shared mappings, and a
  mapping outlives the block): the new generation never shares an inode with an old
  writer. `fresh_inodes` replaces the segment files from a position to the log's end by
  copies (fsynced, renamed over them) and removes the ones after (the allocator makes
  new ones), so a stale mapping writes into an unlinked inode. The next supervisor runs
  it at the recovered end after an unclean stop (a sleeping producer's reservation is
  never before it: the crash recovery cuts the log at its hole); the stopping
  supervisor from the first reservation it had to fill or go on without. A stop where
  every producer finished needs nothing. With the pool on, producers write only into
  the pool, which goes with its block.

The trust model (what a resumed process, a deleted file and a scribbled block can do)
is in docs/durability.md.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Iterator
from typing import Final

from mqstore import _native
from mqstore.engine import fileio
from mqstore.engine.segment import Segment, segment_file_name
from mqstore.engine.segment_files import numbered_files
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Flags, Positions, Reservation

COPY_CHUNK: Final = 1 << 20


def fence(cb: c.ControlBlock) -> int:
    """End `cb`'s generation (see the module docstring); the fence's seq."""
    return _native.fence(cb.buf)


def _claim_unpublished(buf: memoryview) -> int:
    """Claim every reservation below the fence not yet DONE, so that its producer's
    completion fails (a crashed run's block: nobody will fill or publish it). Returns
    the slots claimed."""
    pos = Positions(buf)
    end = _native.fence_seq(buf)
    seq, claimed = pos.published_seq, 0
    while 0 <= seq < end:
        n = _native.claim(buf, seq)
        if n < 0:
            break
        claimed += n
        seq += max(n, 1)
    return claimed


class StoreInUse(Exception):
    """A live supervisor still runs shared memory of this store (its directory was
    renamed or replaced under it): the store is not "left by a crashed run"."""


def maps(pid: int, name: str) -> bool:
    """Whether process `pid` maps the shared memory `name` now: a live user of it, which
    a reused pid is not (robust where a bare pid is not)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return f"/dev/shm/{name}".encode() in f.read()
    except OSError:
        return False


def quiesce_leftovers(store_dir: str, timeout_s: float) -> list[int]:
    """The next supervisor, holding the store's lock, before its recovery: for each
    control block a crashed run of this store left, refuse when its supervisor still
    maps it (StoreInUse), else fence it (no new reservation) and wait up to `timeout_s`
    for the workers that still map it to finish their drain, so recovery never races
    an orphaned committer. Returns the pids still there at the timeout."""
    waiting: list[tuple[int, str]] = []
    for name in c.leftover_shm(store_dir):
        if not name.endswith("-ctl"):
            continue
        with contextlib.suppress(OSError, ValueError):
            users = _fence_block(name)
            if users and maps(users[0], name):
                raise StoreInUse(
                    f"supervisor pid {users[0]} still runs shared memory {name} of this store"
                )
            waiting += [(pid, name) for pid in users[1:]]
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = [(pid, name) for pid, name in waiting if maps(pid, name)]
        if not waiting or time.monotonic() >= deadline:
            return [pid for pid, _name in waiting]
        time.sleep(0.02)


@contextlib.contextmanager
def _mapped(name: str) -> Iterator[memoryview | None]:
    """The shared memory `name` mapped, or None when it is not a control block of this
    layout (too short, another version): then it is left untouched."""
    fd = os.open(os.path.join("/dev/shm", name), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size) if size >= c.SLOTS_OFF else None
    finally:
        os.close(fd)
    if mm is None:
        yield None
        return
    buf = memoryview(mm)
    try:
        yield buf if c.has_magic(buf) else None
    finally:
        buf.release()
        mm.close()


def _fence_block(name: str) -> list[int]:
    """Fence the block `name` unless its supervisor still maps it; the pids it names."""
    with _mapped(name) as buf:
        if buf is None:
            return []
        users = c.block_users(buf)
        if not (users and maps(users[0], name)):
            _native.fence(buf)
        return users


def retire_leftovers(store_dir: str) -> tuple[list[str], int]:
    """The next supervisor, holding the store's lock, before it creates its block: fence
    each control block a crashed run of this store left, claim what it did not publish,
    mark it STOPPED and wake its sync waiters (they answer fenced), then unlink every
    leftover segment. A block that is not one of ours (another layout, too short) is
    unlinked untouched. Returns the names removed and the lowest offset a drain of
    theirs filled for a producer that may still write there (-1: none)."""
    stale = -1
    for name in c.leftover_shm(store_dir):
        if name.endswith("-ctl"):
            with contextlib.suppress(OSError, ValueError):
                at = _retire_block(name)
                if at >= 0:
                    stale = at if stale < 0 else min(stale, at)
    return c.remove_leftovers(store_dir), stale


def _retire_block(name: str) -> int:
    with _mapped(name) as buf:
        if buf is None:
            return -1
        _native.fence(buf)
        with contextlib.suppress(ValueError):  # a slot count out of range: nothing to claim
            _claim_unpublished(buf)
        Flags(buf).mark_stopped()
        _native.flushed_wake_all(buf)
        return Reservation(buf).stale_from


def fresh_inodes(store_dir: str, segment_size: int, first: int, end: int) -> list[str]:
    """Pool off: the segment files holding the log from `first` to `end` become new
    inodes with the same bytes below `end` (copied, fsynced, renamed over the old
    ones), and every segment file after `end`'s is removed (the allocator makes new
    ones), so that a mapping an older generation's producer still holds writes into
    unlinked inodes only. The supervisor, with the store locked and no producer of its
    own attached. Returns the files replaced or removed. Raises StoreIOError."""
    log_dir = os.path.join(store_dir, "commitlog")
    last = end // segment_size
    done: list[str] = []
    for index in range(min(first, end) // segment_size, last + 1):
        start = index * segment_size
        path = os.path.join(log_dir, segment_file_name(start))
        if not os.path.exists(path):
            continue
        tmp = Segment.prepare(log_dir, start, segment_size)
        try:
            _copy_prefix(path, tmp, min(segment_size, end - start))
            fileio.rename(tmp, path)
        except BaseException:
            fileio.unlink(tmp, missing_ok=True)
            raise
        done.append(path)
    for later in numbered_files(log_dir):
        if int(os.path.basename(later)) > last * segment_size:
            fileio.unlink(later, missing_ok=True)
            done.append(later)
    if done:
        fileio.fsync_dir(log_dir)
    return done


def _copy_prefix(src: str, dst: str, length: int) -> None:
    """The first `length` bytes of `src` into `dst` (allocated already), fdatasynced."""
    rfd = fileio.open_file(src, create=False, read_only=True)
    try:
        wfd = fileio.open_file(dst, create=False)
        try:
            at = 0
            while at < length:
                chunk = fileio.pread(rfd, min(COPY_CHUNK, length - at), at, src)
                if not chunk:
                    break
                fileio.pwrite(wfd, chunk, at, dst)
                at += len(chunk)
            fileio.fdatasync(wfd, dst)
        finally:
            fileio.close(wfd, dst)
    finally:
        fileio.close(rfd, src)
