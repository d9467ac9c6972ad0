"""The one door to the disk.

Every syscall that touches store files (open, ftruncate, fallocate, pwrite, pread,
fsync, fdatasync, msync, mmap, rename, unlink, directory fsync) passes through this
module. An `OSError` comes out as `StoreIOError`, which names the operation and the
path and keeps the errno. Callers never catch it to log and go on: a failed fsync or
pwrite means the store can no longer promise durability, and whoever owns the store's
running flags marks it read-only (the flusher does, in the runtime).

Fault seam: `set_fault(op, factory)` makes the named operation raise whatever
`factory()` returns (e.g. `OSError(errno.EIO, ...)`), so tests inject EIO or ENOSPC
in exactly one place. `MQSTORE_FAULTS="fsync:EIO,pwrite:ENOSPC"` in the environment
installs the same faults at import, for tests that need them inside a worker process;
`MQSTORE_FAULTS_AFTER=N` lets the first N calls of each faulted operation succeed.

Sync seam (the power-loss suite): a `SyncWatch` is told what each sync is about to make
durable (a file's content before an fsync or fdatasync, a range before an msync, a
directory's entries before its fsync) and of each rename that succeeded. The default
watch does nothing. `set_sync_watch(watch)` installs one in this process;
`MQSTORE_SYNC_WATCH="module:factory"` in the environment installs `factory()` at import,
for the store's own processes (`tests/reliability/powerloss.py` records a shadow of the
disk through it and builds the disk a power cut would leave from that).

I/O done in C (the flusher's round, `ipc/native/mqs_round.c`) goes through both seams
too: while a fault or a watch is set, its calls ask `native_seam`'s hook first.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import importlib
import mmap
import os
from collections.abc import Callable, Mapping
from typing import Final, Protocol

StrPath = str | os.PathLike[str]

OPS = (
    "open", "close", "ftruncate", "fallocate", "pwrite", "pread", "fsync", "fdatasync",
    "msync", "mmap", "rename", "unlink", "fsync_dir", "mkdir", "dup",
)  # fmt: skip


class StoreIOError(OSError):
    """An I/O operation on a store file failed. `op` and `path` say which."""

    def __init__(self, op: str, path: StrPath, cause: OSError) -> None:
        code = cause.errno if cause.errno is not None else errno.EIO
        super().__init__(code, f"{op} {os.fspath(path)}: {cause.strerror or cause}")
        self.op = op
        self.path = os.fspath(path)


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# The operations that ask the file system for new space. ENOSPC anywhere else is not a
# full disk to wait out: a failed sync may have dropped the dirty pages it was forcing
# (Linux marks them clean, so a retry can succeed over lost data), and the others
# (mmap, unlink, close) do not allocate.
SPACE_OPS = frozenset({"open", "ftruncate", "fallocate", "pwrite", "rename", "mkdir"})


def is_no_space(e: BaseException) -> bool:
    """`e` says the file system (or the quota) is full: a condition that passes once space
    is freed, unlike EIO. Workers that only need new space wait and retry on it instead
    of failing the store closed (docs/durability.md, "A full disk"). Only for an
    operation that asks for space (`SPACE_OPS`); a failed sync is never one."""
    if isinstance(e, StoreIOError) and e.op not in SPACE_OPS:
        return False
    return isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS


_faults: dict[str, Callable[[], BaseException]] = {}
_fault_skips: dict[str, int] = {}


def set_fault(op: str, factory: Callable[[], BaseException] | None, *, after: int = 0) -> None:
    """Make `op` raise `factory()` (after `after` successful calls); None removes it."""
    if op not in OPS:
        raise ValueError(f"unknown operation {op!r}; one of {', '.join(OPS)}")
    if factory is None:
        _faults.pop(op, None)
        _fault_skips.pop(op, None)
    else:
        _faults[op] = factory
        _fault_skips[op] = after


def clear_faults() -> None:
    _faults.clear()
    _fault_skips.clear()


def _install_env_faults() -> None:
    spec = os.environ.get("MQSTORE_FAULTS", "")
    after = int(os.environ.get("MQSTORE_FAULTS_AFTER", "0") or 0)
    for item in filter(None, (s.strip() for s in spec.split(","))):
        op, _, name = item.partition(":")
        code = getattr(errno, name or "EIO")

        def factory(code: int = code, op: str = op) -> BaseException:
            return OSError(code, f"injected {errno.errorcode[code]} in {op}")

        set_fault(op, factory, after=after)


def seams_quiet(*ops: str) -> bool:
    """No fault is set on any of `ops` and no sync watch is installed: a caller that does
    those operations in C (the flusher's round, `ipc.commit`) needs no `native_seam`."""
    return _watch is NO_WATCH and (not _faults or not any(op in _faults for op in ops))


# The I/O calls of C code that the seams see, by the numbers C gives them
# (ipc/native/mqs_round.h's MQS_OP_*): its flock is no operation of this module.
_NATIVE_OPS = {2: "pwrite", 3: "fdatasync"}


def native_seam(paths: Mapping[int, StrPath]) -> Callable[[int, int], int]:
    """The seams for I/O done in C (the flusher's round, `_native.sync_round`'s io_hook):
    called as `hook(op, fd)` before each of its calls, it does what `pwrite` and
    `fdatasync` here do before theirs (the fault set for that operation; the sync watch
    told what an fdatasync of `paths[fd]` is about to make durable) and returns the errno
    the call must fail with, or 0 to let it run."""

    def before(op: int, fd: int) -> int:
        name = _NATIVE_OPS.get(op)
        if name is None:
            return 0
        try:
            _check_fault(name)
            if name == "fdatasync":
                _watch.data_synced(paths.get(fd, "?"), 0, -1)
        except OSError as e:
            return e.errno or errno.EIO
        return 0

    return before


def _check_fault(op: str) -> None:
    factory = _faults.get(op)
    if factory is None:
        return
    left = _fault_skips.get(op, 0)
    if left > 0:
        _fault_skips[op] = left - 1
        return
    raise factory()


class SyncWatch(Protocol):
    """What the sync seam is told (see the module doc). Called in the caller's thread,
    before the sync (after the rename); an exception it raises fails the operation."""

    def data_synced(self, path: StrPath, offset: int, length: int) -> None:
        """`length` bytes of `path` from `offset` (-1: the whole file) become durable."""

    def dir_synced(self, path: StrPath) -> None:
        """The entries directory `path` holds now become durable."""

    def renamed(self, src: StrPath, dst: StrPath) -> None:
        """`src` was renamed to `dst`."""


class _NoWatch:
    def data_synced(self, path: StrPath, offset: int, length: int) -> None:
        pass

    def dir_synced(self, path: StrPath) -> None:
        pass

    def renamed(self, src: StrPath, dst: StrPath) -> None:
        pass


NO_WATCH: SyncWatch = _NoWatch()
_watch: SyncWatch = NO_WATCH


def set_sync_watch(watch: SyncWatch | None) -> None:
    """Install `watch` for this process; None puts back the one that does nothing."""
    global _watch
    _watch = watch if watch is not None else NO_WATCH


def sync_watch() -> SyncWatch:
    return _watch


def _install_env_watch() -> None:
    spec = os.environ.get("MQSTORE_SYNC_WATCH", "")
    if spec:
        module, _, name = spec.partition(":")
        set_sync_watch(getattr(importlib.import_module(module), name)())


def _wrap(op: str, path: StrPath, cause: OSError) -> StoreIOError:
    return StoreIOError(op, path, cause)


# A store file that is a symbolic link is refused, never written through: a link to a file
# outside the store would have recovery extend, truncate or delete that file.
_NOT_A_LINK = OSError(
    errno.ELOOP,
    "is a symbolic link: store files are opened without following links (O_NOFOLLOW); "
    "put the file itself in the store",
)


def open_file(path: StrPath, *, create: bool, read_only: bool = False, mode: int = 0o600) -> int:
    """Open a store file and return its fd (O_CLOEXEC, O_NOFOLLOW). Raises StoreIOError,
    with ELOOP when `path` is a symbolic link."""
    flags = os.O_RDONLY if read_only else os.O_RDWR
    if create:
        flags |= os.O_CREAT
    try:
        _check_fault("open")
        return os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    except OSError as e:
        raise _wrap("open", path, _NOT_A_LINK if e.errno == errno.ELOOP else e) from e


def close(fd: int, path: StrPath = "?") -> None:
    try:
        _check_fault("close")
        os.close(fd)
    except OSError as e:
        raise _wrap("close", path, e) from e


def dup(fd: int, path: StrPath = "?") -> int:
    """A duplicate of `fd` (O_CLOEXEC) that the caller closes: another thread forces the
    file through it while the owner may close its own descriptor (`workers.cq_flusher`)."""
    try:
        _check_fault("dup")
        return os.dup(fd)  # os.dup's descriptor is non-inheritable (close-on-exec)
    except OSError as e:
        raise _wrap("dup", path, e) from e


def ftruncate(fd: int, size: int, path: StrPath = "?") -> None:
    try:
        _check_fault("ftruncate")
        os.ftruncate(fd, size)
    except OSError as e:
        raise _wrap("ftruncate", path, e) from e


def fallocate(fd: int, size: int, path: StrPath = "?") -> None:
    """Reserve `size` bytes of real blocks (so a full disk fails here, not on a write)."""
    try:
        _check_fault("fallocate")
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # e.g. some tmpfs/overlay setups
            try:
                os.ftruncate(fd, size)
                return
            except OSError as e2:
                raise _wrap("fallocate", path, e2) from e2
        raise _wrap("fallocate", path, e) from e


def pwrite(
    fd: int,
    data: bytes | bytearray | memoryview,
    offset: int,
    path: StrPath = "?",
    *,
    piece: int = 0,
) -> int:
    """Write all of `data` at `offset` (loops over short writes); return bytes written.
    With `piece` > 0 each write(2) ends at the latest on the next file offset that is a
    multiple of `piece` (`COMMIT_PIECE`: why). One call, one fault-seam check."""
    view = memoryview(data)
    done = 0
    try:
        _check_fault("pwrite")
        while done < len(view):
            at = offset + done
            upto = len(view) if piece <= 0 else min(len(view), (at // piece + 1) * piece - offset)
            n = os.pwrite(fd, view[done:upto], at)
            if n == 0:
                raise OSError(errno.EIO, "pwrite wrote nothing")
            done += n
    except OSError as e:
        raise _wrap("pwrite", path, e) from e
    finally:
        view.release()
    return done


def pread(fd: int, n: int, offset: int, path: StrPath = "?") -> bytes:
    try:
        _check_fault("pread")
        return os.pread(fd, n, offset)
    except OSError as e:
        raise _wrap("pread", path, e) from e


def fsync(fd: int, path: StrPath = "?") -> None:
    _sync_file("fsync", os.fsync, fd, path)


def fdatasync(fd: int, path: StrPath = "?") -> None:
    _sync_file("fdatasync", os.fdatasync, fd, path)


def _sync_file(op: str, sync: Callable[[int], None], fd: int, path: StrPath) -> None:
    """The sync seam told first (the whole file), then `sync(fd)`."""
    try:
        _check_fault(op)
        _watch.data_synced(path, 0, -1)
        sync(fd)
    except OSError as e:
        raise _wrap(op, path, e) from e


def msync(mm: mmap.mmap, offset: int, length: int, path: StrPath = "?") -> None:
    """Force a range of a writable mapping to disk (offset rounded down to a page)."""
    start = offset - offset % mmap.PAGESIZE
    try:
        _check_fault("msync")
        if length > 0:
            _watch.data_synced(path, start, length + (offset - start))
            mm.flush(start, length + (offset - start))
    except OSError as e:
        raise _wrap("msync", path, e) from e


# The committer's pwrite from the pool goes in writes of at most this many bytes (aligned
# to it in the file). The page cache makes a new folio as large as the write that brings
# it in (up to 2 MiB), and on a VM whose free memory goes back to its host (virtio-balloon
# free page reporting, of free 2 MiB blocks) the first touch of a large new folio is slow,
# most likely a host fault per page: one pwrite per commit cost 0.18-2.01 us per KiB
# (median 1.39), 64 KiB writes 0.23-0.60 (bench/commit_first_touch.py,
# bench/results/commit_cost.md: the figures, and what is not known of a quiet machine).
COMMIT_PIECE: Final = 64 << 10
ZERO_CHUNK: Final = 1 << 20  # preallocate writes its zeros this many bytes at a time
PAGE_WRITE: Final = 4096  # preallocate's `zero_write` for files written through a mapping


def preallocate(
    path: StrPath,
    size: int,
    *,
    zeros_from_start: int = 0,
    sync_chunks: bool = False,
    zero_write: int = ZERO_CHUNK,
) -> None:
    """Make `path` (truncated if it was there) a file of `size` allocated bytes, its first
    `zeros_from_start` bytes written as zeros (written extents at once: no page fault
    or later fdatasync converts them; the pages stay in the page cache), fsynced. With
    `sync_chunks` each ZERO_CHUNK of zeros is forced before the next is written, so the
    disk's queue never holds more than a chunk of them ahead of a sync put's fdatasync
    (RocketMQ's warm-up forces every `flushLeastPagesWhenWarmMapedFile` pages for the
    same reason). The allocators' first step, never the hot path.

    `zero_write`: the bytes of each pwrite of zeros (at most ZERO_CHUNK). The page cache
    keeps what one write brings in as one folio of up to that size (ext4 and XFS make
    large folios), and a store through a shared mapping dirties its whole folio: an
    fdatasync then writes all of it (measured: 1 KiB stored through the mapping, then
    fdatasync, wrote 1 MiB to the disk and took 3x a plain one when the zeros went in
    1 MiB writes; 4 KiB with PAGE_WRITE). A write(2) marks only its own blocks dirty,
    whatever the folio. So a file that processes will write through a mapping and a
    sync waits on is zeroed with PAGE_WRITE; the rest in ZERO_CHUNK writes (5x less CPU).
    Raises StoreIOError, and then no file is left: one that could not be allocated (a
    full disk) must not keep the blocks it got; the next try starts from nothing."""
    if not 0 < zero_write <= ZERO_CHUNK:
        raise ValueError(f"zero_write must be 1 to {ZERO_CHUNK} bytes, got {zero_write}")
    fd = open_file(path, create=True)
    try:
        ftruncate(fd, 0, path)
        fallocate(fd, size, path)
        zeros = memoryview(bytes(min(zeros_from_start, zero_write)))
        for chunk in range(0, zeros_from_start, ZERO_CHUNK):
            end = min(chunk + ZERO_CHUNK, zeros_from_start)
            for at in range(chunk, end, zero_write):
                pwrite(fd, zeros[: min(zero_write, end - at)], at, path)
            if sync_chunks:
                fdatasync(fd, path)
        fsync(fd, path)
    except StoreIOError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        close(fd, path)


def mmap_file(fd: int, size: int, *, writable: bool, path: StrPath = "?") -> mmap.mmap:
    access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
    try:
        _check_fault("mmap")
        return mmap.mmap(fd, size, access=access)
    except OSError as e:
        raise _wrap("mmap", path, e) from e


def rename(src: StrPath, dst: StrPath) -> None:
    try:
        _check_fault("rename")
        os.rename(src, dst)
        _watch.renamed(src, dst)
    except OSError as e:
        raise _wrap("rename", src, e) from e


def unlink(path: StrPath, *, missing_ok: bool = False) -> None:
    try:
        _check_fault("unlink")
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
    except OSError as e:
        raise _wrap("unlink", path, e) from e


def fsync_dir(path: StrPath) -> None:
    """fsync a directory so that a new, renamed or removed entry survives a power loss."""
    try:
        _check_fault("fsync_dir")
        _watch.dir_synced(path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise _wrap("fsync_dir", path, e) from e


FS_IOC_GETFLAGS: Final = 0x80086601  # <linux/fs.h>, 64-bit
FS_IOC_SETFLAGS: Final = 0x40086602
FS_TOPDIR_FL: Final = 0x00020000  # chattr +T


def spread_subdirectories(path: StrPath) -> str:
    """Ask the file system to place each directory made in `path` from now on in a block
    group of its own (ext2/3/4's "top of a directory hierarchy" flag, `chattr +T`: the
    Orlov allocator spreads such a directory's subdirectories). A file's inode is taken
    from its directory's group, so the commit log's segments then share no inode-table
    block with the consume queues and index files. On ext4 without a journal every
    fdatasync writes the file's inode-table block whenever any inode in that 4 KiB block
    changed (a time stamp at each 4 ms tick of every file written), so the sync round's
    fdatasync paid a second write for the dispatcher's time stamps (docs/durability.md,
    "What an fdatasync writes besides the data"). A hint: "" when set (or already set),
    else why not (another file system, not the owner); never raises. One open and two
    ioctls."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return f"open: {e.strerror}"
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        if flags[0] & FS_TOPDIR_FL:
            return ""
        flags[0] |= FS_TOPDIR_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
        return ""
    except OSError as e:
        return f"FS_IOC_SETFLAGS: {e.strerror}"
    finally:
        os.close(fd)


def makedirs(path: StrPath, mode: int = 0o700) -> None:
    """Create a directory (and parents) and fsync the parent of each new one."""
    from pathlib import Path  # here, not at import: a producer process never needs it

    p = Path(path)
    missing = []
    while not p.exists():
        missing.append(p)
        p = p.parent
    try:
        _check_fault("mkdir")
        for d in reversed(missing):
            os.mkdir(d, mode)
            fsync_dir(d.parent)
    except FileExistsError:
        pass
    except StoreIOError:
        raise
    except OSError as e:
        raise _wrap("mkdir", path, e) from e


def write_file_atomic(
    path: StrPath, data: bytes, *, mode: int = 0o600, keep_backup: bool = False
) -> None:
    """Replace `path` with `data` durably: write X.tmp, fsync, (X -> X.bak), rename, fsync dir."""
    from pathlib import Path  # here, not at import: a producer process never needs it

    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    fd = open_file(tmp, create=True, mode=mode)
    try:
        os.fchmod(fd, mode)  # a .tmp left by an older run keeps its mode through O_CREAT
        ftruncate(fd, 0, tmp)
        pwrite(fd, data, 0, tmp)
        fsync(fd, tmp)
    finally:
        close(fd, tmp)
    if keep_backup and p.exists():
        bak = p.with_name(p.name + ".bak")
        try:
            os.replace(p, bak)
        except OSError as e:
            raise _wrap("rename", p, e) from e
    rename(tmp, p)
    fsync_dir(p.parent)


_install_env_faults()
_install_env_watch()
