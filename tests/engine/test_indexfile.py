"""IndexFile and IndexService: golden bytes, hashing, capacity, chains and collisions,
time ranges, rolling, truncation, read-only views, the real rocketmq-rust index, faults."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqstore.engine import fileio
from mqstore.engine.filesync import DEFAULT_MMAP_SYNC, SyncMethod
from mqstore.engine.indexfile import (
    IndexFile,
    IndexGeometryError,
    index_file_name,
    index_file_size,
    key_hash,
)
from mqstore.engine.indexservice import IndexService
from mqstore.engine.record import SysFlag
from mqstore.engine.recordcodes import java_string_hash
from tests.engine import cq_index_golden as golden

StoreCopy = Callable[[str], Path]
ALL = (0, (1 << 63) - 1)
T0 = 1_700_000_000_000


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


class Clock:
    def __init__(self, ms: int = T0) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def test_golden_bytes(tmp_path: Path) -> None:
    f = golden.build_index(tmp_path)
    assert Path(f.path).read_bytes() == golden.INDEX_GOLDEN.read_bytes()
    assert f.file_name == index_file_name(T0) and len(f.file_name) == 17
    h = f.header()
    assert (h.begin_phy_offset, h.end_phy_offset, h.index_count) == (0, 750, 7)
    assert (h.begin_timestamp, h.end_timestamp) == (T0, T0 + 11_000)
    f.close()


def test_golden_file_reads_back(tmp_path: Path) -> None:
    p = tmp_path / "20231114221320000"
    p.write_bytes(golden.INDEX_GOLDEN.read_bytes())
    f = IndexFile.open(p, golden.INDEX_SLOTS, golden.INDEX_ENTRIES, read_only=True)
    assert f.select_phy_offsets("T#k1", 10, *ALL) == [600, 0]
    # "Aa" and "BB" share a Java hash: the index cannot tell them apart (RocketMQ neither)
    assert f.select_phy_offsets("T#Aa", 10, *ALL) == [450, 300]
    assert f.select_phy_offsets("T#nope", 10, *ALL) == []
    f.close()


def test_key_hash_is_javas_abs_hash() -> None:
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert key_hash("polygenelubricants") == 0
    assert key_hash("T#k1") == abs(java_string_hash("T#k1"))


def test_capacity_is_entries_minus_one(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path, 4, 10, now_ms_value=T0)
    assert os.path.getsize(f.path) == index_file_size(4, 10) == 40 + 16 + 200
    for i in range(9):
        assert f.put_key(f"T#k{i}", i, T0 + i)
    assert f.is_write_full() and not f.put_key("T#k9", 9, T0 + 9)
    f.close()


def test_time_range_and_max_num(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path, 4, 64, now_ms_value=T0)
    for i in range(10):
        f.put_key("T#k", i * 100, T0 + i * 1000)
    assert f.select_phy_offsets("T#k", 3, *ALL) == [900, 800, 700]
    assert f.select_phy_offsets("T#k", 64, T0 + 2000, T0 + 4000) == [400, 300, 200]
    # time is kept in seconds: a message stored at +4.5 s reads as +4 s
    f.put_key("T#j", 1000, T0 + 4500)
    assert f.select_phy_offsets("T#j", 64, T0 + 4001, T0 + 9000) == []
    assert f.is_time_matched(T0 + 1, T0 + 2) and not f.is_time_matched(T0 + 20_000, T0 + 30_000)
    f.close()


def test_service_builds_keys_and_rolls(tmp_path: Path) -> None:
    rolled: list[int] = []
    svc = IndexService(tmp_path, 4, 10, clock_ms=Clock(), on_roll=rolled.append)
    for i in range(20):  # 2 keys per message, 9 per file
        assert svc.build_index("T", f"k{i % 3}", f"U{i}", i * 100, T0 + i * 1000, 0) == 2
    assert len(svc.files) == 5 and len({f.file_name for f in svc.files}) == 5
    assert rolled == [f.end_timestamp for f in svc.files[:-1]]
    res = svc.query_offsets("T", "k1", 64, *ALL)
    assert res.phy_offsets == [1900, 1600, 1300, 1000, 700, 400, 100]
    assert res.index_last_update_phy_offset == 1900
    assert svc.query_offsets("T", "U7", 64, *ALL).phy_offsets == [700]
    assert svc.query_offsets("T", "k1", 2, *ALL).phy_offsets == [1900, 1600]
    # already indexed: nothing is written twice
    assert svc.build_index("T", "k1", "U19", 1900, T0 + 19_000, 0) == 0
    assert svc.query_offsets("T", "U19", 64, *ALL).phy_offsets == [1900]
    assert svc.check() == []
    svc.close()


def test_keys_rules_and_rollback(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, 16, 64, clock_ms=Clock())
    assert svc.build_index("T", "a  b", None, 0, T0, 0) == 2  # empty tokens skipped
    assert svc.build_index("T", "c", None, 100, T0, int(SysFlag.TRANSACTION_ROLLBACK)) == 0
    assert svc.build_index("T", "d", None, 200, T0, int(SysFlag.TRANSACTION_PREPARED)) == 1
    assert svc.build_index("T", None, None, 300, T0, 0) == 0
    assert svc.query_offsets("T", "b", 64, *ALL).phy_offsets == [0]
    assert svc.query_offsets("Other", "b", 64, *ALL).phy_offsets == []
    svc.close()


def _store_times(times: dict[int, int]) -> Callable[[int], int | None]:
    """A commit log's `store_time_of` for the records (offset -> store time) it holds."""
    return times.get


