"""One commit-log segment: RocketMQ's MappedFile (spec §8.1, §8.2).

A segment is a pre-allocated file of `size_bytes` bytes named by its start offset in
the log, as 20 zero-padded decimal digits (`00000000000067108864`). It keeps three
positions, each relative to the start of the file and each with one writer:

| position             | meaning                                   | written only by              |
| -------------------- | ----------------------------------------- | ---------------------------- |
| `wrote_position`     | end of the bytes appended so far          | the appender (CommitLog)     |
| `committed_position` | end of the bytes that are in the file     | the committer (`commit*`)    |
| `flushed_position`   | end of the bytes forced to the disk       | the flusher (`flush*`)       |

Invariant: `flushed <= read_position <= wrote <= size_bytes`, where the read position
is `committed` when a write buffer is attached and `wrote` otherwise (RocketMQ 4.9.8).

Two write paths, as RocketMQ's:

* **mmap path** (no write buffer): records are copied straight into the file's shared
  mapping; the bytes are in the file as soon as they are written, so the read position
  is `wrote_position`. `committed_position` only catches up with it when `commit()` is
  called (RocketMQ's commit returns the wrote position and does nothing else).
* **write-buffer path** (RocketMQ's TransientStorePool): records are copied into an
  external buffer of at least `size_bytes` bytes whose byte *i* mirrors byte *i* of the
  file. Any writable buffer will do: a `bytearray`, an anonymous `mmap`, or a
  `memoryview` of shared memory (the runtime's pool). `commit()` copies
  `[committed, wrote)` to the file with `pwrite`; once the whole segment is committed
  the buffer is handed back through `on_buffer_done` and the segment becomes a plain
  mmap segment.

**Flushing.** Data that went through `pwrite` is forced with `fdatasync`, data written
through the mapping by `mmap_sync` (`engine.filesync.SyncMethod`, which says why
fdatasync is the default on Linux).

**Reference counting** (RocketMQ's ReferenceResource, `engine.refcount`): `hold()` /
`release()`; at zero the file is unmapped and its descriptor closed. `destroy()` is
shutdown, then (once clean) unlink. Every read slice holds one reference until it is
released.

**Positions driven from outside.** The multi-process runtime keeps positions in shared
memory and runs the commit and flush rules itself. It opens the same file in each
process and uses three primitives that apply no RocketMQ rule:

* `adopt_positions(wrote, committed, flushed)`: take the positions as the control
  block says (validated: `0 <= flushed <= committed <= wrote <= size_bytes`, and
  without a write buffer `committed == wrote` is enforced by setting it).
* `commit_range(buf, start, end)`: `pwrite(buf[start:end])` at file offset `start`;
  `committed := max(committed, end)`. `buf` is segment-relative (byte *i* of `buf` is
  byte *i* of the file). The caller decides when a pool buffer goes back.
* `flush_to(position, *, wrote_through_pwrite)`: force the file's data up to
  `position`; `flushed := max(flushed, position)`. The flusher process did not do the
  pwrite itself, so it says which call forces the data.

Thread safety: positions have one writer each and are plain ints (atomic to read under
the GIL). Reference counts are under a lock. One appender at a time.
"""

from __future__ import annotations

import enum
import errno
import logging
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypedDict, Unpack

from mqstore.engine import fileio, memlock
from mqstore.engine.filesync import DEFAULT_MMAP_SYNC, FileSync, SyncMethod
from mqstore.engine.findings import Finding, Severity
from mqstore.engine.record import WritableBuffer
from mqstore.engine.refcount import ReferenceCounted

log = logging.getLogger(__name__)

OS_PAGE_SIZE: Final = 4096
FILE_NAME_DIGITS: Final = 20

ClockMs = Callable[[], int]
BufferDone = Callable[[WritableBuffer], None]


def now_ms() -> int:
    """Wall-clock milliseconds (the default clock; tests inject their own)."""
    return time.time_ns() // 1_000_000


def segment_file_name(start_offset: int) -> str:
    """RocketMQ's `offset2FileName`: the start offset as 20 zero-padded digits."""
    if start_offset < 0:
        raise ValueError(f"segment start offset must be >= 0, got {start_offset}")
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"


def parse_segment_file_name(name: str) -> int:
    """Inverse of `segment_file_name`; raises SegmentNameError for anything else."""
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        raise SegmentNameError(name)
    return int(name)


