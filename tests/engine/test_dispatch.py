"""Dispatcher: consume-queue units and index keys from the commit log, limits, restarts,
transactions, fillers, a log appended by another handle, and the real RocketMQ stores
(re-dispatch must rebuild what the brokers wrote)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqstore.engine import fileio
from mqstore.engine.checkpoint import CheckpointFields
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import PutStatus
from mqstore.engine.consumequeue_files import PRE_BLANK_SIZE
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher, DispatchStop
from mqstore.engine.filler import filler_record
from mqstore.engine.indexservice import IndexService
from mqstore.engine.reader import Geometry
from mqstore.engine.record import SysFlag
from mqstore.engine.recordcodes import tags_code
from mqstore.engine.segment_queue import SegmentQueue
from tests.engine.storebuild import (
    CQ_FILE,
    ENTRIES,
    SLOTS,
    message,
    open_log,
    write_messages,
)

StoreCopy = Callable[[str], Path]
ALL = (0, (1 << 63) - 1)


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def _parts(store: Path) -> tuple[ConsumeQueueStore, IndexService]:
    return ConsumeQueueStore(store, CQ_FILE), IndexService(store, SLOTS, ENTRIES)


def test_units_and_keys_match_the_records(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    results = write_messages(log, 60, queues=3)
    cqs, idx = _parts(tmp_path)
    cp = CheckpointFields()
    res = Dispatcher(log, cqs, idx, checkpoint=cp).dispatch(0, log.max_offset())
    assert (res.stop, res.next_offset) == (DispatchStop.LIMIT, log.max_offset())
    assert (res.records, res.units_written, res.index_keys) == (60, 60, 180)
    assert res.put_statuses == {PutStatus.OK: 60}
    assert cp.logics_msg_timestamp == results[-1].store_timestamp
    for q in range(3):
        cq = cqs.get("T", q)
        assert cq is not None and cq.max_offset() == 20
        mine = [r for i, r in enumerate(results) if i % 3 == q]
        got = [u for _, u in cq.units(0, 100)]
        assert [(u.physical_offset, u.size) for u in got] == [
            (r.wrote_offset, r.wrote_bytes) for r in mine
        ]
        assert [u.tags_code for u in got] == [
            tags_code(f"tag{i % 3}") for i in range(60) if i % 3 == q
        ]
    assert idx.query_offsets("T", "key7", 64, *ALL).phy_offsets == [results[7].wrote_offset]
    assert idx.query_offsets("T", "U00000007", 64, *ALL).phy_offsets == [results[7].wrote_offset]
    assert len(idx.query_offsets("T", "common", 64, *ALL).phy_offsets) == 60
    assert len(log.queue) > 1  # the walk hopped BLANKs
    assert cqs.check() == [] and idx.check() == []
    for c in (log, cqs, idx):
        c.close()


def test_limit_and_restart_and_idempotence(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    results = write_messages(log, 30)
    cqs, idx = _parts(tmp_path)
    d = Dispatcher(log, cqs, idx)
    mid = results[10].wrote_offset + 5  # inside record 10: it must wait
    r1 = d.dispatch(0, mid)
    assert (r1.stop, r1.next_offset, r1.units_written) == (
        DispatchStop.LIMIT,
        results[10].wrote_offset,
        10,
    )
    r2 = d.dispatch(r1.next_offset, log.max_offset(), max_records=7)
    assert (r2.stop, r2.units_written) == (DispatchStop.MAX_RECORDS, 7)
    assert r2.next_offset == results[17].wrote_offset
    r3 = d.dispatch(r2.next_offset, log.max_offset())
    assert r3.next_offset == log.max_offset() and r3.units_written == 13
    again = d.dispatch(0, log.max_offset())  # re-dispatch writes nothing new
    assert again.units_written == 0 and again.index_keys == 0
    assert again.put_statuses == {PutStatus.ALREADY_BUILT: 30}
    assert d.dispatch(log.max_offset(), log.max_offset()).stop is DispatchStop.LIMIT
    assert cqs.queue_offset_table() == {("T", 0): 15, ("T", 1): 15}
    for c in (log, cqs, idx):
        c.close()


def test_transactions_and_filler_skip(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(message(0))
    log.append(message(1, sys_flag=int(SysFlag.TRANSACTION_PREPARED)))
    log.append(message(2, sys_flag=int(SysFlag.TRANSACTION_ROLLBACK)))
    assert log.append_encoded(filler_record(200, "T", 0), "T", 0).ok  # queue offset 1
    log.append(message(4, sys_flag=int(SysFlag.TRANSACTION_COMMIT)))
    cqs, idx = _parts(tmp_path)
    res = Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    assert (res.records, res.skipped, res.units_written) == (5, 1, 2)
    cq = cqs.get("T", 0)
    assert cq is not None and cq.max_offset() == 3
    units = [u for _, u in cq.units(0, 10)]
    assert units[1].size == PRE_BLANK_SIZE  # the filler's slot
    assert idx.query_offsets("T", "key1", 64, *ALL).phy_offsets != []  # PREPARED: indexed
    assert idx.query_offsets("T", "key2", 64, *ALL).phy_offsets == []  # ROLLBACK: not
    for c in (log, cqs, idx):
        c.close()


def test_read_only_log_follows_the_appender(tmp_path: Path) -> None:
    writer = open_log(tmp_path)
    write_messages(writer, 5)
    q = SegmentQueue(tmp_path / "commitlog", writer.queue.segment_size_bytes, read_only=True)
    q.load()
    ro = CommitLog(q)
    cqs, idx = _parts(tmp_path)
    d = Dispatcher(ro, cqs, idx)
    r = d.dispatch(0, writer.max_offset())
    assert r.units_written == 5 and r.stop is DispatchStop.LIMIT
    write_messages(writer, 60, start=5)  # rolls into new segments
    total = 5
    at = r.next_offset
    for _ in range(10):
        r = d.dispatch(at, writer.max_offset())
        total += r.units_written
        at = r.next_offset
        if at == writer.max_offset():
            break
    assert total == 65 and at == writer.max_offset()
    for c in (writer, ro, cqs, idx):
        c.close()


def test_corrupt_record_stops_dispatch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    results = write_messages(log, 5)
    seg = log.queue.segments[0]
    seg.target[results[3].wrote_offset + 4] ^= 0xFF  # break the magic
    cqs, idx = _parts(tmp_path)
    r = Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    assert (r.stop, r.next_offset, r.units_written) == (
        DispatchStop.CORRUPT,
        results[3].wrote_offset,
        3,
    )
    assert "magic" in r.reason
    for c in (log, cqs, idx):
        c.close()


def test_queue_file_failure_is_a_store_io_error(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    write_messages(log, 3)
    cqs, idx = _parts(tmp_path)
    fileio.set_fault("fallocate", lambda: OSError(errno.ENOSPC, "injected"))
    with pytest.raises(fileio.StoreIOError):
        Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    fileio.clear_faults()
    r = Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    assert r.units_written == 3
    for c in (log, cqs, idx):
        c.close()


def _real_units(path: Path) -> list[tuple[int, int, int]]:
    out = []
    for name in sorted(os.listdir(path)):
        raw = (path / name).read_bytes()
        for i in range(0, len(raw), 20):
            off = int.from_bytes(raw[i : i + 8], "big", signed=True)
            size = int.from_bytes(raw[i + 8 : i + 12], "big", signed=True)
            tag = int.from_bytes(raw[i + 12 : i + 20], "big", signed=True)
            if off < 0 or size <= 0:
                return out
            out.append((off, size, tag))
    return out


def test_redispatch_of_real_rust_store_is_byte_identical(
    real_store_copy: StoreCopy, tmp_path: Path
) -> None:
    d = real_store_copy("rocketmq-rust-0.9-store")
    log = CommitLog.open(d / "commitlog", 4096, read_only=True)
    fresh = tmp_path / "fresh"
    cqs = ConsumeQueueStore(fresh, 200)
    idx = IndexService(fresh, 32, 128)
    Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    cqs.flush_all()
    name = "00000000000000000000"
    real = (d / "consumequeue" / "V1UpgradeTopic" / "0" / name).read_bytes()
    mine = (fresh / "consumequeue" / "V1UpgradeTopic" / "0" / name).read_bytes()
    assert mine == real
    assert idx.query_offsets("V1UpgradeTopic", "v1-upgrade-key", 32, *ALL).phy_offsets == [
        141,
        0,
    ]
    for c in (log, cqs, idx):
        c.close()


def test_redispatch_of_real_42_store_matches_its_queue(
    real_store_copy: StoreCopy, tmp_path: Path
) -> None:
    d = real_store_copy("broker-4.2-unit-store")
    log = CommitLog.open(d / "commitlog", 8192, read_only=True)
    cqs = ConsumeQueueStore(tmp_path / "fresh", 200)
    res = Dispatcher(log, cqs).dispatch(0, log.max_offset())
    assert res.units_written == 179
    cq = cqs.get("abc", 0)
    assert cq is not None and cq.max_offset() == 179
    mine = [(u.physical_offset, u.size) for _, u in cq.units(0, 1000)]
    real = _real_units(d / "consumequeue" / "abc" / "0")
    assert len(real) == 56
    # offsets and sizes are the broker's; its tag codes are consume-queue-ext addresses
    assert mine[:56] == [(o, s) for o, s, _t in real]
    log.close()
    cqs.close()


def test_redispatch_of_real_49_log(real_store_copy: StoreCopy, tmp_path: Path) -> None:
    d = real_store_copy("broker-4.9-commitlog")
    log = CommitLog.open(d / "commitlog", 8192, read_only=True)
    cqs = ConsumeQueueStore(tmp_path / "fresh", 6_000_000)
    res = Dispatcher(log, cqs).dispatch(0, log.max_offset())
    assert (res.units_written, res.stop) == (47, DispatchStop.WAIT_NEXT_SEGMENT)
    assert res.next_offset == 47 * 172
    assert cqs.queue_offset_table() == {("abc", 0): 47}
    log.close()
    cqs.close()


def test_open_for_a_dispatcher_process_and_resume(tmp_path: Path) -> None:
    geo = Geometry(4096, CQ_FILE, SLOTS, ENTRIES)
    writer = open_log(tmp_path)
    results = write_messages(writer, 20)
    d = Dispatcher.open(tmp_path, geo)
    assert d.resume_offset() == 0
    r = d.dispatch(d.resume_offset(), results[12].wrote_offset)
    assert r.units_written == 12
    d.close()
    # a restarted dispatcher resumes where the queues end
    d = Dispatcher.open(tmp_path, geo)
    assert d.resume_offset() == results[12].wrote_offset
    write_messages(writer, 40, start=20)
    at = d.resume_offset()
    total = 0
    while at < writer.max_offset():
        r = d.dispatch(at, writer.max_offset())
        total += r.units_written
        assert r.next_offset > at or r.stop is DispatchStop.LIMIT
        at = r.next_offset
    assert total == 48
    assert d.queues.queue_offset_table() == {("T", 0): 30, ("T", 1): 30}
    d.close()
    writer.close()


def test_a_dispatcher_killed_between_two_queues_resumes_from_what_it_published(
    tmp_path: Path,
) -> None:
    geo = Geometry(4096, CQ_FILE, SLOTS, ENTRIES)
    writer = open_log(tmp_path)
    results = write_messages(writer, 40)  # queues 0 and 1 alternate
    d = Dispatcher.open(tmp_path, geo)
    published = d.dispatch(0, results[20].wrote_offset).next_offset
    # The next round wrote queue 0's units of records 20..39 and was killed before queue 1's.
    q0 = d.queues.get("T", 0)
    assert q0 is not None
    for i in range(20, 40, 2):
        r = results[i]
        put = q0.put(r.wrote_offset, r.wrote_bytes, tags_code(f"tag{i % 3}"), r.queue_offset)
        assert put is PutStatus.OK
    d.close()
    d = Dispatcher.open(tmp_path, geo)
    # From the furthest queue, queue 1 would get pre-blanks for records 21..37.
    assert d.resume_offset() == results[38].wrote_offset + results[38].wrote_bytes
    at = d.resume_offset(published)
    assert at == published
    while at < writer.max_offset():
        at = d.dispatch(at, writer.max_offset()).next_offset
    for q in (0, 1):
        cq = d.queues.get("T", q)
        assert cq is not None
        got = [(u.physical_offset, u.size) for _, u in cq.units(0, 100)]
        assert got == [(r.wrote_offset, r.wrote_bytes) for r in results[q::2]]
    # A first start (nothing published past the queues) still starts at the furthest queue.
    assert d.resume_offset(writer.max_offset()) == d.resume_offset()
    d.close()
    writer.close()


def test_a_topic_outside_the_name_rule_never_becomes_a_directory(tmp_path: Path) -> None:
    """Defence in depth: the client refuses such topics (engine.names), but an older store
    or another writer may hold them. The dispatcher refuses the unit and makes no path."""
    log = open_log(tmp_path)
    bad = ["a b", "a\tb", "..", "é"]
    for i, topic in enumerate(bad):
        assert log.append(message(i, topic=topic)).ok
    assert log.append(message(9, topic="ok")).ok
    cqs, idx = _parts(tmp_path)
    res = Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    assert res.stop is DispatchStop.LIMIT and res.units_written == 1
    assert [key for key, _qo, _phys in res.refused] == [(t, 0) for t in bad]
    assert sorted(os.listdir(tmp_path / "consumequeue")) == ["ok"]
    with pytest.raises(ValueError, match="not allowed"):
        cqs.find_or_create("a b", 0)
    cqs.close()
    idx.close()
    log.close()
