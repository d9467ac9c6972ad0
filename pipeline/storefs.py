"""A store directory seen through `pyarrow.fs`: segments, the flushed offset, byte ranges.

The pipeline reads stores on Spark executors that may not share a disk with the store,
so every file access here goes through a `pyarrow.fs.FileSystem` resolved from a URI
(`file:///data/store`, a plain local path, `s3://bucket/store`, `hdfs://...`). Nothing
here maps files or attaches shared memory; it reads bytes.

The listing mirrors `engine.storedir.list_segments` (20-digit names under `commitlog/`,
ordered by start offset) and the flushed-offset layout is the engine's
(`engine.storedir.FLUSHED_OFFSET_FILE`, magic + big-endian int64), read here through the
filesystem layer instead of the engine's local-disk door.

Who may call: the data source's planner (driver side) and its readers (executors).
Cost: `open_store` lists one directory and reads one 16-byte file; `read_range` is one
ranged read (`read_range_reused` too, into a buffer kept for the next one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow.fs as pafs

from mqstore.engine.storedir import (
    FLUSHED_OFFSET_BYTES,
    FLUSHED_OFFSET_FILE,
    parse_flushed_offset,
)

COMMITLOG_DIR = "commitlog"
SEGMENT_NAME_DIGITS = 20


class StoreNotFound(FileNotFoundError):
    """The URI names no directory."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One commit-log file: where it is, its start offset, how many bytes to read of it.

    `readable_bytes` is the file size, cut at the live store's flushed offset when the
    store publishes one. `file_size_bytes` is the segment's size on disk (its geometry).
    """

    path: str
    start_offset: int
    file_size_bytes: int
    readable_bytes: int


@dataclass(frozen=True, slots=True)
class StoreListing:
    """What a planner needs: the filesystem URI, the segments, the flushed offset if live."""

    uri: str
    segments: tuple[Segment, ...]
    flushed_offset: int | None  # None: a stopped store or a copy, read to its last record


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """`FileSystem.from_uri` for URIs; plain paths (relative ones too) become local."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def read_flushed_offset(fs: pafs.FileSystem, root: str) -> int | None:
    """The flushed offset a live store publishes; None when absent or not valid."""
    path = f"{root.rstrip('/')}/{FLUSHED_OFFSET_FILE}"
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        return None
    with fs.open_input_file(path) as f:
        return parse_flushed_offset(f.read(FLUSHED_OFFSET_BYTES))


def open_store(uri: str, *, honour_flushed_offset: bool = True) -> StoreListing:
    """List a store's commit-log segments and readable sizes.

    A directory without `commitlog/` lists no segments (as `engine.storedir` does).
    Empty files (an unfinished pre-allocation) are left out. With a flushed offset, a
    segment is readable only up to it, and segments wholly past it are left out.
    Raises StoreNotFound.
    """
    fs, root = resolve(uri)
    log_dir = f"{root.rstrip('/')}/{COMMITLOG_DIR}"
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        raise StoreNotFound(f"{uri}: no such directory")
    if fs.get_file_info(log_dir).type != pafs.FileType.Directory:
        return StoreListing(uri, (), None)  # a store directory without a log yet: no records
    flushed = read_flushed_offset(fs, root) if honour_flushed_offset else None
    segments = []
    for info in fs.get_file_info(pafs.FileSelector(log_dir)):
        name = info.base_name
        if info.type != pafs.FileType.File or len(name) != SEGMENT_NAME_DIGITS:
            continue
        if not name.isdigit():
            continue
        start = int(name)
        size = int(info.size or 0)
        readable = size if flushed is None else max(0, min(size, flushed - start))
        if readable > 0:
            segments.append(Segment(info.path, start, size, readable))
    segments.sort(key=lambda s: s.start_offset)
    return StoreListing(uri, tuple(segments), flushed)


def read_range(fs: pafs.FileSystem, path: str, offset: int, length: int) -> bytes:
    """`length` bytes of `path` from `offset` (fewer at the end of the file)."""
    if length <= 0:
        return b""
    with fs.open_input_file(path) as f:
        data: bytes = f.read_at(length, offset)
    return data


# Buffers `read_range_reused` lends, kept for the next read in this process: a fresh
# 64 MiB buffer costs a page fault per 4 KiB page as the read fills it (3.5x the copy).
_SPARE: list[bytearray] = []


@contextmanager
def read_range_reused(
    fs: pafs.FileSystem, path: str, offset: int, length: int
) -> Iterator[bytes | memoryview]:
    """`read_range`, into a buffer this process keeps for the next read when `fs` is the
    local filesystem. The bytes are valid inside the block only: after it, the buffer
    may hold another read (so nothing made from them may be kept without a copy). A
    block inside another gets a buffer of its own."""
    if not isinstance(fs, pafs.LocalFileSystem) or length <= 0:
        yield read_range(fs, path, offset, length)
        return
    buf = _SPARE.pop() if _SPARE else bytearray()
    if len(buf) < length:
        buf = bytearray(length)
    try:
        whole = memoryview(buf)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            done = 0
            while done < length:
                got = os.preadv(fd, [whole[done:length]], offset + done)
                if got == 0:
                    break  # the end of the file
                done += got
        finally:
            os.close(fd)
        yield whole[:done]
    finally:
        _SPARE.append(buf)
