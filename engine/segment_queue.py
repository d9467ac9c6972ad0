"""The ordered chain of segments of one log: RocketMQ's MappedFileQueue (spec §8.3).

Segments are kept in a `sortedcontainers.SortedDict` keyed by start offset, so finding
the segment of an offset is O(log n) and the chain's ends are O(1). Adjacent segments
start exactly `segment_size_bytes` apart (`check()` says when they do not).

Global positions, like RocketMQ's:

| name             | meaning                                        | written only by      |
| ---------------- | ---------------------------------------------- | -------------------- |
| `committed_where`| log offset up to which segments are committed  | `commit()`           |
| `flushed_where`  | log offset up to which segments are flushed    | `flush()`            |
| `store_timestamp`| store time of the last record covered by a     | `flush(0)`           |
|                  | thorough flush (feeds the checkpoint)          |                      |

**commit / flush return values.** RocketMQ's `commit(leastPages)` and `flush(leastPages)`
return `true` when *nothing advanced*. Here both return the number of bytes the global
position advanced: `0` is RocketMQ's `true` ("no progress"), anything else is its
`false`. Like RocketMQ, one call touches at most one segment; a segment that becomes
fully flushed moves the position to the next segment's start, so the next call goes on
there. `commit_all()` / `flush_all()` repeat until no progress.

**Load.** `load()` opens the files `engine.segment_files.list_segment_files` lists (its
doc gives the rules: leftovers, a zero-length last file, sizes), with all positions at
the segment size; recovery then cuts the tail with `truncate_dirty()`.

**New segments** come from `allocator(start_offset) -> Segment`, a fresh segment with
positions (0, 0, 0) and this queue's size. The default creates the file in place
(`Segment.create`); the runtime passes one that takes a file its allocator process
pre-allocated, and one that attaches a pool buffer. An allocator that cannot deliver
(no pool buffer, timeout) raises `SegmentAllocationError`, which the commit log turns
into `CREATE_MAPPED_FILE_FAILED`.

Not thread-safe: one appender, and commit/flush from the thread that owns the queue.
In the runtime each process has its own queue over the same files.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NoReturn, Unpack

from sortedcontainers import SortedDict

from mqstore.engine import fileio
from mqstore.engine.findings import Finding, Severity
from mqstore.engine.record import END_FILE_MIN_BLANK_LENGTH, write_blank
from mqstore.engine.segment import (
    MapOptions,
    ReadStatus,
    Segment,
    now_ms,
    segment_file_name,
)
from mqstore.engine.segment_files import list_segment_files, segment_files_after

Allocator = Callable[[int], Segment]
SleepMs = Callable[[int], None]

DELETE_FILES_BATCH_MAX = 10  # RocketMQ's DELETE_FILES_BATCH_MAX (5.x deleteFileBatchMax)
TRUNCATE_DESTROY_INTERVAL_MS = 1000


class QueueOptions(MapOptions, total=False):
    """`SegmentQueue`'s keywords, for the logs that build one (`CommitLog.open`)."""

    read_only: bool
    allocator: Allocator | None


class SegmentAllocationError(Exception):
    """An allocator could not deliver the next segment (an expected outcome, e.g. the
    write pool is empty and fast-fail is on). The commit log reports it as a status."""


def _sleep_ms(ms: int) -> None:
    time.sleep(ms / 1000)


def _until_no_progress(step: Callable[[int], int], max_rounds: int) -> int:
    """`step(0)` until it returns 0 (no progress) or `max_rounds`; the sum of its returns."""
    total = 0
    for _ in range(max_rounds):
        n = step(0)
        if n == 0:
            break
        total += n
    return total


@dataclass(frozen=True, slots=True)
class TruncateResult:
    offset: int  # where the log now ends
    segments_deleted: int
    bytes_zeroed: int


