"""SegmentQueue (RocketMQ's MappedFileQueue): load rules, lookup, growth and rolling,
commit/flush across files, tail truncation, retention, check()."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.engine import fileio
from mqstore.engine.findings import Severity, errors
from mqstore.engine.record import BLANK_MAGIC_CODE
from mqstore.engine.segment import Segment, SegmentSizeError, segment_file_name
from mqstore.engine.segment_queue import SegmentAllocationError, SegmentQueue, _Segments
from tests.engine.extents import dir_flags

SIZE = 1024


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def _queue(d: Path, **kw: object) -> SegmentQueue:
    q = SegmentQueue(d, SIZE, **kw)  # type: ignore[arg-type]
    q.load()
    return q


def _fill(q: SegmentQueue, n_segments: int) -> None:
    """n full segments, as RocketMQ's testAppendMessage builds them."""
    for _ in range(n_segments):
        seg = q.get_last(q.max_wrote_offset())
        assert seg is not None
        assert seg.append_bytes(b"m" * SIZE)


def test_rocketmq_flush_walks_one_file_per_call(tmp_path: Path) -> None:
    q = _queue(tmp_path / "cl")
    _fill(q, 6)
    assert len(q) == 6 and q.max_offset() == 6 * SIZE
    wheres = []
    for _ in range(6):
        assert q.flush(0) == SIZE  # RocketMQ: false ("something was flushed")
        wheres.append(q.flushed_where)
    assert wheres == [1024, 2048, 3072, 4096, 5120, 6144]
    assert q.flush(0) == 0  # RocketMQ: true ("no progress")
    assert q.check() == []
    q.close()


def test_find_first_last_min_max(tmp_path: Path) -> None:
    q = _queue(tmp_path / "cl")
    assert q.first() is None and q.last() is None and q.find(0) is None
    assert q.min_offset() == -1 and q.max_offset() == 0
    _fill(q, 3)
    seg = q.get_last(q.max_wrote_offset())
    assert seg is not None and seg.start_offset == 3 * SIZE
    seg.append_bytes(b"abc")
    for off, start in [(0, 0), (1023, 0), (1024, 1024), (3 * SIZE + 2, 3 * SIZE)]:
        found = q.find(off)
        assert found is not None and found.start_offset == start
    assert q.find(4 * SIZE) is None
    first = q.find(10**9, first_if_not_found=True)
    assert first is not None and first.start_offset == 0
    assert q.min_offset() == 0 and q.max_offset() == 3 * SIZE + 3
    assert q.remain_to_flush() == 3 * SIZE + 3
    q.close()


def test_empty_queue_creates_at_rounded_offset(tmp_path: Path) -> None:
    q = _queue(tmp_path / "cl")
    seg = q.get_last(2500)
    assert seg is not None and seg.start_offset == 2048 and seg.first_in_queue
    assert q.get_last(0, create=False) is seg
    q.close()


def test_roll_writes_a_blank_and_starts_the_next_segment(tmp_path: Path) -> None:
    q = _queue(tmp_path / "cl")
    seg = q.get_last(0)
    assert seg is not None
    seg.append_bytes(b"r" * 1000)
    nxt = q.roll()
    assert nxt.start_offset == SIZE and seg.is_full()
    raw = seg.read_bytes(1000, 8)
    assert int.from_bytes(raw[:4], "big") == 24
    assert int.from_bytes(raw[4:], "big") == BLANK_MAGIC_CODE
    # fewer than 8 bytes left: just marked full
    nxt.append_bytes(b"s" * (SIZE - 3))
    third = q.roll()
    assert nxt.is_full() and third.start_offset == 2 * SIZE
    assert q.check() == []
    q.close()


def test_roll_into_a_write_buffer(tmp_path: Path) -> None:
    d = tmp_path / "cl"

    def alloc(start: int) -> Segment:
        return Segment.create(d, start, SIZE, write_buffer=bytearray(SIZE))

    q = _queue(d, allocator=alloc)
    seg = q.get_last(0)
    assert seg is not None
    seg.append_bytes(b"w" * 100)
    q.roll()
    assert seg.read_position == 0  # the BLANK sits in the buffer until committed
    assert q.commit(0) == SIZE and q.committed_where == SIZE
    assert seg.read_bytes(100, 8)[4:] == BLANK_MAGIC_CODE.to_bytes(4, "big")
    assert q.commit(0) == 0
    q.close()


