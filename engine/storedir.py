"""Read side of any store directory (mqstore's or RocketMQ's), and the live-store flushed offset.

`StoreDir` opens a store read-only: it works out the commit-log geometry (from the files,
or from settings when the files cannot tell), opens the commit log without writing a
byte, and checks the whole directory (`check()`): the file chain, every record (CRC on),
the checkpoint against the log, and the abort file. `mqstore dump` and `mqstore check`
are thin shells over it.

Geometry: the segment size is the one the store records (`engine.geometry`), else the
configured one, else the files': every segment is pre-allocated at full size, so the
largest commit-log file tells it; with one file only, its size. Files that disagree with
the recorded or configured size are ERROR findings. `check()` also opens the index files
as a start would, so it reports what a start refuses.

`<store>/flushed_offset`, written in place by the runtime's flusher, read by every reader of a
live store (readers stop at this offset; stopped stores are read to their last valid record):

| offset | size | field                                   |
|-------:|-----:|-----------------------------------------|
|      0 |    8 | magic `b"MQFLUSH1"`                     |
|      8 |    8 | flushed commit-log offset, big-endian int64 |
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from mqstore.conf.settings import StoreSettings
from mqstore.engine import compression, deleted_topics, fileio
from mqstore.engine.checkpoint import CHECKPOINT_FILE, CheckpointError, CheckpointFields
from mqstore.engine.closing import Closing
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.findings import Finding, Severity
from mqstore.engine.indexfile import IndexGeometryError
from mqstore.engine.indexservice import IndexService
from mqstore.engine.record import SysFlag
from mqstore.engine.scan import BIT_FILLER, RecordScan
from mqstore.engine.segment import SegmentSizeError

FLUSHED_OFFSET_FILE = "flushed_offset"
ABORT_FILE = "abort"
COMMITLOG_DIR = "commitlog"
FLUSHED_OFFSET_MAGIC = b"MQFLUSH1"
_LAYOUT = struct.Struct(">8sq")
FLUSHED_OFFSET_BYTES: Final = _LAYOUT.size


def read_flushed_offset(store_dir: str | os.PathLike[str]) -> int | None:
    """The live store's flushed commit-log offset; None when the file is absent or invalid.

    Opens read-only; one pread of 16 bytes. Any reader may call it.
    """
    path = os.path.join(store_dir, FLUSHED_OFFSET_FILE)
    try:
        fd = fileio.open_file(path, create=False, read_only=True)
    except fileio.StoreIOError:
        return None
    try:
        raw = fileio.pread(fd, FLUSHED_OFFSET_BYTES, 0, path)
    finally:
        fileio.close(fd, path)
    return parse_flushed_offset(raw)


def parse_flushed_offset(raw: bytes) -> int | None:
    """The offset a `flushed_offset` file's bytes hold; None unless they are the 16-byte
    record (magic, big-endian int64 >= 0). The engine's reader and the pipeline's
    (`pipeline.storefs`, through `pyarrow.fs`) both parse with this."""
    if len(raw) != FLUSHED_OFFSET_BYTES:
        return None
    magic, offset = _LAYOUT.unpack(raw)
    if magic != FLUSHED_OFFSET_MAGIC or offset < 0:
        return None
    return int(offset)


def write_flushed_offset(fd: int, offset: int, path: str = "?") -> None:
    """Write the 16-byte record in place at file offset 0 of an fd opened for writing.

    Only the runtime's flusher calls it; it does not fsync (the caller decides).
    """
    if offset < 0:
        raise ValueError(f"flushed offset must be >= 0, got {offset}")
    fileio.pwrite(fd, _LAYOUT.pack(FLUSHED_OFFSET_MAGIC, offset), 0, path)


@dataclass(frozen=True)
class SegmentFile:
    """One commit-log file: its path, the offset its 20-digit name gives, and its size on disk."""

    path: str
    start_offset: int
    size_bytes: int


def list_segments(store_dir: str | os.PathLike[str]) -> list[SegmentFile]:
    """The commit-log files under `<store>/commitlog`, ordered by start offset; stat only, no reads.

    Files whose name is not 20 digits are skipped (a future `check` reports them).
    Empty or short files are listed as they are; judging them is the caller's job.
    """
    log_dir = os.path.join(store_dir, "commitlog")
    if not os.path.isdir(log_dir):
        return []
    found = []
    for name in os.listdir(log_dir):
        if len(name) == 20 and name.isdigit():
            path = os.path.join(log_dir, name)
            found.append(SegmentFile(path, int(name), os.stat(path).st_size))
    return sorted(found, key=lambda s: s.start_offset)


class StoreDirError(ValueError):
    """The directory is not a store that can be opened (no commit log, no geometry)."""


def infer_segment_size(
    segments: list[SegmentFile], configured: int | None
) -> tuple[int, list[Finding]]:
    """The commit-log segment size, and findings where files and configuration disagree.

    Raises StoreDirError when nothing tells the size (no non-empty file, no setting).
    """
    sizes = Counter(s.size_bytes for s in segments if s.size_bytes > 0)
    findings: list[Finding] = []
    from_files = max(sizes) if sizes else None
    if configured is not None:
        for seg in segments:
            if seg.size_bytes not in (0, configured):
                findings.append(
                    Finding(
                        Severity.ERROR,
                        f"file is {seg.size_bytes} bytes; the configured segment size is "
                        f"{configured}",
                        seg.path,
                    )
                )
        return configured, findings
    if from_files is None:
        raise StoreDirError(
            "no non-empty commit-log file tells the segment size; give it with --config"
        )
    for seg in segments:
        if seg.size_bytes not in (0, from_files):
            findings.append(
                Finding(
                    Severity.ERROR,
                    f"file is {seg.size_bytes} bytes; the other segments are {from_files}",
                    seg.path,
                )
            )
    return from_files, findings


@dataclass(frozen=True)
class CheckSummary:
    """What `StoreDir.check` looked at, for the report's last line. `records` counts
    every message record, `fillers` those of them that are fillers (`engine.filler`)."""

    segments: int
    records: int
    fillers: int
    min_offset: int
    end_offset: int
    segment_size_bytes: int
    compressed: int = 0  # records whose body is stored compressed (sysFlag 0x1)


def _check_compressed(view: memoryview, scan: RecordScan, out: list[Finding]) -> int:
    """How many of the scan's records are stored compressed; a WARNING for each whose
    body does not inflate with its codec (only a caller that set the flag itself can
    have stored one: reads give such a body as stored)."""
    n = 0
    for i, flag in enumerate(scan.sys_flag):
        if not flag & SysFlag.COMPRESSED:
            continue
        n += 1
        pos, length = scan.body_pos[i], scan.body_len[i]
        try:
            compression.decompress(view[pos : pos + length], flag)
        except compression.CompressedBodyError as e:
            off = scan.physical_offset[i]
            out.append(Finding(Severity.WARNING, f"record at {off}: {e}", None, off))
    return n


class StoreDir(Closing):
    """A store directory opened for reading only. Close it (or use `with`)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        segment_size_bytes: int | None = None,
        index_geometry: tuple[int, int] | None = None,
    ):
        """`segment_size_bytes`: the configured size, if any (see the module doc);
        `index_geometry`: (hash slots, entries) of the store's index files (the default
        settings' when None).

        Raises StoreDirError (not a store, no geometry), StoreIOError.
        """
        self.path = Path(path)
        s = StoreSettings()
        self.index_geometry = index_geometry or (s.max_hash_slot_num, s.max_index_num)
        if not self.path.is_dir():
            raise StoreDirError(f"{self.path}: not a directory")
        if not (self.path / COMMITLOG_DIR).is_dir():
            raise StoreDirError(f"{self.path}: no {COMMITLOG_DIR}/ directory: not a store")
        self.segment_files = list_segments(self.path)
        self.segment_size_bytes, self._geometry_findings = infer_segment_size(
            self.segment_files, segment_size_bytes
        )
        self._log: CommitLog | None = None
        self._open_error: Finding | None = None
        try:
            self._log = CommitLog.open(
                self.path / COMMITLOG_DIR, self.segment_size_bytes, read_only=True
            )
        except SegmentSizeError as e:
            self._open_error = Finding(Severity.ERROR, f"cannot open the commit log: {e}")

    @property
    def commitlog(self) -> CommitLog:
        """The read-only commit log. Raises StoreDirError if it could not be opened."""
        if self._log is None:
            assert self._open_error is not None
            raise StoreDirError(self._open_error.what)
        return self._log

    @property
    def abort_present(self) -> bool:
        return (self.path / ABORT_FILE).exists()

    def read_checkpoint(self) -> CheckpointFields | None:
        """The checkpoint's fields, or None if there is no checkpoint file.

        Raises CheckpointError if the file is too short.
        """
        p = self.path / CHECKPOINT_FILE
        if not p.exists():
            return None
        return CheckpointFields.from_bytes(p.read_bytes())

    def check(self, *, running_pid: int | None = None) -> tuple[list[Finding], CheckSummary]:
        """Every finding about the directory, and a summary. O(log size).

        `running_pid`: the supervisor holding the store now (the caller asks
        `ipc.locks.store_lock_holder`; -1 when its pid is unreadable), so that `abort`
        is reported as the running store's marker, not as an unclean shutdown."""
        out = list(self._geometry_findings)
        if self._log is None:
            assert self._open_error is not None
            out.append(self._open_error)
            return out, CheckSummary(len(self.segment_files), 0, 0, 0, 0, self.segment_size_bytes)
        log = self._log
        try:
            deleted = deleted_topics.load(self.path)
        except (ValueError, OSError) as e:
            out.append(Finding(Severity.ERROR, str(e), deleted_topics.path(self.path)))
            deleted = {}
        out.extend(log.check(deleted_topics=deleted))
        records = fillers = compressed = 0
        last_store_ts = 0
        end = 0
        if len(log.queue):
            sc = log.scan_chunks(check_crc=False)
            for chunk in sc:
                records += chunk.scan.count
                fillers += sum(1 for b in chunk.scan.bits if b & BIT_FILLER)
                last_store_ts = max(last_store_ts, *chunk.scan.store_timestamp)
                compressed += _check_compressed(chunk.view, chunk.scan, out)
            end = sc.end_offset
        out.extend(self._check_checkpoint(last_store_ts, records))
        out.extend(self._check_index())
        if running_pid is not None:
            pid = f"pid {running_pid}" if running_pid > 0 else "pid unknown"
            out.append(
                Finding(
                    Severity.INFO,
                    f"the store is running (supervisor {pid}): this checks the files as "
                    "they are now, while it writes; its `abort` file is its running marker",
                    str(self.path / ABORT_FILE) if self.abort_present else None,
                )
            )
        elif self.abort_present:
            out.append(
                Finding(
                    Severity.INFO,
                    "abort file present: the last run did not shut down cleanly "
                    "(recovery will validate the log from the checkpoint)",
                    str(self.path / ABORT_FILE),
                )
            )
        summary = CheckSummary(
            segments=len(log.queue),
            records=records,
            fillers=fillers,
            min_offset=log.min_offset() if len(log.queue) else 0,
            end_offset=end,
            segment_size_bytes=self.segment_size_bytes,
            compressed=compressed,
        )
        return out, summary

    def _check_index(self) -> list[Finding]:
        """The index files, opened as a start opens them (a file it would refuse is an
        ERROR finding), then `IndexService.check`."""
        index = IndexService(self.path, *self.index_geometry, read_only=True)
        try:
            index.load()
            return index.check()
        except (IndexGeometryError, fileio.StoreIOError) as e:
            return [Finding(Severity.ERROR, f"cannot open the index: {e}")]
        finally:
            index.close()

    def _check_checkpoint(self, last_store_ts: int, records: int) -> list[Finding]:
        path = str(self.path / CHECKPOINT_FILE)
        try:
            cp = self.read_checkpoint()
        except CheckpointError as e:
            return [Finding(Severity.ERROR, f"checkpoint unreadable: {e}", path)]
        if cp is None:
            return [Finding(Severity.INFO, "no checkpoint file", path)]
        out = []
        size = os.path.getsize(path)
        if size != 4096:
            out.append(Finding(Severity.WARNING, f"checkpoint is {size} bytes, not 4096", path))
        if cp.physic_msg_timestamp == 0:
            out.append(Finding(Severity.INFO, "checkpoint is zero: nothing was checkpointed", path))
        elif records and cp.physic_msg_timestamp > last_store_ts:
            out.append(
                Finding(
                    Severity.ERROR,
                    f"checkpoint says messages stored up to {cp.physic_msg_timestamp} ms were "
                    f"flushed, but the log's last record was stored at {last_store_ts} ms",
                    path,
                )
            )
        for name in ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp"):
            if getattr(cp, name) < 0:
                out.append(Finding(Severity.ERROR, f"checkpoint {name} is negative", path))
        return out

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