class SegmentNameError(ValueError):
    """A segment file's name is not its start offset in 20 decimal digits."""

    def __init__(self, name: str) -> None:
        super().__init__(f"segment file name {name!r} is not 20 decimal digits")
        self.name = name


class SegmentSizeError(ValueError):
    """A segment file's size on disk is not the configured segment size."""

    def __init__(self, path: str, actual_bytes: int, expected_bytes: int) -> None:
        super().__init__(
            f"segment file {path} is {actual_bytes} bytes; every segment must be "
            f"{expected_bytes} bytes (segment_size_bytes)"
        )
        self.path = path
        self.actual_bytes = actual_bytes
        self.expected_bytes = expected_bytes


class ReadStatus(enum.Enum):
    OK = "OK"
    BEYOND_READ_POSITION = "BEYOND_READ_POSITION"  # asked for bytes not readable yet
    UNAVAILABLE = "UNAVAILABLE"  # the segment is shutting down or destroyed


class SegmentSlice:
    """A read-only view of segment bytes that holds one reference on the segment.

    Release it exactly once (`release()` or a `with` block); until then the segment is
    not unmapped unless forcibly destroyed. `physical_offset` is the log offset of
    `view[0]`. A slice whose status is not OK has an empty view and holds nothing.
    Do not keep sub-views of `view` past `release()`.
    """

    __slots__ = ("_segment", "physical_offset", "status", "view")

    def __init__(
        self, status: ReadStatus, physical_offset: int, view: memoryview, segment: Segment | None
    ) -> None:
        self.status = status
        self.physical_offset = physical_offset
        self.view = view
        self._segment = segment

    def __len__(self) -> int:
        return len(self.view)

    def release(self) -> None:
        seg = self._segment
        if seg is None:
            return
        self._segment = None
        self.view.release()
        seg.release()

    def __enter__(self) -> SegmentSlice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class WarmResult:
    pages_touched: int
    locked: bool  # mlock succeeded
    reason: str  # why it did not lock, if it did not


class MapOptions(TypedDict, total=False):
    """How segment files are forced and timed: the keywords a queue of segments takes
    and passes on to each `Segment` it opens (defaults: `Segment.__init__`'s)."""

    mmap_sync: SyncMethod
    clock_ms: ClockMs


class SegmentOptions(MapOptions, total=False):
    """All of `Segment`'s keywords, for the constructors that pass them on."""

    read_only: bool
    write_buffer: WritableBuffer | None
    on_buffer_done: BufferDone | None