def test_truncate_repairs_chains(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, 4, 10, clock_ms=Clock())
    for i in range(20):
        svc.build_index("T", f"k{i % 3}", None, i * 100, T0 + i * 1000, 0)
    times = {i * 100: T0 + i * 1000 for i in range(20)}
    assert svc.truncate_dirty(1050, _store_times(times)) == 9  # messages 11..19
    assert svc.query_offsets("T", "k1", 64, *ALL).phy_offsets == [1000, 700, 400, 100]
    assert svc.check() == []
    # re-dispatching the rest rebuilds the same answers
    for i in range(20):
        svc.build_index("T", f"k{i % 3}", None, i * 100, T0 + i * 1000, 0)
    assert svc.query_offsets("T", "k1", 64, *ALL).phy_offsets == [
        1900, 1600, 1300, 1000, 700, 400, 100
    ]  # fmt: skip
    assert svc.truncate_dirty(0, _store_times(times)) == 20 and svc.files == []
    svc.close()


# Store times not on whole seconds past the file's begin (T0 + 123), the last kept record
# earlier than the one before it (the clock stepped back): (key, offset, store time).
_PUTS = [("a", 0, T0 + 123), ("b", 100, T0 + 5_456), ("c", 200, T0 + 4_789), ("d", 300, T0 + 6_001)]


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_truncate_leaves_the_header_the_kept_puts_wrote(tmp_path: Path, keep: int) -> None:
    """The header after a truncation is RocketMQ's after the puts of the entries kept:
    the file's bytes are those of a file that only took them, the end time in ms (an
    entry keeps whole seconds past the begin only; the log has the ms)."""
    files = []
    for name, puts in (("cut", _PUTS), ("kept", _PUTS[:keep])):
        f = IndexFile.create(tmp_path / name, 16, 64, now_ms_value=T0)
        for key, phy, ts in puts:
            assert f.put_key(f"T#{key}", phy, ts)
        files.append(f)
    cut, kept = files
    times = {phy: ts for _k, phy, ts in _PUTS}
    assert cut.truncate(_PUTS[keep][1], _store_times(times)) == len(_PUTS) - keep
    assert cut.header() == kept.header()
    assert cut.end_timestamp == _PUTS[keep - 1][2]
    assert bytes(cut.mm) == bytes(kept.mm)
    for f in files:
        f.close()


