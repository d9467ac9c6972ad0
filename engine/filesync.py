"""How data written to a store file is forced to disk: `SyncMethod` and `FileSync`.

Data that went through `pwrite` is forced with `fdatasync`. Data written through a
mapping is forced by the file's `mmap_sync`: `SyncMethod.FDATASYNC` by default on Linux,
`SyncMethod.MSYNC` elsewhere. On Linux the pages of a shared file mapping are in the
page cache and are tracked dirty at the first write fault, so `fdatasync` of the file
writes them back exactly as `msync(MS_SYNC)` does (the kernel implements `msync` as an
fsync of the file range). Measured here (`ext4`, 2 vCPUs; see the tests' notes and
bench/results/append.md): a freshly dirtied 4 KiB page costs msync ~430 µs (p50) against
~250 µs for fdatasync after an mmap write and ~190 µs after a pwrite; 1 MiB costs 3.3 ms
against 2.6 ms. So fdatasync is the default; `MSYNC` stays available for platforms that
do not promise it.

Users: `engine.segment` (commit-log and consume-queue segments), `engine.indexfile`,
and the threads that force files they do not write (`FileSync`, `workers.cq_flusher`).
"""

from __future__ import annotations

import contextlib
import enum
import mmap
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mqstore.engine import fileio


class SyncMethod(enum.Enum):
    """How data written through the mapping is forced to disk."""

    FDATASYNC = "fdatasync"
    MSYNC = "msync"


DEFAULT_MMAP_SYNC: Final = (
    SyncMethod.FDATASYNC if sys.platform.startswith("linux") else SyncMethod.MSYNC
)


@dataclass(slots=True)
class FileSync:
    """One file to force from another thread than its writer's (the dispatcher's flush
    thread): `run()` fdatasyncs a duplicate descriptor this object owns (`fileio.dup`),
    so the writer may close or destroy the file meanwhile; where data written through a
    mapping needs msync (`SyncMethod.MSYNC`), it msyncs `[0, length)` of the mapping,
    held until `close()`, which then calls `release`. `close()` exactly once, after
    `run()` or instead of it."""

    fd: int
    path: str
    mapping: mmap.mmap | None = None
    length: int = 0
    release: Callable[[], None] | None = None

    def run(self) -> None:
        """Force the file. Raises StoreIOError."""
        if self.fd >= 0:
            fileio.fdatasync(self.fd, self.path)
        elif self.mapping is not None and self.length > 0:
            fileio.msync(self.mapping, 0, self.length, self.path)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):  # a dup: closing it loses nothing
                os.close(fd)
        release, self.release = self.release, None
        self.mapping = None
        if release is not None:
            release()