class Segment(ReferenceCounted):
    """One segment file, mapped, with its three positions. See the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        size_bytes: int,
        *,
        read_only: bool = False,
        write_buffer: WritableBuffer | None = None,
        on_buffer_done: BufferDone | None = None,
        mmap_sync: SyncMethod = DEFAULT_MMAP_SYNC,
        clock_ms: ClockMs = now_ms,
    ) -> None:
        """Open an existing segment file with all positions at `size_bytes`, as RocketMQ's
        load sets them (recovery, or the runtime, then calls `adopt_positions`). A new
        file: `Segment.create`, or `Segment.install` after `prepare`. Raises
        SegmentNameError, SegmentSizeError, StoreIOError.
        """
        super().__init__(clock_ms)
        self.path = os.fspath(path)
        self.file_name = os.path.basename(self.path)
        self.start_offset = parse_segment_file_name(self.file_name)
        self.size_bytes = size_bytes
        self.read_only = read_only
        self.mmap_sync = mmap_sync
        if write_buffer is not None:
            if read_only:
                raise ValueError("a read-only segment cannot take a write buffer")
            if len(write_buffer) < size_bytes:
                raise ValueError(
                    f"write buffer is {len(write_buffer)} bytes; the segment needs {size_bytes}"
                )
        self._fd = fileio.open_file(self.path, create=False, read_only=read_only)
        try:
            actual = os.fstat(self._fd).st_size
            if actual != size_bytes:
                raise SegmentSizeError(self.path, actual, size_bytes)
            self._mm: mmap.mmap | None = fileio.mmap_file(
                self._fd, size_bytes, writable=not read_only, path=self.path
            )
        except BaseException:
            fileio.close(self._fd, self.path)
            raise
        self._fd_open = True
        self._write_buffer = write_buffer
        self._on_buffer_done = on_buffer_done
        # The buffer appends go into: the write buffer when there is one, else the mapping.
        self.target: WritableBuffer = write_buffer if write_buffer is not None else self._mm
        self._wrote_through_pwrite = write_buffer is not None
        self._unmap_deferred = False
        self._locked = False
        self.store_timestamp = 0  # store timestamp of the last record appended
        self.first_in_queue = False
        self.wrote_position = size_bytes
        self.committed_position = size_bytes
        self.flushed_position = size_bytes

    # --- construction -----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        start_offset: int,
        size_bytes: int,
        *,
        zero_fill: bool = False,
        zero_write: int = fileio.ZERO_CHUNK,
        **options: Unpack[SegmentOptions],
    ) -> Segment:
        """Create, pre-allocate and open a new empty segment (positions 0, 0, 0).

        The file is built as `<name>.tmp` (fallocate, with `zero_fill` every byte written
        as zeros, fsync), renamed into place and the directory fsynced, so a crash never
        leaves a short file under a segment name. Cost: one fallocate of `size_bytes`
        (and a write of it) plus two fsyncs; the allocator's job, never the hot path.
        Raises FileExistsError if the segment exists, StoreIOError.
        """
        if size_bytes <= 0:
            raise ValueError(f"segment size must be positive, got {size_bytes}")
        directory = os.fspath(directory)
        path = os.path.join(directory, segment_file_name(start_offset))
        if os.path.exists(path):
            raise FileExistsError(errno.EEXIST, f"segment {path} already exists")
        tmp = cls.prepare(
            directory, start_offset, size_bytes, zero_fill=zero_fill, zero_write=zero_write
        )
        fileio.rename(tmp, path)
        fileio.fsync_dir(directory)
        return cls.install(path, size_bytes, **options)

    @staticmethod
    def prepare(
        directory: str,
        start_offset: int,
        size_bytes: int,
        suffix: str = ".tmp",
        *,
        zero_fill: bool = False,
        zero_write: int = fileio.ZERO_CHUNK,
    ) -> str:
        """The first half of `create`, ahead of need: `<name><suffix>` allocated
        (fallocate; with `zero_fill` written as zeros, a chunk at a time, each forced: no
        extent is left unwritten, so no later fdatasync of it has to convert one and
        commit the journal; fsync; `zero_write` bytes per write, `fileio.preallocate`) and
        left there; returns its path. `fileio.rename` it
        to its name, then `install`; the directory's fsync is the caller's (before
        anything counts on the file surviving a crash). A writable `SegmentQueue.load`
        deletes `.tmp` leftovers. Raises StoreIOError (no file left behind)."""
        tmp = os.path.join(directory, segment_file_name(start_offset) + suffix)
        fileio.preallocate(
            tmp,
            size_bytes,
            zeros_from_start=size_bytes if zero_fill else 0,
            sync_chunks=True,
            zero_write=zero_write,
        )
        return tmp

    @classmethod
    def install(cls, path: str, size_bytes: int, **options: Unpack[SegmentOptions]) -> Segment:
        """Open a file `prepare` made, renamed to its name, as a new empty segment."""
        seg = cls(path, size_bytes, **options)
        seg.adopt_positions(0, 0, 0)
        return seg

    # --- positions --------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """The log offset one past this segment's last byte."""
        return self.start_offset + self.size_bytes

    @property
    def has_write_buffer(self) -> bool:
        return self._write_buffer is not None

    @property
    def read_position(self) -> int:
        """Readers see bytes below this: committed with a write buffer, else wrote."""
        return self.committed_position if self._write_buffer is not None else self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position == self.size_bytes

    def adopt_positions(self, wrote: int, committed: int, flushed: int) -> None:
        """Take positions given from outside (load, recovery, the runtime's control block).

        Without a write buffer `committed` is set to `wrote`. Raises ValueError unless
        `0 <= flushed <= read position <= wrote <= size_bytes`.
        """
        if self._write_buffer is None:
            committed = wrote
        if not 0 <= flushed <= committed <= wrote <= self.size_bytes:
            raise ValueError(
                f"{self.file_name}: positions must satisfy 0 <= flushed ({flushed}) <= "
                f"committed ({committed}) <= wrote ({wrote}) <= size ({self.size_bytes})"
            )
        self.wrote_position = wrote
        self.committed_position = committed
        self.flushed_position = flushed

    # --- appending --------------------------------------------------------------------

    def append_bytes(self, data: bytes | bytearray | memoryview) -> bool:
        """Append raw bytes at the wrote position (RocketMQ's `appendMessage(byte[])`).

        Into the write buffer when there is one (RocketMQ writes into the mapping even
        then, which a later commit would overwrite). False when it does not fit.
        """
        n = len(data)
        pos = self.wrote_position
        if pos + n > self.size_bytes:
            return False
        self.target[pos : pos + n] = data
        self.wrote_position = pos + n
        return True

    # --- commit -----------------------------------------------------------------------

    def able_to_commit(self, least_pages: int) -> bool:
        """RocketMQ's isAbleToCommit: full; or whole pages wrote/4096 - committed/4096 >=
        least_pages (no byte alignment); or, for least_pages <= 0, anything new."""
        if self.is_full():
            return True
        if least_pages > 0:
            return (
                self.wrote_position // OS_PAGE_SIZE - self.committed_position // OS_PAGE_SIZE
                >= least_pages
            )
        return self.wrote_position > self.committed_position

    def commit(self, least_pages: int) -> int:
        """Copy the write buffer's `[committed, wrote)` to the file; return committed.

        Committer only. No write buffer: nothing to copy, returns the wrote position.
        Once the whole segment is committed the buffer goes back through
        `on_buffer_done` and the segment reads and flushes as a plain mmap segment.
        Cost: one pwrite of the new bytes. Raises StoreIOError (committed unchanged).
        """
        buf = self._write_buffer
        if buf is None:
            self.committed_position = self.wrote_position
            return self.wrote_position
        if self.able_to_commit(least_pages) and self.hold():
            try:
                start, end = self.committed_position, self.wrote_position
                if end > start:
                    self._pwrite(buf, start, end)
                    self.committed_position = end
            finally:
                self.release()
        if self.committed_position == self.size_bytes:
            self._give_back_buffer()
        return self.committed_position

    def commit_range(self, buf: WritableBuffer, start: int, end: int) -> int:
        """Runtime primitive: pwrite `buf[start:end]` at file offset `start`; no rules.

        `committed := max(committed, end)` (wrote is raised to match if it lags, since
        the runtime tracks wrote elsewhere). Returns the bytes written. Raises
        ValueError for a bad range, StoreIOError on I/O failure.
        """
        if not 0 <= start <= end <= self.size_bytes or len(buf) < end:
            raise ValueError(f"{self.file_name}: bad commit range [{start}, {end})")
        if end == start:
            return 0
        self._pwrite(buf, start, end)
        if end > self.committed_position:
            self.committed_position = end
            if end > self.wrote_position:
                self.wrote_position = end
        return end - start

    def _pwrite(self, buf: WritableBuffer, start: int, end: int) -> None:
        view = memoryview(buf)
        try:
            fileio.pwrite(self._fd, view[start:end], start, self.path, piece=fileio.COMMIT_PIECE)
        finally:
            view.release()
        self._wrote_through_pwrite = True

    def _give_back_buffer(self) -> None:
        buf = self._write_buffer
        if buf is None:
            return
        self._write_buffer = None
        assert self._mm is not None
        self.target = self._mm
        if self._on_buffer_done is not None:
            self._on_buffer_done(buf)

    def zero_tail(self, pos: int) -> int:
        """Overwrite `[pos, size)` with zeros in the file (pwrite + fdatasync) and in the
        write buffer; return the bytes zeroed. Recovery only (truncate_dirty). O(bytes)."""
        n = self.size_bytes - pos
        if n <= 0:
            return 0
        if self._write_buffer is not None:
            self._write_buffer[pos : self.size_bytes] = bytes(n)
        chunk = memoryview(bytes(min(n, 1 << 20)))
        at = pos
        while at < self.size_bytes:
            k = min(len(chunk), self.size_bytes - at)
            fileio.pwrite(self._fd, chunk[:k], at, self.path)
            at += k
        fileio.fdatasync(self._fd, self.path)
        return n

    def detach_write_buffer(self) -> WritableBuffer | None:
        """Take the write buffer away without giving it back (runtime hand-over)."""
        buf = self._write_buffer
        self._write_buffer = None
        if self._mm is not None:
            self.target = self._mm
        return buf

    # --- flush ------------------------------------------------------------------------

    def able_to_flush(self, least_pages: int) -> bool:
        """RocketMQ's isAbleToFlush, on the read position (see `able_to_commit`)."""
        if self.is_full():
            return True
        read = self.read_position
        if least_pages > 0:
            return read // OS_PAGE_SIZE - self.flushed_position // OS_PAGE_SIZE >= least_pages
        return read > self.flushed_position

    def flush(self, least_pages: int) -> int:
        """Force dirty bytes up to the read position to disk; return the flushed position.

        Flusher only. fdatasync for data that went through pwrite, `mmap_sync` for the
        mmap path; no syscall when nothing is new. If the segment is being destroyed the
        position just moves (RocketMQ). Cost: one fdatasync/msync. Raises StoreIOError,
        after which the store stays read-only until restart (flushed unchanged).
        """
        if self.able_to_flush(least_pages):
            if self.hold():
                try:
                    value = self.read_position
                    if value > self.flushed_position:
                        self._force(self.flushed_position, value, self._wrote_through_pwrite)
                    self.flushed_position = value
                finally:
                    self.release()
            else:
                self.flushed_position = self.read_position
        return self.flushed_position

    def flush_to(self, position: int, *, wrote_through_pwrite: bool) -> int:
        """Runtime primitive: force the file's data up to `position`, no rules.

        `wrote_through_pwrite` says whether the bytes came through `commit_range` (in
        another process) or the mapping. `flushed := max(flushed, position)`; returns it.
        """
        if not 0 <= position <= self.size_bytes:
            raise ValueError(f"{self.file_name}: bad flush position {position}")
        if position > self.flushed_position:
            self._force(self.flushed_position, position, wrote_through_pwrite)
            self.flushed_position = position
        return self.flushed_position

    def sync_handle(self, position: int) -> FileSync:
        """What forcing the file up to `position` takes, for a thread that does not write
        it (`workers.cq_flusher`): a duplicate of the descriptor (fdatasync covers data
        written through the mapping, see `SyncMethod`), or the mapping held for msync.
        The flushed position stays this segment's owner's to move (`SegmentQueue.note_flushed`).
        Raises StoreIOError."""
        if self.mmap_sync is SyncMethod.FDATASYNC or self._wrote_through_pwrite:
            return FileSync(fileio.dup(self._fd, self.path), self.path)
        if not self.hold():
            return FileSync(-1, self.path)  # being destroyed: nothing to force (flush() too)
        assert self._mm is not None
        return FileSync(-1, self.path, mapping=self._mm, length=position, release=self.release)

    def _force(self, start: int, end: int, through_pwrite: bool) -> None:
        if through_pwrite or self.mmap_sync is SyncMethod.FDATASYNC or self._mm is None:
            fileio.fdatasync(self._fd, self.path)
        else:
            fileio.msync(self._mm, start, end - start, self.path)

    # --- reading ----------------------------------------------------------------------

    def select(self, pos: int, size: int = -1) -> SegmentSlice:
        """A held read-only slice `[pos, pos+size)`, or `[pos, read position)` for size -1.

        BEYOND_READ_POSITION when the bytes are not all readable yet; UNAVAILABLE when
        the segment is shutting down. O(1), no copy. Any reader may call it.
        """
        read = self.read_position
        end = read if size < 0 else pos + size
        if pos < 0 or end > read or pos > end or (size < 0 and pos >= read):
            return SegmentSlice(
                ReadStatus.BEYOND_READ_POSITION, self.start_offset + pos, memoryview(b""), None
            )
        if not self.hold():
            return SegmentSlice(
                ReadStatus.UNAVAILABLE, self.start_offset + pos, memoryview(b""), None
            )
        mm = self._mm
        assert mm is not None  # held, so not cleaned up
        whole = memoryview(mm)
        view = whole[pos:end].toreadonly()
        whole.release()
        return SegmentSlice(ReadStatus.OK, self.start_offset + pos, view, self)

    def read_bytes(self, pos: int, size: int) -> bytes:
        """A copy of `[pos, pos+size)` clipped to the read position (b"" if none)."""
        with self.select(pos, min(size, max(self.read_position - pos, 0))) as s:
            return bytes(s.view)

    def last_modified_ms(self) -> int:
        """The file's mtime in ms (drives time-based deletion, as RocketMQ's)."""
        return os.stat(self.path).st_mtime_ns // 1_000_000

    # --- warm-up ----------------------------------------------------------------------

    def warm(self, *, sync_every_pages: int = 0, lock: bool = True) -> WarmResult:
        """Pre-fault a fresh segment (RocketMQ's warmMappedFile, spec §8.2).

        Writes one zero byte per 4096-byte page through the mapping; with
        `sync_every_pages` > 0 (SYNC_FLUSH) forces every that many pages and at the end;
        then mlock + madvise(WILLNEED). mlock may be refused (RLIMIT_MEMLOCK): that is
        logged as a warning and reported, and warm-up still counts. Allocator only, on a
        segment nothing was appended to (raises ValueError otherwise). O(size).
        """
        if self.wrote_position != 0 or self._mm is None or self.read_only:
            raise ValueError(f"{self.file_name}: only a fresh writable segment can be warmed")
        mm = self._mm
        pages = 0
        for i in range(0, self.size_bytes, OS_PAGE_SIZE):
            mm[i] = 0
            pages += 1
            if sync_every_pages > 0 and pages % sync_every_pages == 0:
                self._force(0, i + 1, False)
        if sync_every_pages > 0:
            self._force(0, self.size_bytes, False)
        locked, reason = (False, "not asked") if not lock else self._mlock(True)
        mm.madvise(mmap.MADV_WILLNEED)
        return WarmResult(pages, locked, reason)

    def munlock(self) -> None:
        """Undo the warm-up's mlock (RocketMQ does it 6 s after rolling a warmed file)."""
        if self._locked:
            self._mlock(False)

    def _mlock(self, on: bool) -> tuple[bool, str]:
        if self._mm is None:
            return False, "unmapped"
        reason = memlock.set_locked(self._mm, self.size_bytes, locked=on)
        if reason:
            if on:
                log.warning(
                    "%s: %s (RLIMIT_MEMLOCK is often 8 MiB); going on unlocked",
                    self.file_name,
                    reason,
                )
            return False, reason
        self._locked = on
        return on, ""

    # --- lifecycle --------------------------------------------------------------------

    def _cleanup(self, current_ref: int) -> bool:
        if self.available:
            return False
        if self._cleanup_over:
            return True
        mm = self._mm
        self._mm = None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # Views of the mapping are still held (zero-copy reads hand them out:
                # `engine.record.RecordView`): leave the mapping to the garbage
                # collector, which unmaps it when the last view goes; the file can
                # still be unlinked (its pages live while mapped). check() reports it.
                self._unmap_deferred = True
        self.target = memoryview(b"")  # appends after cleanup fail loudly
        self._write_buffer = None
        if self._fd_open:
            self._fd_open = False
            fileio.close(self._fd, self.path)
        return True

    def destroy(self, interval_forcibly_ms: int) -> bool:
        """Shut down and, once cleaned up, delete the file. False: still held; retry later.

        Cleaner / queue only. Raises StoreIOError if the unlink fails.
        """
        self.shutdown(interval_forcibly_ms)
        if not self.is_cleanup_over():
            return False
        fileio.unlink(self.path, missing_ok=True)
        return True

    def close(self) -> None:
        """Unmap and close without deleting (process exit, tests' reopen). Forces."""
        self.shutdown(0)
        self.shutdown(0)

    # --- self-check -------------------------------------------------------------------

    def check(self, *, deep: bool = False) -> list[Finding]:
        """Position invariants, file size and name; `deep` also compares the write buffer's
        committed bytes with the file (O(committed bytes))."""
        out: list[Finding] = []

        def err(what: str, offset: int | None = None) -> None:
            out.append(Finding(Severity.ERROR, what, self.path, offset))

        w, c, f = self.wrote_position, self.committed_position, self.flushed_position
        if not 0 <= w <= self.size_bytes:
            err(f"wrote position {w} outside [0, {self.size_bytes}]")
        if not c <= w:
            err(f"committed position {c} is past the wrote position {w}")
        if not 0 <= f <= self.read_position:
            err(f"flushed position {f} outside [0, read position {self.read_position}]")
        if self.available:
            if self._mm is None:
                err("available but not mapped")
            try:
                actual = os.stat(self.path).st_size
                if actual != self.size_bytes:
                    err(f"file is {actual} bytes, expected {self.size_bytes}")
            except OSError as e:
                err(f"cannot stat the segment file: {e}")
            if self._ref_count < 1:
                err(f"available with reference count {self._ref_count}")
        if self._unmap_deferred:
            out.append(
                Finding(Severity.WARNING, "unmapped late: views of it were still held", self.path)
            )
        if (
            deep
            and self._write_buffer is not None
            and self._mm is not None
            and bytes(memoryview(self._write_buffer)[:c]) != self._mm[:c]
        ):
            err("write buffer and file differ below the committed position")
        return out

    def __repr__(self) -> str:
        return (
            f"Segment({self.file_name}, size={self.size_bytes}, wrote={self.wrote_position}, "
            f"committed={self.committed_position}, flushed={self.flushed_position}, "
            f"buffer={self._write_buffer is not None}, refs={self._ref_count})"
        )
