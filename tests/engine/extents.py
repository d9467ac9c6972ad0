"""A file's extents as the file system reports them (FIEMAP), for tests that must know
whether blocks were written or only allocated (fallocate leaves them *unwritten*)."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

import pytest

from mqstore.engine import fileio

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
_HEAD = struct.Struct("=QQIIII")  # struct fiemap without its extents
_EXTENT = struct.Struct("=QQQ2QI3I")  # struct fiemap_extent
_BATCH = 64


def unwritten_bytes(path: Path) -> int:
    """Bytes of `path` in extents flagged UNWRITTEN (allocated, never written); skips the
    test where the file system has no FIEMAP (tmpfs)."""
    total, start = 0, 0
    with open(path, "rb") as f:
        while True:
            buf = bytearray(_HEAD.pack(start, 2**64 - 1 - start, FIEMAP_FLAG_SYNC, 0, _BATCH, 0))
            buf += bytes(_EXTENT.size * _BATCH)
            try:
                fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf)
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY):
                    pytest.skip(f"no FIEMAP on {os.fspath(path)}'s file system")
                raise
            mapped = _HEAD.unpack_from(buf)[3]
            last = False
            for i in range(mapped):
                fields = _EXTENT.unpack_from(buf, _HEAD.size + i * _EXTENT.size)
                logical, length, flags = fields[0], fields[2], fields[5]
                if flags & FIEMAP_EXTENT_UNWRITTEN:
                    total += length
                start = logical + length
                last = bool(flags & FIEMAP_EXTENT_LAST)
            if mapped == 0 or last:
                return total


def _write_bytes() -> int:
    """This process's `write_bytes` (/proc/self/io): bytes it dirtied in the page cache,
    counted a whole folio at a time when the folio is first dirtied."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


def mapped_store_dirties(path: Path, offset: int, n: int = 1024) -> int:
    """Bytes the page cache marks dirty when `n` bytes at `offset` of `path` are stored
    through a shared mapping (the bytes already there, so the file does not change): a
    whole folio, so what the next fdatasync writes. Skips the test where the kernel has
    no per-task I/O accounting or the file system counts none (tmpfs)."""
    import mmap

    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io (task I/O accounting)")
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, offset + n)
        try:
            same = m[offset : offset + n]
            before = _write_bytes()
            m[offset : offset + n] = same
            dirtied = _write_bytes() - before
        finally:
            m.close()
    finally:
        os.close(fd)
    if dirtied == 0:
        pytest.skip("the file system accounts no dirtied page-cache bytes (tmpfs?)")
    return dirtied


def dir_flags(path: Path) -> int:
    """A directory's inode flags (FS_IOC_GETFLAGS: `lsattr -d`)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = bytearray(4)
        fcntl.ioctl(fd, fileio.FS_IOC_GETFLAGS, flags, True)
        return int.from_bytes(flags, "little")
    finally:
        os.close(fd)
