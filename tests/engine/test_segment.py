"""Segment (RocketMQ's MappedFile): files, positions, commit/flush rules, reads,
reference counting, warm-up, the runtime's primitives, and I/O faults."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.engine import fileio
from mqstore.engine.filesync import SyncMethod
from mqstore.engine.findings import Severity, errors
from mqstore.engine.segment import (
    OS_PAGE_SIZE,
    ReadStatus,
    Segment,
    SegmentNameError,
    SegmentSizeError,
    parse_segment_file_name,
    segment_file_name,
)

SIZE = 4 * OS_PAGE_SIZE


class Clock:
    def __init__(self, ms: int = 1_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def test_names_are_20_digit_offsets() -> None:
    assert segment_file_name(0) == "00000000000000000000"
    assert segment_file_name(1073741824) == "00000000001073741824"
    assert parse_segment_file_name("00000000001073741824") == 1073741824
    with pytest.raises(SegmentNameError):
        parse_segment_file_name("1073741824")
    with pytest.raises(ValueError):
        segment_file_name(-1)


def test_create_preallocates_and_starts_empty(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, SIZE, SIZE)
    try:
        assert (tmp_path / "00000000000000016384").stat().st_size == SIZE
        assert not list(tmp_path.glob("*.tmp"))
        assert (seg.wrote_position, seg.committed_position, seg.flushed_position) == (0, 0, 0)
        assert seg.start_offset == SIZE and seg.end_offset == 2 * SIZE
        assert seg.check() == []
        with pytest.raises(FileExistsError):
            Segment.create(tmp_path, SIZE, SIZE)
    finally:
        seg.close()


def test_open_checks_size_and_defaults_to_full_positions(tmp_path: Path) -> None:
    Segment.create(tmp_path, 0, SIZE).close()
    with pytest.raises(SegmentSizeError) as ei:
        Segment(tmp_path / segment_file_name(0), SIZE * 2)
    assert ei.value.path.endswith("00000000000000000000") and ei.value.actual_bytes == SIZE
    seg = Segment(tmp_path / segment_file_name(0), SIZE)
    assert seg.is_full() and seg.read_position == SIZE and seg.flushed_position == SIZE
    seg.close()


def test_mmap_path_append_read_flush(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, SIZE)
    try:
        assert seg.append_bytes(b"hello")
        assert seg.read_position == 5  # the mapping is the file: readable at once
        with seg.select(0, 5) as sl:
            assert sl.status is ReadStatus.OK and bytes(sl.view) == b"hello"
            assert sl.physical_offset == 0 and seg.ref_count == 2
        assert seg.ref_count == 1
        assert seg.select(0, 6).status is ReadStatus.BEYOND_READ_POSITION
        assert seg.commit(0) == 5  # nothing to copy, says the wrote position
        assert seg.flush(1) == 0  # fewer than one whole page new
        assert seg.flush(0) == 5
        assert seg.append_bytes(b"x" * (SIZE - 5)) and seg.is_full()
        assert not seg.append_bytes(b"y")
        assert seg.flush(4) == SIZE  # a full segment is always able to flush
        assert (tmp_path / segment_file_name(0)).read_bytes()[:5] == b"hello"
        assert seg.check() == []
    finally:
        seg.close()


def test_write_buffer_path_commit_rules_and_buffer_return(tmp_path: Path) -> None:
    returned: list[object] = []
    buf = bytearray(SIZE)
    seg = Segment.create(tmp_path, 0, SIZE, write_buffer=buf, on_buffer_done=returned.append)
    try:
        seg.append_bytes(b"a" * 100)
        assert seg.read_position == 0  # readers see committed bytes only
        assert seg.select(0, 1).status is ReadStatus.BEYOND_READ_POSITION
        assert seg.commit(1) == 0  # less than a whole page written: not able
        assert seg.commit(0) == 100
        assert seg.read_position == 100 and seg.read_bytes(0, 100) == b"a" * 100
        # isAbleToCommit counts whole pages: 4095 -> 4097 crosses one page boundary.
        seg.append_bytes(b"b" * (OS_PAGE_SIZE - 1 - 100))
        seg.commit(0)
        seg.append_bytes(b"c" * 2)
        assert seg.committed_position == OS_PAGE_SIZE - 1
        assert seg.commit(1) == OS_PAGE_SIZE + 1
        assert seg.flush(0) == OS_PAGE_SIZE + 1
        seg.append_bytes(b"d" * (SIZE - seg.wrote_position))
        assert not returned and seg.has_write_buffer
        assert seg.commit(4) == SIZE  # full: able regardless of pages
        assert returned == [buf] and not seg.has_write_buffer
        assert seg.read_position == SIZE
        assert seg.check(deep=True) == []
        data = (tmp_path / segment_file_name(0)).read_bytes()
        assert data[:100] == b"a" * 100 and data[-1:] == b"d"
    finally:
        seg.close()


def test_deep_check_sees_buffer_and_file_disagree(tmp_path: Path) -> None:
    buf = bytearray(SIZE)
    seg = Segment.create(tmp_path, 0, SIZE, write_buffer=buf)
    try:
        seg.append_bytes(b"abc")
        seg.commit(0)
        buf[1] = ord("X")
        found = seg.check(deep=True)
        assert [f.severity for f in found] == [Severity.ERROR]
        assert "differ" in found[0].what
    finally:
        seg.close()


def test_positions_from_outside(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, SIZE)
    seg.close()
    shared = bytearray(SIZE)
    shared[:11] = b"from a pool"
    seg = Segment(tmp_path / segment_file_name(0), SIZE)
    seg.adopt_positions(0, 0, 0)
    try:
        assert seg.commit_range(shared, 0, 11) == 11
        assert seg.committed_position == 11 and seg.wrote_position == 11
        assert seg.flush_to(11, wrote_through_pwrite=True) == 11
        assert seg.flush_to(5, wrote_through_pwrite=True) == 11  # never moves back
        with pytest.raises(ValueError):
            seg.commit_range(shared, 5, 2)
        with pytest.raises(ValueError):
            seg.adopt_positions(10, 10, 11)
        seg.adopt_positions(20, 20, 11)
        assert seg.read_bytes(0, 11) == b"from a pool"
    finally:
        seg.close()
    with pytest.raises(ValueError):
        Segment(tmp_path / segment_file_name(0), SIZE, write_buffer=bytearray(10))


@pytest.mark.parametrize("method", list(SyncMethod))
def test_both_sync_methods_flush(tmp_path: Path, method: SyncMethod) -> None:
    seg = Segment.create(tmp_path, 0, SIZE, mmap_sync=method)
    try:
        seg.append_bytes(b"z" * 5000)
        assert seg.flush(0) == 5000
    finally:
        seg.close()


def test_reference_counting_rocketmq_semantics(tmp_path: Path) -> None:
    clock = Clock()
    seg = Segment.create(tmp_path, 0, SIZE, clock_ms=clock)
    seg.append_bytes(b"q" * 10)
    assert seg.ref_count == 1 and seg.hold() and seg.ref_count == 2
    sl = seg.select(0, 10)
    assert seg.ref_count == 3
    seg.shutdown(1000)  # first call: unavailable, initial reference dropped
    assert not seg.available and seg.ref_count == 2 and not seg.is_cleanup_over()
    assert not seg.hold()
    assert seg.select(0, 1).status is ReadStatus.UNAVAILABLE
    clock.ms += 999
    seg.shutdown(1000)  # too early to force
    assert seg.ref_count == 2
    assert not seg.destroy(1000)
    assert (tmp_path / segment_file_name(0)).exists()
    clock.ms += 1
    sl.release()  # the view goes first, so the forced unmap can close the mapping
    assert seg.destroy(1000)  # forced: -1000 - 1, cleaned up despite the holder
    assert seg.ref_count < 0 and seg.is_cleanup_over()
    assert not (tmp_path / segment_file_name(0)).exists()
    seg.release()  # a late release of the forced-out holder is harmless
    assert seg.is_cleanup_over()
    assert not errors(seg.check())


def test_release_to_zero_cleans_up_then_destroy_deletes(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, SIZE)
    assert seg.hold()
    seg.shutdown(60_000)
    assert not seg.is_cleanup_over()
    seg.release()
    assert seg.is_cleanup_over()
    assert seg.destroy(60_000)
    assert not (tmp_path / segment_file_name(0)).exists()


def test_view_kept_past_release_defers_unmap_and_is_reported(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, SIZE)
    seg.append_bytes(b"keep")
    sl = seg.select(0, 4)
    kept = sl.view[0:2]  # a careless reader keeps a sub-view
    sl.release()
    assert seg.destroy(0) or seg.destroy(0)
    assert any("unmapped late" in f.what for f in seg.check())
    assert bytes(kept) == b"ke"
    kept.release()


def test_warm_touches_every_page_and_survives_mlock_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seg = Segment.create(tmp_path, 0, SIZE)
    try:
        with caplog.at_level(logging.WARNING):
            res = seg.warm(sync_every_pages=2)
        assert res.pages_touched == SIZE // OS_PAGE_SIZE
        assert res.locked or ("mlock failed" in res.reason and caplog.records)
        seg.munlock()
        seg.append_bytes(b"after warm")
        with pytest.raises(ValueError):
            seg.warm()
    finally:
        seg.close()


def test_pwrite_fault_in_commit_raises_and_keeps_position(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, SIZE, write_buffer=bytearray(SIZE))
    try:
        seg.append_bytes(b"x" * 50)
        fileio.set_fault("pwrite", lambda: OSError(errno.ENOSPC, "injected"))
        with pytest.raises(fileio.StoreIOError) as ei:
            seg.commit(0)
        assert ei.value.errno == errno.ENOSPC and ei.value.op == "pwrite"
        assert seg.committed_position == 0 and seg.ref_count == 1
        fileio.clear_faults()
        assert seg.commit(0) == 50
    finally:
        seg.close()


def test_commit_range_writes_in_commit_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's bytes go to the file in writes that end on COMMIT_PIECE boundaries, so
    the page cache never makes a larger new folio for them (fileio.COMMIT_PIECE)."""
    size, piece = 4 * fileio.COMMIT_PIECE, fileio.COMMIT_PIECE
    buf = bytearray(os.urandom(size))
    calls: list[tuple[int, int]] = []
    real = os.pwrite

    def recording(fd: int, data: memoryview, at: int) -> int:
        calls.append((at, len(data)))
        return real(fd, data, at)

    seg = Segment.create(tmp_path, 0, size, write_buffer=buf)
    try:
        monkeypatch.setattr(fileio.os, "pwrite", recording)
        assert seg.commit_range(buf, 1000, size - 1000) == size - 2000
        monkeypatch.undo()
        assert seg.read_bytes(1000, size - 2000) == bytes(buf[1000 : size - 1000])
    finally:
        seg.close()
    assert calls == [
        (1000, piece - 1000), (piece, piece), (2 * piece, piece), (3 * piece, piece - 1000),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("op", "method"), [("fdatasync", SyncMethod.FDATASYNC), ("msync", SyncMethod.MSYNC)]
)
def test_sync_fault_in_flush_raises_and_keeps_position(
    tmp_path: Path, op: str, method: SyncMethod
) -> None:
    seg = Segment.create(tmp_path, 0, SIZE, mmap_sync=method)
    try:
        seg.append_bytes(b"x" * 50)
        fileio.set_fault(op, lambda: OSError(errno.EIO, "injected"))
        with pytest.raises(fileio.StoreIOError) as ei:
            seg.flush(0)
        assert ei.value.op == op and ei.value.errno == errno.EIO
        assert seg.flushed_position == 0 and seg.ref_count == 1
    finally:
        fileio.clear_faults()
        seg.close()


def test_create_fault_leaves_no_segment_file(tmp_path: Path) -> None:
    fileio.set_fault("fallocate", lambda: OSError(errno.ENOSPC, "injected"))
    with pytest.raises(fileio.StoreIOError):
        Segment.create(tmp_path, 0, SIZE)
    assert not (tmp_path / segment_file_name(0)).exists()


def test_check_reports_a_shrunk_file(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, SIZE)
    try:
        os.truncate(tmp_path / segment_file_name(0), SIZE)  # same size: fine
        assert seg.check() == []
        with open(tmp_path / segment_file_name(0), "r+b") as f:
            f.truncate(SIZE * 2)
        assert any("expected" in f.what for f in errors(seg.check()))
    finally:
        seg.close()