class _Segments(SortedDict):  # type: ignore[misc]
    """start offset -> Segment, the newest kept in `last`: `SegmentQueue.last()` is an
    attribute read, not SortedDict's `peekitem(-1)` (~4k instructions; the dispatcher's C
    round asks it once per queue per round: issue 23). Only these three change it; the
    SortedDict methods that would change it another way are refused."""

    def __init__(self) -> None:
        super().__init__()
        self.last: Segment | None = None

    def __setitem__(self, start: int, seg: Segment) -> None:
        super().__setitem__(start, seg)
        self.last = self.peekitem(-1)[1]

    def __delitem__(self, start: int) -> None:
        super().__delitem__(start)
        self.last = self.peekitem(-1)[1] if self else None

    def clear(self) -> None:
        super().clear()
        self.last = None

    def _refused(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a segment map changes only by [start] = seg, del [start], clear()")

    pop = popitem = setdefault = update = __ior__ = copy = _refused


class SegmentQueue:
    """An ordered chain of equal-sized segments in one directory. See the module doc."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        segment_size_bytes: int,
        **options: Unpack[QueueOptions],
    ) -> None:
        """An empty queue over `directory` (created if writable); call `load()` next, or
        construct with `.loaded()`. `read_only` (default False) and `allocator` (default:
        create the file in place) are the queue's; the other options go to every
        segment it opens."""
        if segment_size_bytes <= END_FILE_MIN_BLANK_LENGTH:
            raise ValueError(f"segment size must exceed 8 bytes, got {segment_size_bytes}")
        self.directory = os.fspath(directory)
        self.segment_size_bytes = segment_size_bytes
        self.read_only = options.pop("read_only", False)
        self._allocator: Allocator = options.pop("allocator", None) or self._create_in_place
        self._options: MapOptions = options  # what is left: the segments' options
        self._clock_ms = options.get("clock_ms", now_ms)
        self._segments = _Segments()  # start offset -> Segment
        self.committed_where = 0
        self.flushed_where = 0
        self.store_timestamp = 0
        # Files made ahead of need by another thread (`want_prepared`): start offset ->
        # path of a `Segment.prepare`d file, set by that thread, taken by `_add`.
        self.prepared: dict[int, str] = {}
        self.dir_unsynced = False  # a prepared file was renamed in; its fsync_dir is due
        # Rolls (a file after the last) that `_create_in_place` made itself, allocated and
        # fsynced in the caller's thread because none was prepared ahead: the
        # dispatcher's count of rolls that stalled its loop on the disk.
        self.rolls_in_place = 0
        self._load_findings: list[Finding] = []
        self._skipped_empty_last: str | None = None
        if not self.read_only:
            if not os.path.isdir(self.directory):
                # Its files' inodes in a block group (and inode-table blocks) of their
                # own: a sync of one of them then writes no neighbour's timestamps.
                parent = os.path.dirname(os.path.abspath(self.directory))
                fileio.makedirs(parent)
                fileio.spread_subdirectories(parent)
            fileio.makedirs(self.directory)

    # --- loading ----------------------------------------------------------------------

    def loaded(self) -> SegmentQueue:
        """`load()`, then this queue: `SegmentQueue(...).loaded()`."""
        self.load()
        return self

    def _open(self, path: str) -> Segment:
        return Segment(path, self.segment_size_bytes, read_only=self.read_only, **self._options)

    def load(self) -> None:
        """Open every segment file (`engine.segment_files` says which, and what a
        writable load deletes). Positions start full; recovery cuts the tail with
        `truncate_dirty()`. Raises SegmentSizeError naming the first file of the wrong
        size, StoreIOError. O(files). Call once, before anything else.
        """
        if self._segments:
            raise RuntimeError("load() on a queue that already holds segments")
        files = list_segment_files(
            self.directory, self.segment_size_bytes, read_only=self.read_only
        )
        self._load_findings.extend(files.findings)
        self._skipped_empty_last = files.skipped_empty_last
        opened: list[Segment] = []
        try:
            for path in files.paths:
                opened.append(self._open(path))
        except BaseException:
            for seg in opened:
                seg.close()
            raise
        for seg in opened:
            self._segments[seg.start_offset] = seg

    def refresh(self) -> int:
        """Read-only queues in another process than the writer: open segment files that
        appeared past the last one since `load()` (the writer rolled), with positions
        full, and drop leading segments whose files were deleted (retention). Returns
        how many segments were added. O(files); a reader calls it when it runs out of
        data, not per read.
        """
        if not self.read_only:
            raise RuntimeError("refresh() is for read-only queues; the writer knows its files")
        for seg in self.segments:
            if os.path.exists(seg.path):
                break
            seg.close()
            del self._segments[seg.start_offset]
        last = self.last()
        after = -1 if last is None else last.start_offset
        paths = segment_files_after(self.directory, self.segment_size_bytes, after)
        for path in paths:
            seg = self._open(path)
            self._segments[seg.start_offset] = seg
        return len(paths)

    def release_before(self, offset: int) -> int:
        """Read-only queues that only walk forward (the dispatcher): unmap and forget the
        leading segments that end at or below `offset`, keeping the last one, so that a
        long-running follower maps a bounded window of the log, not all of it. The files
        stay; `refresh()` never re-adds segments before the first one kept. Returns how
        many were released. O(released)."""
        if not self.read_only:
            raise RuntimeError("release_before() is for read-only views; the writer deletes")
        released = 0
        for seg in self.segments[:-1]:
            if seg.start_offset + seg.size_bytes > offset:
                break
            seg.close()
            del self._segments[seg.start_offset]
            released += 1
        return released

    def _create_in_place(self, start_offset: int) -> Segment:
        tmp = self.prepared.pop(start_offset, None)
        if tmp is not None and os.path.exists(tmp):
            # Made ahead by another thread (`want_prepared`): a rename, no sync here; the
            # directory's fsync is that thread's next job (`dir_unsynced`).
            path = os.path.join(self.directory, segment_file_name(start_offset))
            try:
                fileio.rename(tmp, path)
            except fileio.StoreIOError:
                self.prepared[start_offset] = tmp  # still there: the next try takes it
                raise
            self.dir_unsynced = True
            return Segment.install(path, self.segment_size_bytes, **self._options)
        roll = bool(self._segments)
        seg = Segment.create(self.directory, start_offset, self.segment_size_bytes, **self._options)
        self.rolls_in_place += roll
        return seg

    # --- looking up -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(list(self._segments.values()))

    @property
    def segments(self) -> list[Segment]:
        """A snapshot of the chain, oldest first."""
        return list(self._segments.values())

    def first(self) -> Segment | None:
        """The oldest segment; None when the queue is empty."""
        if not self._segments:
            return None
        seg: Segment = self._segments.peekitem(0)[1]
        return seg

    def last(self) -> Segment | None:
        """The newest segment; None when the queue is empty."""
        return self._segments.last

    def find(self, offset: int, *, first_if_not_found: bool = False) -> Segment | None:
        """The segment whose `[start, start + size)` holds `offset`; O(log n).

        None when no segment holds it (or the first one, with `first_if_not_found`).
        """
        sd = self._segments
        i = sd.bisect_right(offset) - 1
        if i >= 0:
            seg: Segment = sd.peekitem(i)[1]
            if offset < seg.start_offset + seg.size_bytes:
                return seg
        if first_if_not_found:
            return self.first()
        return None

    def find_by_time(self, timestamp_ms: int) -> Segment | None:
        """First segment whose mtime >= timestamp_ms, else the last (None if empty)."""
        for seg in self.segments:
            if seg.last_modified_ms() >= timestamp_ms:
                return seg
        return self.last()

    # --- growing ----------------------------------------------------------------------

    def get_last(self, start_offset: int = 0, *, create: bool = True) -> Segment | None:
        """RocketMQ's getLastMappedFile(startOffset, needCreate).

        Empty queue: create the segment holding `start_offset` (rounded down to the
        segment size). Full last segment: create the next one. Otherwise the last
        segment. None only when a segment is needed and `create` is False. Raises
        SegmentAllocationError from the allocator, StoreIOError.
        """
        last = self.last()
        if last is None:
            create_offset = start_offset - start_offset % self.segment_size_bytes
        elif last.is_full():
            create_offset = last.start_offset + self.segment_size_bytes
        else:
            return last
        if not create:
            return None
        return self._add(create_offset, first=last is None)

    def _add(self, start_offset: int, *, first: bool) -> Segment:
        if self.read_only:
            raise PermissionError(f"{self.directory}: the queue is read-only")
        seg = self._allocator(start_offset)
        if seg.start_offset != start_offset or seg.size_bytes != self.segment_size_bytes:
            seg.close()
            raise ValueError(
                f"allocator returned {seg!r}; expected start {start_offset}, "
                f"size {self.segment_size_bytes}"
            )
        seg.first_in_queue = first
        self._segments[start_offset] = seg
        return seg

    def roll(self) -> Segment:
        """End the last segment with a BLANK record and start the next one.

        The BLANK header (TOTALSIZE = bytes left, BLANK magic) goes where the next record
        would have gone, into the write buffer or the mapping, and the segment is marked
        full. A last segment with fewer than 8 bytes left is just marked full. Appender
        only. Returns the new last segment. Raises SegmentAllocationError, StoreIOError.
        """
        last = self.last()
        if last is None:
            return self.get_last(0)  # type: ignore[return-value]  # create=True never None
        if not last.is_full():
            left = last.size_bytes - last.wrote_position
            if left >= END_FILE_MIN_BLANK_LENGTH:
                write_blank(last.target, last.wrote_position, left)
            last.wrote_position = last.size_bytes
            if not last.has_write_buffer:
                last.committed_position = last.size_bytes
        return self._add(last.start_offset + self.segment_size_bytes, first=False)

    # --- commit and flush -------------------------------------------------------------

    def commit(self, least_pages: int) -> int:
        """Commit the segment at `committed_where`; return bytes advanced (0 = none).

        Committer only. RocketMQ's `commit()` returning true <=> this returning 0.
        """
        seg = self.find(self.committed_where, first_if_not_found=self.committed_where == 0)
        if seg is None:
            return 0
        where = seg.start_offset + seg.commit(least_pages)
        advanced = where - self.committed_where
        self.committed_where = where
        return advanced

    def flush(self, least_pages: int) -> int:
        """Flush the segment at `flushed_where`; return bytes advanced (0 = none).

        Flusher only. With least_pages 0 the store timestamp of the last record the
        segment held before the flush becomes `store_timestamp` (the checkpoint's physic
        timestamp). RocketMQ's `flush()` returning true <=> this returning 0.
        Raises StoreIOError: the store must then stay read-only.
        """
        seg = self.find(self.flushed_where, first_if_not_found=self.flushed_where == 0)
        if seg is None:
            return 0
        ts = seg.store_timestamp
        where = seg.start_offset + seg.flush(least_pages)
        advanced = where - self.flushed_where
        self.flushed_where = where
        if least_pages == 0 and ts > 0:
            self.store_timestamp = ts
        return advanced

    def flush_plan(self, least_pages: int) -> list[tuple[Segment, int]]:
        """What `flush(least_pages)` repeated until nothing advances would force, without
        forcing it: (segment, position to mark flushed) from `flushed_where` on, each
        segment that `able_to_flush(least_pages)`, going on past full ones. For a flush
        done in another thread (`workers.cq_flusher`): force each segment up to its position
        there, then `note_flushed` here. A segment already flushed that far (a full one
        whose flushed position only needs to move on) is listed too; force it or not.
        O(segments listed)."""
        out: list[tuple[Segment, int]] = []
        at = self.flushed_where
        seg = self.find(at, first_if_not_found=at == 0)
        while seg is not None and seg.able_to_flush(least_pages):
            out.append((seg, seg.read_position))
            if not seg.is_full():
                break
            seg = self.find(seg.start_offset + seg.size_bytes)
        return out

    def note_flushed(self, seg: Segment, position: int) -> None:
        """`seg`, forced elsewhere up to `position` (`flush_plan`), is flushed that far:
        its flushed position and `flushed_where` move up (never down, never past what
        is readable; nothing for a segment no longer in the queue)."""
        if self._segments.get(seg.start_offset) is not seg:
            return
        position = min(position, seg.read_position)
        if position > seg.flushed_position:
            seg.flushed_position = position
        self.flushed_where = max(self.flushed_where, seg.start_offset + seg.flushed_position)

    def commit_all(self, *, max_rounds: int = 1_000_000) -> int:
        """`commit(0)` until nothing advances; return total bytes advanced."""
        return _until_no_progress(self.commit, max_rounds)

    def flush_all(self, *, max_rounds: int = 1_000_000) -> int:
        """`flush(0)` until nothing advances; return total bytes advanced."""
        return _until_no_progress(self.flush, max_rounds)

    # --- offsets ----------------------------------------------------------------------

    def min_offset(self) -> int:
        """Start of the first readable segment; -1 if there is none (CommitLog.getMinOffset:
        a first segment that is being destroyed gives the next one's start)."""
        first = self.first()
        if first is None:
            return -1
        if first.available:
            return first.start_offset
        return first.start_offset + self.segment_size_bytes

    def max_offset(self) -> int:
        """Log offset one past the last readable byte (0 if empty)."""
        last = self.last()
        return 0 if last is None else last.start_offset + last.read_position

    def max_wrote_offset(self) -> int:
        """Log offset one past the last appended byte (0 if empty)."""
        last = self.last()
        return 0 if last is None else last.start_offset + last.wrote_position

    def remain_to_commit(self) -> int:
        return self.max_wrote_offset() - self.committed_where

    def remain_to_flush(self) -> int:
        return self.max_offset() - self.flushed_where

    # --- cutting the tail -------------------------------------------------------------

    def truncate_dirty(self, offset: int) -> TruncateResult:
        """Cut the log at `offset` (recovery: the end of the last valid record).

        The segment holding `offset` gets all positions set to `offset - start`, and its
        bytes from there to its end are overwritten with zeros (pwrite + fdatasync), so
        no stale record past the cut can look valid to a later scan (RocketMQ leaves them;
        a later crash could then resurrect them). Segments that start past `offset` are
        destroyed. `committed_where` / `flushed_where` are clamped to `offset`.
        Recovery only, before anything is appended. O(bytes zeroed).
        """
        deleted = 0
        zeroed = 0
        for seg in list(self._segments.values()):
            if seg.start_offset + seg.size_bytes <= offset:
                continue
            if offset >= seg.start_offset:
                pos = offset - seg.start_offset
                if seg.has_write_buffer:
                    seg.commit(0)  # bytes below the cut that are still only in the buffer
                zeroed += seg.zero_tail(pos)
                seg.adopt_positions(pos, pos, pos)
            else:
                self._destroy_now(seg)
                del self._segments[seg.start_offset]
                deleted += 1
        if deleted:
            fileio.fsync_dir(self.directory)
        self.committed_where = min(self.committed_where, offset)
        self.flushed_where = min(self.flushed_where, offset)
        return TruncateResult(offset, deleted, zeroed)

    def _destroy_now(self, seg: Segment) -> None:
        if not seg.destroy(TRUNCATE_DESTROY_INTERVAL_MS) and not seg.destroy(0):
            raise RuntimeError(f"{seg.path}: could not be destroyed")

    def delete_last(self) -> None:
        """Destroy the last segment and drop it (RocketMQ's deleteLastMappedFile)."""
        last = self.last()
        if last is not None:
            self._destroy_now(last)
            del self._segments[last.start_offset]

    # --- retention --------------------------------------------------------------------

    def delete_expired_by_time(
        self,
        expired_ms: int,
        *,
        delete_files_interval_ms: int,
        interval_forcibly_ms: int,
        clean_immediately: bool,
        max_files: int = DELETE_FILES_BATCH_MAX,
        sleep_ms: SleepMs = _sleep_ms,
        keep_from_offset: int | None = None,
    ) -> int:
        """RocketMQ's deleteExpiredFileByTime; returns how many segments were deleted.

        Considers every segment but the last, oldest first: one whose mtime +
        `expired_ms` <= now (the injected clock), or any with `clean_immediately`, is
        destroyed; at most `max_files` per call; `delete_files_interval_ms` is slept
        between deletions; the first segment that is not expired, or whose destroy
        fails (still held), stops the scan ("never delete in the middle").
        With `keep_from_offset`, only segments that end at or below it are considered
        (the cleaner passes min(flushed, dispatched, checkpointed)).
        Cleaner only. Raises StoreIOError.
        """
        candidates = self.segments[:-1]
        if keep_from_offset is not None:
            candidates = [
                s for s in candidates if s.start_offset + s.size_bytes <= keep_from_offset
            ]
        deleted: list[Segment] = []
        for i, seg in enumerate(candidates):
            if not (self._clock_ms() >= seg.last_modified_ms() + expired_ms or clean_immediately):
                break
            if not seg.destroy(interval_forcibly_ms):
                break
            deleted.append(seg)
            if len(deleted) >= max_files:
                break
            if delete_files_interval_ms > 0 and i + 1 < len(candidates):
                sleep_ms(delete_files_interval_ms)
        for seg in deleted:
            del self._segments[seg.start_offset]
        return len(deleted)

    def delete_expired_by_offset(
        self, offset: int, unit_size_bytes: int, *, max_files: int = DELETE_FILES_BATCH_MAX
    ) -> int:
        """RocketMQ's deleteExpiredFileByOffset (consume queues); returns segments deleted.

        For every segment but the last, oldest first: read the first 8 bytes of its
        last unit (at `size - unit_size_bytes`); the segment goes if that long is below
        `offset`. A segment whose last unit is not readable goes only if it is already
        unavailable (an earlier destroy hung); otherwise the scan stops. At most
        `max_files` per call. Cleaner only.
        """
        deleted: list[Segment] = []
        for seg in self.segments[:-1]:
            unit_pos = seg.size_bytes - unit_size_bytes
            sl = seg.select(unit_pos, 8)
            if sl.status is ReadStatus.OK:
                with sl:
                    destroy = int.from_bytes(sl.view, "big", signed=True) < offset
            elif not seg.available:
                destroy = True
            else:
                break
            if not destroy or not seg.destroy(60_000):
                break
            deleted.append(seg)
            if len(deleted) >= max_files:
                break
        for seg in deleted:
            del self._segments[seg.start_offset]
        return len(deleted)

    def retry_delete_first(self, interval_forcibly_ms: int) -> bool:
        """Destroy a first segment whose earlier destroy hung; True if it is gone now."""
        first = self.first()
        if first is None or first.available:
            return False
        if first.destroy(interval_forcibly_ms):
            del self._segments[first.start_offset]
            return True
        return False

    # --- lifecycle --------------------------------------------------------------------

    def shutdown(self, interval_forcibly_ms: int) -> None:
        """Shut every segment down (unmap once no reader holds it)."""
        for seg in self._segments.values():
            seg.shutdown(interval_forcibly_ms)

    def want_prepared(self) -> int | None:
        """Where the next segment starts, when it is worth making ahead of need in another
        thread (the last segment is at least half written and none is prepared for it):
        that thread runs `Segment.prepare(directory, start, size, PREPARED_SUFFIX)` (from
        `engine.segment_files`) and puts the path in `prepared`, and the roll is then a
        rename (`_add`). None otherwise. Writable queues with the default allocator only. O(1)."""
        last = self.last()
        if last is None or self.read_only or self._allocator != self._create_in_place:
            return None
        if last.wrote_position * 2 < last.size_bytes:
            return None
        start = last.start_offset + self.segment_size_bytes
        return None if start in self.prepared else start

    def stale_prepared(self) -> list[str]:
        """Take the prepared files no roll can use any more (they start at or before
        the last segment: it was made without them); the caller deletes them."""
        last = self.last()
        end = -1 if last is None else last.start_offset
        return [self.prepared.pop(k) for k in [k for k in self.prepared if k <= end]]

    def close(self) -> None:
        """Unmap and close every segment now, keeping the files (prepared ones are
        deleted). Process exit, tests."""
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
        for tmp in self.prepared.values():
            fileio.unlink(tmp, missing_ok=True)
        self.prepared.clear()

    def destroy(self) -> None:
        """Delete every segment and, if it is then empty, the directory. Tests only."""
        for seg in list(self._segments.values()):
            self._destroy_now(seg)
        self._segments.clear()
        self.flushed_where = 0
        self.committed_where = 0
        if os.path.isdir(self.directory) and not os.listdir(self.directory):
            os.rmdir(self.directory)

    # --- self-check -------------------------------------------------------------------

    def check(self, *, deep: bool = False) -> list[Finding]:
        """The chain (adjacency, names, sizes), positions, and every segment's check()."""
        out = list(self._load_findings)

        def err(what: str, path: str | None = None, offset: int | None = None) -> None:
            out.append(Finding(Severity.ERROR, what, path, offset))

        if self._skipped_empty_last is not None:
            out.append(
                Finding(
                    Severity.WARNING,
                    "empty last segment file (an unfinished pre-allocation); skipped",
                    self._skipped_empty_last,
                )
            )
        segs = self.segments
        for prev, seg in itertools.pairwise(segs):
            gap = seg.start_offset - prev.start_offset
            if gap != self.segment_size_bytes:
                err(
                    f"segment starts {gap} bytes after the previous one; "
                    f"expected {self.segment_size_bytes}",
                    seg.path,
                    seg.start_offset,
                )
            if not prev.is_full():
                err(
                    f"segment is not full (wrote {prev.wrote_position}) but is not the last",
                    prev.path,
                    prev.start_offset + prev.wrote_position,
                )
        for seg in segs:
            if seg.file_name != segment_file_name(seg.start_offset):
                err("name does not match start offset", seg.path)
            out.extend(seg.check(deep=deep))
        if segs and self.committed_where > self.max_wrote_offset():
            err(
                f"committed_where {self.committed_where} is past the last byte "
                f"appended ({self.max_wrote_offset()})"
            )
        if segs and self.flushed_where > self.max_offset():
            err(
                f"flushed_where {self.flushed_where} is past the readable end ({self.max_offset()})"
            )
        return out