def test_truncate_of_a_record_gone_from_the_log_keeps_the_entry_time(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path, 16, 64, now_ms_value=T0)
    for key, phy, ts in _PUTS:
        f.put_key(f"T#{key}", phy, ts)
    assert f.truncate(200, _store_times({})) == 2
    assert f.end_timestamp == T0 + 123 + 5_000  # the entry's own lookup time
    f.close()


def test_a_truncated_file_is_found_by_a_query_at_its_last_records_time(tmp_path: Path) -> None:
    """The query a truncation in whole seconds lost: from the kept last record's store
    time on, where an earlier record has a later store time (the clock stepped back).
    With the end in whole seconds (T0 + 4_123) the file seemed to end before the query's
    begin (`IndexFile.is_time_matched`), and "b" (T0 + 5_456) was not found."""
    svc = IndexService(tmp_path, 16, 64, clock_ms=Clock())
    for key, phy, ts in _PUTS:
        svc.build_index("T", key, None, phy, ts, 0)
    times = {phy: ts for _k, phy, ts in _PUTS}
    assert svc.truncate_dirty(300, _store_times(times)) == 1
    begin = T0 + 4_789  # "c"'s store time: the file's end, as "c"'s put wrote it
    assert svc.query_offsets("T", "b", 64, begin, ALL[1]).phy_offsets == [100]
    svc.close()


def test_load_after_a_power_cut_rechains_slots_the_header_does_not_count(
    tmp_path: Path,
) -> None:
    def put(svc: IndexService, ids: range) -> None:
        for i in ids:
            svc.build_index("T", f"k{i % 3}", None, i * 100, T0 + i * 1000, 0)

    svc = IndexService(tmp_path, 4, 64, clock_ms=Clock())
    put(svc, range(8))
    f = svc.files[-1]
    before = dataclasses.asdict(f.header())
    put(svc, range(8, 12))
    want = svc.query_offsets("T", "k1", 64, *ALL).phy_offsets
    # a power cut kept the header page from before the last 4 puts, and the slot page
    # from after them: the header counts 8 entries, some slots point at entries 9..12
    f._set_header(**before)
    svc.close()
    again = IndexService(tmp_path, 4, 64, clock_ms=Clock(T0 + 20_000))
    again.load(last_exit_ok=False)
    assert again.check() == []
    # the re-dispatch of the 4 lost puts chains as before: no entry loops on itself
    put(again, range(8, 12))
    assert again.check() == []
    assert again.query_offsets("T", "k1", 64, *ALL).phy_offsets == want
    again.close()
    # without the repair the same file loops ("entry k chains to k"): the test can fail
    svc = IndexService(tmp_path, 4, 64, clock_ms=Clock())
    svc.load()
    svc.files[-1]._set_header(**before)
    put(svc, range(8, 12))
    assert any("chains to" in x.what for x in svc.check())
    svc.close()


def test_load_after_abnormal_exit_destroys_newer_files(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, 4, 4, clock_ms=Clock())
    for i in range(9):
        svc.build_index("T", "k", None, i * 100, T0 + i * 1000, 0)
    ends = [f.end_timestamp for f in svc.files]
    begins = [f.begin_phy_offset for f in svc.files]
    svc.close()
    again = IndexService(tmp_path, 4, 4)
    destroyed = again.load(last_exit_ok=False, index_msg_timestamp=ends[0])
    assert len(destroyed) == len(ends) - 1 and len(again.files) == 1
    assert again.min_destroyed_begin_phy == begins[1]
    again.close()


def test_read_only_view_and_geometry(tmp_path: Path) -> None:
    w = IndexService(tmp_path, 32, 128, clock_ms=Clock())
    w.build_index("T", "k", None, 0, T0, 0)
    ro = IndexService(tmp_path, 500_000, 2_000_000, read_only=True)  # geometry inferred
    ro.load()
    assert ro.files[0].hash_slot_num == 32
    assert ro.query_offsets("T", "k", 64, *ALL).phy_offsets == [0]
    w.build_index("T", "k", None, 100, T0 + 1, 0)
    assert ro.query_offsets("T", "k", 64, *ALL).phy_offsets == [100, 0]  # same mapping
    bad = tmp_path / "index" / "20990101000000000"
    bad.write_bytes(bytes(1000))
    with pytest.raises(IndexGeometryError):
        ro.refresh()
    ro.close()
    w.close()


