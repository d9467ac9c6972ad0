"""The allocator process: keeps the next segment files ready (RocketMQ's
AllocateMappedFileService), so a writer never creates a file on the hot path.

It watches `reserved_pos` and makes sure the segment being written and the next
`AHEAD` ones exist (pre-allocated with fallocate; under SYNC_FLUSH written with zeros,
`zero_fill`, a page per write with the pool off, `zero_write`; warmed when
`warm_mapped_file_enable`), then publishes `allocated_upto`, the end of the last ready
file. Producers never reserve past it (they wait, then fail with
CREATE_MAPPED_FILE_FAILED). Before it creates a file it checks that the free space can
hold it (`engine.diskguard.space_problem`); when it cannot (or the fallocate fails with
ENOSPC or EDQUOT) it creates nothing, says so once per file, and tries again next tick
(TICK_S): a full disk passes, it never fails the store. Otherwise it sleeps until the
earliest moment producers could cross into the next segment (at FILL_RATE_MAX, at most
IDLE_TICK_S): that is when the next file can become due.
"""

from __future__ import annotations

import os
from typing import Final

from mqstore.conf.settings import FlushDiskType, StoreSettings
from mqstore.engine import fileio
from mqstore.engine.diskguard import space_problem
from mqstore.engine.segment import Segment, segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Positions
from mqstore.workers.base import Condition, WorkerContext
from mqstore.workers.service import Service, run

AHEAD: Final = 2
TICK_S: Final = 0.005  # the shortest wait, and the wait while a file could not be made
IDLE_TICK_S: Final = 0.25  # the longest wait (a new file is due at most this late)
# The fastest producers are assumed to fill a segment at, in bytes per second: the tick
# waits the time they need to reach the current segment's end, the first moment a new
# file can be due (and AHEAD files stand ready behind it).
FILL_RATE_MAX: Final = 4 << 30
_no_space: dict[str, Condition] = {}  # log dir -> the file it has no room for, said once


def zero_fill(settings: StoreSettings) -> bool:
    """New segments are written with zeros (`sync_flush_zero_segments`, SYNC_FLUSH only):
    an fdatasync that covers a fallocated (unwritten) extent converts it, a metadata
    write (a journal commit on ext4 and XFS with a journal), which made the sync round's
    fdatasync up to 1.5x a plain one at p90 (docs/durability.md). Under ASYNC_FLUSH the
    extra write of every segment costs more than the rare fsync saves."""
    return (
        settings.sync_flush_zero_segments and settings.flush_disk_type is FlushDiskType.SYNC_FLUSH
    )


def zero_write(settings: StoreSettings) -> int:
    """Bytes per write of those zeros: a page when the pool is off. Producers then store
    into the segment's mapping, which dirties a whole page-cache folio, and a folio is
    as large as the write that brought it in: with 1 MiB writes every sync round's
    fdatasync wrote 1 MiB for a 1 KiB put, 3x a plain one (`fileio.preallocate`). With
    the pool on the committer pwrites, which dirties only its blocks: 1 MiB writes,
    a fifth of the CPU."""
    return fileio.ZERO_CHUNK if settings.transient_store_pool_enable else fileio.PAGE_WRITE


def ensure_segments(store_dir: str, cb: c.ControlBlock, settings: StoreSettings) -> int:
    """Create missing files for the current segment and the next AHEAD; publish and
    return `allocated_upto`. Allocator (and supervisor at boot) only. Raises StoreIOError
    (not for a full disk: that is waited out, see the module doc)."""
    size = cb.segment_size
    log_dir = os.path.join(store_dir, "commitlog")
    fileio.makedirs(log_dir)
    first = Positions(cb).reserved // size
    ready = first
    cond = _no_space.setdefault(log_dir, Condition("allocator"))
    for index in range(first, first + AHEAD + 1):
        path = os.path.join(log_dir, segment_file_name(index * size))
        if os.path.exists(path):
            ready = index + 1
            continue
        # No room for the file: producers wait, then get CREATE_MAPPED_FILE_FAILED; the
        # cleaner's deletions (or an operator's) make room, and the next tick tries again.
        # Said once per file, not every tick (the free bytes in the line change).
        problem = space_problem(log_dir, size)
        if problem:
            cond.report(path, f"not creating {path}: {problem}")
            break
        try:
            seg = Segment.create(
                log_dir,
                index * size,
                size,
                zero_fill=zero_fill(settings),
                zero_write=zero_write(settings),
            )
        except fileio.StoreIOError as e:
            if not fileio.is_no_space(e):
                raise
            cond.report(path, f"not creating {path}: {e}")
            break
        cond.clear(f"space is back: created {path}")
        ready = index + 1
        try:
            if settings.warm_mapped_file_enable:
                sync = settings.flush_disk_type is FlushDiskType.SYNC_FLUSH
                seg.warm(sync_every_pages=settings.flush_least_pages_when_warm if sync else 0)
        finally:
            seg.close()
    upto = ready * size
    Positions(cb).raise_allocated(upto)
    return upto


class Allocator(Service):
    name = "allocator"

    def tick(self) -> float:
        cb = self.ctx.cb
        size = cb.segment_size
        pos = Positions(cb)
        reserved = pos.reserved
        need = (reserved // size + AHEAD + 1) * size
        if (
            need > pos.allocated
            and ensure_segments(self.ctx.store_dir, cb, self.ctx.settings) < need
        ):
            return TICK_S  # no room yet: try again soon
        # Nothing is due before `reserved` crosses into the next segment: sleep until
        # producers at FILL_RATE_MAX could get there (an idle store wakes 4 times a
        # second, not 200).
        left = size - reserved % size
        return min(max(left / FILL_RATE_MAX, TICK_S), IDLE_TICK_S)


def main(ctx: WorkerContext) -> int:
    return run(ctx, Allocator(ctx))
