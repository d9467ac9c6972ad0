"""Read side of any store directory, and the live-store flushed offset.

Only the flushed-offset helpers exist so far; segment listing, record iteration and
`StoreDir` are not written yet (see issue 2).

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
from dataclasses import dataclass

from engine import fileio

FLUSHED_OFFSET_FILE = "flushed_offset"
FLUSHED_OFFSET_MAGIC = b"MQFLUSH1"
_LAYOUT = struct.Struct(">8sq")


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
        raw = fileio.pread(fd, _LAYOUT.size, 0, path)
    finally:
        fileio.close(fd, path)
    if len(raw) != _LAYOUT.size:
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
