"""The one door to the disk: typed errors, the fault seam, atomic replacement."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.engine import fileio
from tests.engine.extents import dir_flags, mapped_store_dirties, unwritten_bytes


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def test_pwrite_fsync_pread_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "seg"
    fd = fileio.open_file(p, create=True)
    try:
        fileio.fallocate(fd, 8192, p)
        assert os.fstat(fd).st_size == 8192
        assert fileio.pwrite(fd, b"abc" * 1000, 100, p) == 3000
        fileio.fdatasync(fd, p)
        fileio.fsync(fd, p)
        assert fileio.pread(fd, 6, 100, p) == b"abcabc"
        mm = fileio.mmap_file(fd, 8192, writable=True, path=p)
        mm[5000:5003] = b"xyz"
        fileio.msync(mm, 5000, 3, p)
        mm.close()
    finally:
        fileio.close(fd, p)
    assert (p.stat().st_mode & 0o777) == 0o600
    assert p.read_bytes()[5000:5003] == b"xyz"


def test_errors_are_typed_and_name_op_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "seg"
    with pytest.raises(fileio.StoreIOError) as ei:
        fileio.open_file(missing, create=False)
    assert ei.value.op == "open" and ei.value.path == str(missing)
    assert ei.value.errno == errno.ENOENT


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_fault_seam_makes_fsync_fail(tmp_path: Path, code: int) -> None:
    p = tmp_path / "f"
    fd = fileio.open_file(p, create=True)
    fileio.set_fault("fdatasync", lambda: OSError(code, "injected"), after=1)
    try:
        fileio.fdatasync(fd, p)  # the first call is let through
        with pytest.raises(fileio.StoreIOError) as ei:
            fileio.fdatasync(fd, p)
        assert ei.value.errno == code and ei.value.op == "fdatasync"
    finally:
        fileio.close(fd, p)
    with pytest.raises(ValueError, match="unknown operation"):
        fileio.set_fault("fsink", None)


def test_faults_from_the_environment_reach_a_child_process(tmp_path: Path) -> None:
    code = (
        "from engine import fileio; import sys\n"
        "fd = fileio.open_file(sys.argv[1], create=True)\n"
        "try:\n    fileio.fsync(fd)\nexcept fileio.StoreIOError as e:\n    print(e.errno, e.op)\n"
    )
    env = dict(os.environ, MQSTORE_FAULTS="fsync:ENOSPC")
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "x")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == [str(errno.ENOSPC), "fsync"]


def test_write_file_atomic_keeps_a_backup(tmp_path: Path) -> None:
    p = tmp_path / "topics.json"
    fileio.write_file_atomic(p, b"one")
    fileio.write_file_atomic(p, b"two", keep_backup=True)
    assert p.read_bytes() == b"two"
    assert (tmp_path / "topics.json.bak").read_bytes() == b"one"
    assert not (tmp_path / "topics.json.tmp").exists()


def test_failed_atomic_write_leaves_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "consumerOffset.json"
    fileio.write_file_atomic(p, b"old")
    fileio.set_fault("fsync", lambda: OSError(errno.EIO, "injected"))
    with pytest.raises(fileio.StoreIOError):
        fileio.write_file_atomic(p, b"new")
    assert p.read_bytes() == b"old"


def test_makedirs_creates_owner_only_dirs(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    fileio.makedirs(d)
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    fileio.makedirs(d)  # idempotent


def test_preallocate_writes_the_zeros_asked_and_fsyncs(tmp_path: Path) -> None:
    p = tmp_path / "idx.tmp"
    p.write_bytes(b"old content that must go")
    fileio.preallocate(p, 8192, zeros_from_start=100)
    assert p.stat().st_size == 8192 and p.read_bytes() == bytes(8192)


@pytest.mark.parametrize("op", ["ftruncate", "fallocate", "pwrite", "fsync"])
def test_preallocate_leaves_no_file_when_a_step_fails(tmp_path: Path, op: str) -> None:
    p = tmp_path / "seg.tmp"
    fileio.set_fault(op, lambda: OSError(errno.ENOSPC, "injected"))
    with pytest.raises(fileio.StoreIOError) as ei:
        fileio.preallocate(p, 8192, zeros_from_start=10)
    assert ei.value.op == op and not p.exists()


def test_preallocate_zeros_leave_no_unwritten_extent(tmp_path: Path) -> None:
    """Zeros over the whole file (more than one ZERO_CHUNK): every block is written, so
    no later fdatasync converts an extent; without them fallocate leaves it unwritten."""
    size = fileio.ZERO_CHUNK * 2 + 3 * 4096
    only_allocated, zeroed = tmp_path / "a.tmp", tmp_path / "z.tmp"
    fileio.preallocate(only_allocated, size)
    fileio.preallocate(zeroed, size, zeros_from_start=size)
    assert unwritten_bytes(only_allocated) == size
    assert unwritten_bytes(zeroed) == 0
    assert zeroed.stat().st_size == size and zeroed.read_bytes() == bytes(size)


def test_preallocate_in_page_writes_keeps_a_store_through_a_mapping_to_its_page(
    tmp_path: Path,
) -> None:
    """`zero_write=PAGE_WRITE`: zeros written a page at a time leave page-sized folios, so
    1 KiB stored through a shared mapping dirties one page, all an fdatasync then writes
    (in 1 MiB writes a large folio, all of it dirtied: ext4 and XFS on recent kernels).
    Every byte is still written and zero, in as many writes as pages."""
    size = fileio.ZERO_CHUNK * 2 + 3 * 4096
    paged = tmp_path / "p.tmp"
    fileio.preallocate(paged, size, zeros_from_start=size, zero_write=fileio.PAGE_WRITE)
    assert unwritten_bytes(paged) == 0 and paged.read_bytes() == bytes(size)
    for offset in (0, fileio.ZERO_CHUNK + 5000, size - 1024):
        assert mapped_store_dirties(paged, offset) == 4096
    pages = size // 4096  # one write each: the last of them fails, one more would
    fileio.set_fault("pwrite", lambda: OSError(errno.EIO, "injected"), after=pages - 1)
    with pytest.raises(fileio.StoreIOError):
        fileio.preallocate(tmp_path / "q.tmp", size, zeros_from_start=size, zero_write=4096)
    fileio.set_fault("pwrite", lambda: OSError(errno.EIO, "injected"), after=pages)
    fileio.preallocate(tmp_path / "q.tmp", size, zeros_from_start=size, zero_write=4096)


@pytest.mark.parametrize("bad", [0, -1, fileio.ZERO_CHUNK + 1])
def test_preallocate_refuses_a_zero_write_size_outside_one_chunk(tmp_path: Path, bad: int) -> None:
    with pytest.raises(ValueError, match="zero_write"):
        fileio.preallocate(tmp_path / "x.tmp", 8192, zeros_from_start=8192, zero_write=bad)
    assert not (tmp_path / "x.tmp").exists()


def test_preallocate_forces_each_chunk_of_zeros_when_asked(tmp_path: Path) -> None:
    """`sync_chunks`: an fdatasync after every ZERO_CHUNK written (the disk never queues
    more than a chunk of zeros ahead of a sync put): the third of three fails here, so
    three were made; without it none is (the file's own fsync is another call)."""
    size = fileio.ZERO_CHUNK * 3
    fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected"), after=2)
    fileio.preallocate(tmp_path / "y.tmp", size, zeros_from_start=size)
    with pytest.raises(fileio.StoreIOError) as ei:
        fileio.preallocate(tmp_path / "z.tmp", size, zeros_from_start=size, sync_chunks=True)
    assert ei.value.op == "fdatasync" and not (tmp_path / "z.tmp").exists()
    assert unwritten_bytes(tmp_path / "y.tmp") == 0


@settings(max_examples=60, deadline=None)
@given(
    offset=st.integers(0, 300_000),
    length=st.integers(1, 400_000),
    piece=st.sampled_from([4096, 65536, 10_000, fileio.COMMIT_PIECE]),
    short=st.booleans(),
)
def test_pwrite_in_pieces_writes_everything_and_no_write_crosses_a_piece_boundary(
    offset: int, length: int, piece: int, short: bool
) -> None:
    """`piece`: each write(2) ends at the latest on the next multiple of `piece` in the
    file (so the page cache makes folios no larger), short writes are resumed, and the
    file holds the bytes, as one write would leave it."""
    data = os.urandom(length)
    calls: list[tuple[int, int, int]] = []  # (offset, bytes asked, bytes written)
    real = os.pwrite

    def recording(fd: int, buf: memoryview, at: int) -> int:
        n = real(fd, bytes(buf)[: max(1, len(buf) // 2)] if short else buf, at)
        calls.append((at, len(buf), n))
        return n

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f"
        fd = fileio.open_file(p, create=True)
        try:
            with mock.patch.object(fileio.os, "pwrite", recording):
                assert fileio.pwrite(fd, data, offset, p, piece=piece) == length
        finally:
            fileio.close(fd)
        assert p.read_bytes()[offset:] == data
    at = offset
    for start, asked, wrote in calls:
        assert start == at  # from where the last write got to
        assert start // piece == (start + asked - 1) // piece  # within one piece
        at = start + wrote
    assert at == offset + length


def test_pwrite_in_pieces_is_one_call_for_the_fault_seam(tmp_path: Path) -> None:
    p = tmp_path / "f"
    fd = fileio.open_file(p, create=True)
    try:
        fileio.set_fault("pwrite", lambda: OSError(errno.EIO, "injected"), after=1)
        assert fileio.pwrite(fd, bytes(300_000), 0, p, piece=4096) == 300_000
        with pytest.raises(fileio.StoreIOError):
            fileio.pwrite(fd, b"x", 0, p, piece=4096)
    finally:
        fileio.close(fd)


def test_spread_subdirectories_sets_the_top_directory_flag_once(tmp_path: Path) -> None:
    d = tmp_path / "store"
    d.mkdir()
    reason = fileio.spread_subdirectories(d)
    if reason:
        pytest.skip(f"this file system keeps no top-directory flag: {reason}")
    assert dir_flags(d) & fileio.FS_TOPDIR_FL
    assert fileio.spread_subdirectories(d) == ""  # already set: nothing to do, no error
    assert dir_flags(d) & fileio.FS_TOPDIR_FL


def test_spread_subdirectories_says_why_not_and_never_raises(tmp_path: Path) -> None:
    assert "open" in fileio.spread_subdirectories(tmp_path / "missing")
    f = tmp_path / "file"
    f.write_bytes(b"")
    assert fileio.spread_subdirectories(f)  # not a directory
