"""A file's extents as the file system reports them (FIEMAP), for tests that must know
whether blocks were written or only allocated (fallocate leaves them *unwritten*)."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

import pytest

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
