"""ConsumeQueue and ConsumeQueueStore: golden bytes, puts and RocketMQ's checks, gaps and
pre-blanks, recovery, truncation, min offsets, read-only views in step with the writer,
time lookup, real stores, faults."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import overload

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.engine import fileio
from mqstore.engine.consumequeue import ConsumeQueue, PutStatus, Unit
from mqstore.engine.consumequeue_files import PRE_BLANK_SIZE, CqUnit, cq_file_size, detect_file_size
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.findings import errors
from mqstore.engine.segment_queue import SegmentQueue
from tests.engine import cq_index_golden as golden

StoreCopy = Callable[[str], Path]
PRE_BLANK = CqUnit(0, PRE_BLANK_SIZE, 0)


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def _open(d: Path, size: int = 100, *, read_only: bool = False) -> ConsumeQueue:
    cq = ConsumeQueue(SegmentQueue(d, cq_file_size(size), read_only=read_only), "T", 0).load()
    if not read_only:
        cq.recover()
    return cq


def _fill(cq: ConsumeQueue, n: int, start: int = 0, step: int = 100) -> None:
    for qo in range(start, start + n):
        assert cq.put(qo * step, step, qo, qo) is PutStatus.OK


def test_golden_bytes(tmp_path: Path) -> None:
    cq = golden.build_cq(tmp_path / "cq")
    assert golden.cq_bytes(cq) == golden.CQ_GOLDEN.read_bytes()
    assert [name for name in sorted(os.listdir(tmp_path / "cq"))] == [
        "00000000000000000000",
        "00000000000000000100",
    ]
    cq.close()


def test_golden_file_reads_back(tmp_path: Path) -> None:
    raw = golden.CQ_GOLDEN.read_bytes()
    d = tmp_path / "cq"
    d.mkdir()
    (d / "00000000000000000000").write_bytes(raw[:100])
    (d / "00000000000000000100").write_bytes(raw[100:])
    cq = _open(d)
    assert cq.max_offset() == 7 and cq.max_physical_offset == 6 * 150 + 150
    assert [tuple(u) for _, u in cq.units(0, 100)] == golden.CQ_UNITS
    assert cq.check() == []
    cq.close()


def test_file_size_rounds_up_to_units() -> None:
    assert cq_file_size(128) == 140 and cq_file_size(4096) == 4100
    assert cq_file_size(6_000_000) == 6_000_000
    with pytest.raises(ValueError):
        cq_file_size(0)


def test_queue_refuses_files_of_partial_units(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of 20"):
        ConsumeQueue(SegmentQueue(tmp_path, 128), "T", 0)
    assert not list(tmp_path.iterdir())


def test_put_get_units_and_rocketmq_checks(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 12)
    assert (cq.min_offset(), cq.max_offset(), len(cq.queue)) == (0, 12, 3)
    assert cq.get(11) == CqUnit(1100, 100, 11) and cq.get(12) is None and cq.get(-1) is None
    assert [qo for qo, _ in cq.units(3, 4)] == [3, 4, 5, 6]
    # re-dispatch of something already built, and a unit whose offset is taken
    assert cq.put(500, 100, 5, 5) is PutStatus.ALREADY_BUILT
    assert cq.put(5000, 100, 5, 5) is PutStatus.DUPLICATE
    # a gap gets pre-blanks; RocketMQ would put the unit at the wrong place
    assert cq.put(2000, 100, 0, 15) is PutStatus.GAP_FILLED
    assert [u for _, u in cq.units(12, 10)] == [PRE_BLANK] * 3 + [CqUnit(2000, 100, 0)]
    # a gap wider than 4 files is refused
    assert cq.put(3000, 100, 0, 10_000) is PutStatus.REFUSED_GAP
    assert cq.max_offset() == 16
    assert cq.check() == []
    cq.close()


class _CountingUnits(Sequence[Unit]):
    """Units for `put_units` that count every unit it looks at (a slice, its length)."""

    def __init__(self, units: list[Unit]) -> None:
        self._units = units
        self.looked = 0

    def __len__(self) -> int:
        return len(self._units)

    @overload
    def __getitem__(self, i: int) -> Unit: ...
    @overload
    def __getitem__(self, i: slice) -> list[Unit]: ...
    def __getitem__(self, i: int | slice) -> Unit | list[Unit]:
        got = self._units[i]
        self.looked += len(got) if isinstance(i, slice) else 1
        return got


def test_put_units_looks_at_each_unit_a_bounded_number_of_times(tmp_path: Path) -> None:
    """A re-dispatch hands a queue a batch of units it mostly holds already: the work is
    linear in the batch (it was quadratic: every unit the queue held rebuilt the run
    check over all the units after it, 24 minutes for a 247k-record store)."""
    n = 3000
    cq = _open(tmp_path, 20 * 10_000)  # one file: room for every unit
    _fill(cq, n)
    held = _CountingUnits([(qo, qo * 100, 100, qo, qo) for qo in range(n)])
    assert cq.put_units(held) == [PutStatus.ALREADY_BUILT] * n
    assert held.looked <= 3 * n, held.looked
    # held units, then new ones broken up by pre-blanks (a run each): linear too
    mixed = [(qo, qo * 100, 100, qo, qo) for qo in range(n - 1000, n)]
    for qo in range(n, n + 2000):
        mixed.append((qo, -1, 0, 0, qo) if qo % 2 else (qo, qo * 100, 100, qo, qo))
    counted = _CountingUnits(mixed)
    statuses = cq.put_units(counted)
    assert statuses == [PutStatus.ALREADY_BUILT] * 1000 + [PutStatus.OK] * 2000
    assert counted.looked <= 3 * len(mixed), counted.looked
    assert cq.max_offset() == n + 2000 and cq.max_physical_offset == (n + 1998) * 100 + 100
    assert cq.get(n + 1) == PRE_BLANK and cq.get(n + 2) == CqUnit((n + 2) * 100, 100, n + 2)
    assert cq.check() == []
    cq.close()


def test_first_file_of_a_queue_that_starts_late(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    assert cq.put(0, 10, 0, 7) is PutStatus.OK
    # file 100..199 holds units 5..9: pre-blanks for 5 and 6, the min is 7
    assert [s.file_name for s in cq.queue.segments] == ["00000000000000000100"]
    assert (cq.min_offset(), cq.max_offset()) == (7, 8)
    assert cq.get(6) is None and cq.get(7) == CqUnit(0, 10, 0)
    cq.close()
    again = _open(tmp_path)
    assert (again.min_offset(), again.max_offset(), again.max_physical_offset) == (7, 8, 10)
    again.close()


def test_pre_blank_put_keeps_the_queue_dense(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 2)
    assert cq.put_pre_blank(2) is PutStatus.OK
    assert cq.put_pre_blank(2) is PutStatus.DUPLICATE
    assert cq.put(300, 100, 0, 3) is PutStatus.OK
    assert cq.max_offset() == 4 and cq.get(2) == PRE_BLANK
    cq.close()


def test_recover_finds_the_end_and_zeroes_a_torn_unit(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 7)
    cq.flush_all()
    path = cq.queue.segments[-1].path
    cq.close()
    # a torn unit after the last one: offset written, size still zero
    with open(path, "r+b") as f:
        f.seek(40)
        f.write((777).to_bytes(8, "big"))
    cq = _open(tmp_path)
    assert cq.max_offset() == 7 and cq.max_physical_offset == 700
    assert Path(path).read_bytes()[40:] == bytes(60)
    assert cq.put(700, 100, 0, 7) is PutStatus.OK
    assert cq.check() == []
    cq.close()


def test_recover_deletes_an_empty_file_behind_a_full_one(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 5)
    assert cq.put(500, 100, 0, 5) is PutStatus.OK
    cq.close()
    with open(tmp_path / "00000000000000000100", "r+b") as f:
        f.write(bytes(20))
    cq = _open(tmp_path)
    assert cq.max_offset() == 5 and len(cq.queue) == 1
    assert not (tmp_path / "00000000000000000100").exists()
    cq.close()


def test_truncate_dirty_drops_units_at_or_past_an_offset(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 12)
    assert cq.truncate_dirty(550) == 6  # units 6..11 point at 600 and beyond
    assert (cq.max_offset(), cq.max_physical_offset, len(cq.queue)) == (6, 600, 2)
    assert cq.truncate_dirty(10_000) == 0
    assert cq.truncate_dirty(500) == 1
    assert (cq.max_offset(), len(cq.queue)) == (5, 1)
    assert cq.truncate_dirty(0) == 5
    assert (cq.max_offset(), cq.max_physical_offset, len(cq.queue)) == (0, -1, 0)
    assert cq.put(0, 100, 0, 0) is PutStatus.OK
    cq.close()


def test_truncate_drops_trailing_pre_blanks_with_their_unit(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 3)
    cq.put_pre_blank(3)
    cq.put(400, 100, 0, 4)
    assert cq.truncate_dirty(300) == 2  # the unit at 300 is kept; blank and 400 go
    assert cq.max_offset() == 3
    cq.close()


def test_correct_min_offset(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 12)
    cq.correct_min_offset(250)
    assert cq.min_offset() == 3 and cq.get(2) is None
    cq.correct_min_offset(0)
    assert cq.min_offset() == 0
    assert cq.delete_expired(700) == 1  # file 0 (units 0..4, up to 400) goes
    assert cq.min_offset() == 7
    cq.close()


def test_read_only_view_follows_the_writer(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 3)
    ro = _open(tmp_path, read_only=True)
    assert ro.max_offset() == 3 and ro.max_physical_offset == 300
    _fill(cq, 9, start=3)
    assert ro.max_offset() == 3  # until it looks again
    ro.refresh()
    assert ro.max_offset() == 12 and len(ro.queue) == 3
    assert ro.get(11) == CqUnit(1100, 100, 11)
    with pytest.raises(PermissionError):
        ro.put(1200, 100, 0, 12)
    ro.close()
    cq.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 40)), min_size=1, max_size=12))
def test_read_only_refresh_finds_the_end_after_appends_and_cuts(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[bool, int]]
) -> None:
    """The read-only refresh searches on from the end it found before (units are written
    in order) and from scratch when the unit before that end is gone (a cut): either
    way it finds what a search of the whole file finds, and the writer's end while no
    file was deleted (a reader keeps a deleted file's mapping: a restart reopens it)."""
    d = tmp_path_factory.mktemp("cq")
    cq = _open(d)
    ro = _open(d, read_only=True)
    end, deleted = 0, False
    for append, n in steps:
        if append:
            _fill(cq, n, start=end)
            end += n
        else:
            files = len(cq.queue)
            cq.cut_at(min(n, end))
            end = min(n, end)
            deleted |= len(cq.queue) < files
        ro.refresh()
        last = ro.queue.last()
        if last is not None:  # what a search of the whole (mapped) file finds
            found = last.wrote_position
            last.adopt_positions(last.size_bytes, last.size_bytes, 0)
            assert found == ro._written_end(last)
            last.adopt_positions(found, found, 0)
        if not deleted:
            assert (ro.max_offset(), ro.min_offset()) == (cq.max_offset(), 0) == (end, 0)
            assert ro.max_physical_offset == cq.max_physical_offset
    ro.close()
    cq.close()


def test_offset_for_time(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 20)
    t = {i * 100: 1_000 + 10 * i for i in range(20)}  # store time by physical offset

    def time_of(phy: int, _size: int) -> int:
        return t[phy]

    assert cq.offset_for_time(1_050, time_of, 0) == 5  # exact
    assert cq.offset_for_time(1_052, time_of, 0) == 5  # +2 ms
    assert cq.offset_for_time(1_048, time_of, 0) == 5  # -2 ms
    assert cq.offset_for_time(1_055, time_of, 0) == 5  # tie: the older
    assert cq.offset_for_time(21_000, time_of, 0) == 19
    assert cq.offset_for_time(-20_000, time_of, 0) == 0
    assert cq.offset_for_time(1_000, time_of, 300) == 3  # expired units count as older
    cq.close()


def test_store_loads_queues_and_skips_others(tmp_path: Path) -> None:
    s = ConsumeQueueStore(tmp_path, 100)
    for topic, qid in [("A", 0), ("A", 1), ("B", 3)]:
        cq = s.find_or_create(topic, qid)
        cq.put(0, 10, 0, 0)
    (tmp_path / "consumequeue" / "A" / "not-a-queue").mkdir()
    with pytest.raises(ValueError):
        s.find_or_create("a/b", 0)
    s.close()
    s = ConsumeQueueStore(tmp_path, 100).load()
    assert s.keys() == [("A", 0), ("A", 1), ("B", 3)]
    assert s.recover() == 10
    assert s.queue_offset_table() == {("A", 0): 1, ("A", 1): 1, ("B", 3): 1}
    assert s.check() == []
    assert detect_file_size(tmp_path) == 100
    ro = ConsumeQueueStore(tmp_path, 100, read_only=True).load()
    s.find_or_create("C", 0).put(20, 10, 0, 0)
    cq = ro.get("C", 0)  # created by the writer after the reader opened
    assert cq is not None and cq.max_offset() == 1
    ro.close()
    s.close()


def test_real_rust_store_queue(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("rocketmq-rust-0.9-store")
    s = ConsumeQueueStore(d, detect_file_size(d) or 0).load()
    assert s.recover() == 282
    cq = s.get("V1UpgradeTopic", 0)
    assert cq is not None
    assert [tuple(u) for _, u in cq.units(0, 10)] == [(0, 141, 0), (141, 141, 0)]
    assert not errors(s.check())
    s.close()


def test_real_42_store_queue(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("broker-4.2-unit-store")
    s = ConsumeQueueStore(d, 200).load()
    assert s.recover() > 0
    cq = s.get("abc", 0)
    assert cq is not None and cq.max_offset() == 56
    units = [u for _, u in cq.units(0, 100)]
    assert all(u.tags_code < -(2**31) for u in units)  # consume-queue-ext addresses
    assert [u.physical_offset for u in units] == sorted(u.physical_offset for u in units)
    s.close()


def test_flush_failure_is_a_store_io_error(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 3)
    fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected"))
    with pytest.raises(fileio.StoreIOError) as ei:
        cq.flush(0)
    assert ei.value.errno == errno.EIO
    fileio.clear_faults()
    assert cq.flush(0) == 60
    cq.close()


def test_file_creation_failure_is_a_store_io_error(tmp_path: Path) -> None:
    cq = _open(tmp_path)
    _fill(cq, 5)
    fileio.set_fault("fallocate", lambda: OSError(errno.ENOSPC, "injected"))
    with pytest.raises(fileio.StoreIOError):
        cq.put(500, 100, 0, 5)
    fileio.clear_faults()
    assert cq.put(500, 100, 0, 5) is PutStatus.OK
    cq.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(0, 23),
    cut=st.integers(0, 2500),
    blanks=st.sets(st.integers(0, 22), max_size=5),
)
def test_truncate_keeps_exactly_the_units_below_the_cut(
    tmp_path_factory: pytest.TempPathFactory, n: int, cut: int, blanks: set[int]
) -> None:
    """Model: units are kept while they point below the cut; a pre-blank is kept only
    when a kept unit follows it (or it leads the queue)."""
    d = tmp_path_factory.mktemp("cq")
    cq = _open(d)
    for qo in range(n):
        if qo in blanks and qo > 0:
            cq.put_pre_blank(qo)
        else:
            cq.put(qo * 100, 100, 0, qo)
    kept = 0
    for qo in range(n):
        if qo in blanks and qo > 0:
            continue
        if qo * 100 >= cut:
            break
        kept = qo + 1
    cq.truncate_dirty(cut)
    assert cq.max_offset() == kept, (n, cut, sorted(blanks))
    assert cq.check() == []
    cq.close()
    again = _open(d)
    assert again.max_offset() == kept
    again.close()