def test_allocator_errors_pass_through(tmp_path: Path) -> None:
    def refuse(start: int) -> Segment:
        raise SegmentAllocationError("the write pool is empty")

    q = _queue(tmp_path / "cl", allocator=refuse)
    with pytest.raises(SegmentAllocationError):
        q.get_last(0)
    assert len(q) == 0
    q.close()


def test_load_rejects_a_wrong_size_and_names_the_file(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    q = _queue(d)
    _fill(q, 2)
    q.close()
    os.truncate(d / segment_file_name(0), 1000)
    with pytest.raises(SegmentSizeError) as ei:
        _queue(d)
    assert segment_file_name(0) in str(ei.value)


def test_load_handles_the_empty_last_file(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    q = _queue(d)
    _fill(q, 2)
    q.close()
    (d / segment_file_name(2 * SIZE)).touch()
    (d / (segment_file_name(3 * SIZE) + ".tmp")).write_bytes(b"x" * 10)
    ro = _queue(d, read_only=True)
    assert len(ro) == 2
    assert [f.severity for f in ro.check()] == [Severity.WARNING]
    assert (d / segment_file_name(2 * SIZE)).exists()
    ro.close()
    rw = _queue(d)
    assert len(rw) == 2
    assert not (d / segment_file_name(2 * SIZE)).exists()
    assert not (d / (segment_file_name(3 * SIZE) + ".tmp")).exists()
    assert not errors(rw.check())
    assert {f.severity for f in rw.check()} == {Severity.INFO}
    rw.close()


def test_load_rejects_an_empty_file_in_the_middle(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    q = _queue(d)
    _fill(q, 2)
    q.close()
    os.truncate(d / segment_file_name(0), 0)
    with pytest.raises(SegmentSizeError):
        _queue(d)


def test_loaded_positions_are_full_and_check_sees_a_gap(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    q = _queue(d)
    _fill(q, 3)
    q.close()
    os.unlink(d / segment_file_name(SIZE))
    q = _queue(d)
    assert all(s.is_full() for s in q)
    found = errors(q.check())
    assert len(found) == 1 and "2048 bytes after" in found[0].what
    q.close()


def test_truncate_dirty_cuts_zeroes_and_deletes(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    q = _queue(d)
    _fill(q, 3)
    q.flush_all()
    q.committed_where = q.max_offset()
    res = q.truncate_dirty(SIZE + 100)
    assert (res.offset, res.segments_deleted, res.bytes_zeroed) == (SIZE + 100, 1, SIZE - 100)
    assert len(q) == 2 and not (d / segment_file_name(2 * SIZE)).exists()
    last = q.last()
    assert last is not None and last.wrote_position == 100 and last.flushed_position == 100
    assert q.flushed_where == SIZE + 100 and q.committed_where == SIZE + 100
    assert (d / segment_file_name(SIZE)).read_bytes()[100:] == bytes(SIZE - 100)
    assert q.check() == []
    q.close()


def test_delete_expired_by_time(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    clock = Clock(1_800_000_000_000)
    q = _queue(d, clock_ms=clock)
    _fill(q, 5)
    hour = 3_600_000
    for i, seg in enumerate(q):
        t = (clock.ms - (10 - i) * hour) / 1000  # older first
        os.utime(seg.path, (t, t))
    sleeps: list[int] = []
    # files aged 10h..6h; expire at 7.5h: the first three are old enough
    n = q.delete_expired_by_time(
        7 * hour + hour // 2,
        delete_files_interval_ms=5,
        interval_forcibly_ms=1000,
        clean_immediately=False,
        max_files=2,
        sleep_ms=sleeps.append,
    )
    assert n == 2 and sleeps == [5] and len(q) == 3
    assert q.min_offset() == 2 * SIZE and not (d / segment_file_name(0)).exists()
    n = q.delete_expired_by_time(
        7 * hour + hour // 2,
        delete_files_interval_ms=0,
        interval_forcibly_ms=1000,
        clean_immediately=False,
    )
    assert n == 1 and len(q) == 2  # the 8h-old one goes; the 7h-old one stops the scan
    n = q.delete_expired_by_time(
        100 * hour, delete_files_interval_ms=0, interval_forcibly_ms=1000, clean_immediately=True
    )
    assert n == 1 and len(q) == 1  # never the last
    assert q.check() == []
    q.close()


def test_delete_expired_stops_at_a_held_file_then_forces(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    clock = Clock(10_000_000)
    q = _queue(d, clock_ms=clock)
    _fill(q, 3)
    first = q.first()
    assert first is not None
    sl = first.select(0, 10)
    kw = {"delete_files_interval_ms": 0, "interval_forcibly_ms": 1000, "clean_immediately": True}
    assert q.delete_expired_by_time(0, **kw) == 0  # type: ignore[arg-type]
    assert q.min_offset() == SIZE  # an unavailable first file reads as gone
    assert not q.retry_delete_first(1000)
    clock.ms += 1000
    sl.release()
    assert q.retry_delete_first(1000)
    assert len(q) == 2 and q.min_offset() == SIZE
    q.close()


def test_delete_expired_by_offset_reads_the_last_unit(tmp_path: Path) -> None:
    d = tmp_path / "cq"
    q = _queue(d)
    unit = 16
    for i in range(3):
        seg = q.get_last(q.max_wrote_offset())
        assert seg is not None
        for k in range(SIZE // unit):
            seg.append_bytes((i * 1000 + k).to_bytes(8, "big") + bytes(8))
    # last units hold 63, 1063, 2063
    assert q.delete_expired_by_offset(1000, unit) == 1
    assert q.delete_expired_by_offset(5000, unit) == 1  # never the last
    assert len(q) == 1
    q.close()


def test_destroy_removes_files_and_directory(tmp_path: Path) -> None:
    d = tmp_path / "cl"
    q = _queue(d)
    _fill(q, 2)
    q.destroy()
    assert not d.exists()


def test_read_only_follower_releases_what_it_walked_past(tmp_path: Path) -> None:
    """A forward-only reader (the dispatcher) keeps a bounded window mapped: segments
    wholly below its position are unmapped, never re-added by refresh(), files kept."""
    writer = SegmentQueue(tmp_path, 4096)
    for i in range(4):
        writer._add(i * 4096, first=i == 0)
    ro = SegmentQueue(tmp_path, 4096, read_only=True)
    ro.load()
    assert [s.start_offset for s in ro] == [0, 4096, 8192, 12288]
    assert ro.release_before(4096 + 100) == 1  # the second is still being read
    assert [s.start_offset for s in ro] == [4096, 8192, 12288]
    assert ro.release_before(1 << 40) == 2  # the last one always stays
    assert [s.start_offset for s in ro] == [12288]
    writer._add(4 * 4096, first=False)
    assert ro.refresh() == 1
    assert [s.start_offset for s in ro] == [12288, 16384]
    assert sorted(os.listdir(tmp_path)) == [segment_file_name(i * 4096) for i in range(5)]
    with pytest.raises(RuntimeError):
        writer.release_before(0)
    ro.close()
    writer.close()


def test_a_new_queue_directory_is_made_in_a_parent_that_spreads_its_subdirectories(
    tmp_path: Path,
) -> None:
    """The commit log's directory gets a block group of its own (`fileio.
    spread_subdirectories`), so its segments' inodes share no inode-table block with the
    store's other files: the parent carries ext4's top-directory flag before it is made."""
    store = tmp_path / "store"
    store.mkdir()
    probe = tmp_path / "probe"
    probe.mkdir()
    if fileio.spread_subdirectories(probe):
        pytest.skip("this file system keeps no top-directory flag")
    SegmentQueue(str(store / "commitlog"), SIZE)
    assert (store / "commitlog").is_dir()
    assert dir_flags(store) & fileio.FS_TOPDIR_FL


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.integers(0, 20)),
            st.tuples(st.just("del"), st.integers(0, 20)),
            st.tuples(st.just("clear"), st.just(0)),
        ),
        max_size=40,
    )
)
def test_the_segment_maps_last_is_always_its_highest_starts_segment(
    ops: list[tuple[str, int]],
) -> None:
    """`SegmentQueue.last()` reads `_Segments.last`, kept by the three ways the queue
    changes its map; a plain dict is the reference."""
    got, want = _Segments(), {}
    for op, start in ops:
        if op == "set":
            got[start] = want[start] = object()  # type: ignore[assignment]
        elif op == "del" and start in want:
            del got[start], want[start]
        elif op == "clear":
            got.clear()
            want.clear()
        assert got.last is (want[max(want)] if want else None)
    for refused in ("pop", "popitem", "setdefault", "update", "copy"):
        with pytest.raises(TypeError):
            getattr(got, refused)(0)