def test_real_rust_index(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("rocketmq-rust-0.9-store")
    svc = IndexService(d, 32, 128, read_only=True)
    svc.load()
    assert svc.query_offsets("V1UpgradeTopic", "v1-upgrade-key", 32, *ALL).phy_offsets == [141, 0]
    f = svc.files[0]
    assert f.select_phy_offsets("V1UpgradeTopic#v1-upgrade-key", 32, *ALL) == [141, 0]
    assert svc.check() == []
    svc.close()


def test_create_failure_is_a_store_io_error(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, 4, 10, clock_ms=Clock())
    fileio.set_fault("fallocate", lambda: OSError(errno.ENOSPC, "injected"))
    with pytest.raises(fileio.StoreIOError) as ei:
        svc.build_index("T", "k", None, 0, T0, 0)
    assert ei.value.errno == errno.ENOSPC
    svc.close()


def test_a_new_index_file_is_allocated_not_sparse(tmp_path: Path) -> None:
    """Every block of a new index file is taken at creation: on a full tmpfs a sparse
    file's first touch through the mapping is SIGBUS, not an error."""
    f = IndexFile.create(tmp_path, 4096, 16_384, now_ms_value=T0)
    st = os.stat(f.path)
    assert st.st_size == f.size_bytes
    assert st.st_blocks * 512 >= f.size_bytes, (st.st_blocks * 512, f.size_bytes)
    assert sorted(os.listdir(tmp_path)) == [f.file_name]
    f.close()


def test_no_space_for_an_index_file_leaves_nothing(tmp_path: Path) -> None:
    """ENOSPC while allocating: a StoreIOError the dispatcher waits out (is_no_space), and
    no file under an index name nor a .tmp holding blocks."""
    fileio.set_fault("fallocate", lambda: OSError(errno.ENOSPC, "injected"))
    with pytest.raises(fileio.StoreIOError) as ei:
        IndexFile.create(tmp_path, 4, 10, now_ms_value=T0)
    assert fileio.is_no_space(ei.value) and ei.value.op == "fallocate"
    assert os.listdir(tmp_path) == []


def test_flush_failure_is_a_store_io_error(tmp_path: Path) -> None:
    """An index file is forced with fdatasync where that covers the mapping's pages
    (Linux; it releases the GIL, which mmap.flush does not), else msync."""
    svc = IndexService(tmp_path, 4, 10, clock_ms=Clock())
    svc.build_index("T", "k", None, 0, T0, 0)
    op = "fdatasync" if DEFAULT_MMAP_SYNC is SyncMethod.FDATASYNC else "msync"
    fileio.set_fault(op, lambda: OSError(errno.EIO, "injected"))
    with pytest.raises(fileio.StoreIOError) as ei:
        svc.flush()
    assert ei.value.op == op
    svc.close()


def test_deferred_roll_flushes_nothing_and_lists_the_full_file(tmp_path: Path) -> None:
    """defer_roll_flush (the dispatcher process): a roll forces nothing and calls no
    on_roll; the full file waits in `rolled` for the flush thread."""
    rolled: list[int] = []
    svc = IndexService(tmp_path, 4, 10, clock_ms=Clock(), on_roll=rolled.append,
                       defer_roll_flush=True)  # fmt: skip
    op = "fdatasync" if DEFAULT_MMAP_SYNC is SyncMethod.FDATASYNC else "msync"
    fileio.set_fault(op, lambda: OSError(errno.EIO, "injected"))  # a flush would raise
    for i in range(10):  # 2 keys per message, 9 per file
        svc.build_index("T", f"k{i}", f"U{i}", i * 100, T0 + i * 1000, 0)
    assert len(svc.files) == 3 and svc.rolled == svc.files[:2] and rolled == []
    fileio.clear_faults()
    svc.close()
