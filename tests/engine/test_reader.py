"""StoreReader: pulls and their statuses, batch caps, tag filters, the readable limit,
lookups by offset, id, key (collisions re-checked) and time, fillers, a live writer,
and the real RocketMQ stores."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from pathlib import Path

import pytest

from mqstore.engine import reader as reader_module
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.filler import filler_record
from mqstore.engine.indexservice import IndexService
from mqstore.engine.pull import TagFilter, pull_units, pull_units_py
from mqstore.engine.reader import DEFAULT_MAX_BYTES, Geometry, GetStatus, StoreReader
from mqstore.engine.record import DecodedRecord, Message, RecordFields, RecordView
from mqstore.engine.recovery import recover_store
from mqstore.ipc.read_results import PullViews
from tests.engine.storebuild import (
    CQ_FILE,
    ENTRIES,
    SEGMENT,
    SLOTS,
    T0,
    StepClock,
    build_store,
    message,
    open_log,
    write_messages,
)

StoreCopy = Callable[[str], Path]
GEO = Geometry(SEGMENT, CQ_FILE, SLOTS, ENTRIES)


def _reader(store: Path, **kw: object) -> StoreReader:
    return StoreReader(store, GEO, **kw)  # type: ignore[arg-type]


def test_pull_statuses_and_batches(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 40)
    with _reader(tmp_path) as r:
        g = r.get_messages("T", 0, 0, 5)
        assert (g.status, g.next_offset, g.min_offset, g.max_offset) == (GetStatus.FOUND, 5, 0, 20)
        assert [m.queue_offset for m in g.messages] == [0, 1, 2, 3, 4]
        assert [m.physical_offset for m in g.messages] == [
            results[i].wrote_offset for i in (0, 2, 4, 6, 8)
        ]
        assert isinstance(g.messages[0], DecodedRecord) and g.messages[0].body == b"body-0" * 5
        g = r.get_messages("T", 0, 15, 100)
        assert (g.status, len(g.messages), g.next_offset) == (GetStatus.FOUND, 5, 20)
        size = results[0].wrote_bytes
        g = r.get_messages("T", 1, 0, 100, max_bytes=3 * size)
        assert len(g.messages) == 3 and g.next_offset == 3
        g = r.get_messages("T", 1, 0, 100, max_bytes=1)  # at least one
        assert len(g.messages) == 1
        assert r.get_messages("T", 0, 20, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
        g = r.get_messages("T", 0, 25, 5)
        assert (g.status, g.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
        assert r.get_messages("T", 7, 0, 5).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert r.get_messages("Nope", 0, 0, 5).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert (r.min_offset("T", 1), r.max_offset("T", 1)) == (0, 20)


def test_offset_too_small_after_retention(tmp_path: Path) -> None:
    build_store(tmp_path, 40)
    cqs = ConsumeQueueStore(tmp_path, CQ_FILE).load()
    cqs.recover()
    cq = cqs.get("T", 0)
    assert cq is not None
    cq.correct_min_offset(10**9)  # as if the log's first files were gone
    cq.queue.delete_expired_by_offset(10**9, 20)
    cqs.close()
    with _reader(tmp_path) as r:
        g = r.get_messages("T", 0, 0, 5)
        assert g.status is GetStatus.OFFSET_TOO_SMALL and g.next_offset == g.min_offset == 10


def test_tag_filter(tmp_path: Path) -> None:
    build_store(tmp_path, 30, queues=1)
    assert TagFilter.of("a || b").wanted == {"a", "b"} and TagFilter.of("*").wanted is None
    assert TagFilter.of(" || ").codes is None and TagFilter.of(None) == TagFilter.of("")
    with _reader(tmp_path) as r:
        g = r.get_messages("T", 0, 0, 100, tags="tag1 || tag2")
        assert [m.queue_offset % 3 for m in g.messages] == [1, 2] * 10
        g = r.get_messages("T", 0, 0, 100, tags="nothing")
        assert (g.status, g.next_offset, g.messages) == (GetStatus.NO_MATCHED_MESSAGE, 30, [])


def test_reads_stop_at_the_limit(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 20, queues=1)
    limit = [results[10].wrote_offset + 3]
    with _reader(tmp_path, max_offset_fn=lambda: limit[0]) as r:
        assert r.max_offset("T", 0) == 10
        g = r.get_messages("T", 0, 0, 100)
        assert len(g.messages) == 10 and g.max_offset == 10
        assert r.get_messages("T", 0, 10, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
        assert r.get_by_offset(results[10].wrote_offset) is None
        limit[0] = results[12].wrote_offset
        assert len(r.get_messages("T", 0, 10, 100).messages) == 2


def test_lookups_by_offset_id_key_and_time(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    with _reader(tmp_path) as r:
        rec = r.get_by_offset(results[7].wrote_offset)
        assert rec is not None and rec.properties["UNIQ_KEY"] == "U00000007"
        assert r.get_by_offset(results[7].wrote_offset + 1) is None
        assert r.get_by_offset(10**9) is None
        got = r.get_by_msg_id(results[7].msg_id)
        assert got is not None and got.physical_offset == results[7].wrote_offset
        assert r.get_by_msg_id(results[7].msg_id.lower()) is not None
        wrong_host = "0A000003" + results[7].msg_id[8:]
        assert r.get_by_msg_id(wrong_host) is None
        with pytest.raises(ValueError):
            r.get_by_msg_id("zz")
        hits = r.query_by_key("T", "key7")
        assert [h.physical_offset for h in hits] == [results[7].wrote_offset]
        assert [h.properties["UNIQ_KEY"] for h in r.query_by_key("T", "U00000009")] == ["U00000009"]
        common = r.query_by_key("T", "common", max_count=64)
        assert [h.physical_offset for h in common] == [x.wrote_offset for x in results]
        assert len(r.query_by_key("T", "common", max_count=5)) == 5
        assert r.query_by_key("Other", "key7") == []
        # store times are T0 + 10 ms * i; queue 0 holds the even messages
        ts = results[8].store_timestamp
        assert r.offset_for_time("T", 0, ts) == 4
        assert r.offset_for_time("T", 0, ts + 2) == 4
        assert r.offset_for_time("T", 0, T0 + 20_000) == 14
        assert r.offset_for_time("T", 0, T0 - 20_000) == 0
        assert r.store_time_of(results[3].wrote_offset) == results[3].store_timestamp


def test_key_collisions_are_rechecked(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    # "Aa" and "BB" have the same Java hash: the index returns both for either key
    a = log.append(Message("T", b"a", {"KEYS": "Aa"}))
    b = log.append(Message("T", b"b", {"KEYS": "BB"}))
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE), IndexService(tmp_path, SLOTS, ENTRIES)
    Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    assert sorted(idx.query_offsets("T", "Aa", 10, 0, 1 << 62).phy_offsets) == [0, b.wrote_offset]
    for c in (log, cqs, idx):
        c.close()
    with _reader(tmp_path) as r:
        assert [m.physical_offset for m in r.query_by_key("T", "Aa")] == [a.wrote_offset]
        assert [m.physical_offset for m in r.query_by_key("T", "BB")] == [b.wrote_offset]


def test_fillers_and_pre_blanks_are_skipped(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(message(0))
    filler = log.append_encoded(filler_record(200, "T", 0), "T", 0)
    log.append(message(2))
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE), IndexService(tmp_path, SLOTS, ENTRIES)
    Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    for c in (log, cqs, idx):
        c.close()
    with _reader(tmp_path) as r:
        assert r.get_by_offset(filler.wrote_offset) is None
        g = r.get_messages("T", 0, 0, 10)
        assert [m.queue_offset for m in g.messages] == [0, 2] and g.next_offset == 3
        assert r.get_messages("T", 0, 1, 1).messages[0].queue_offset == 2


def test_reader_follows_a_live_writer(tmp_path: Path) -> None:
    log = open_log(tmp_path, StepClock())
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE), IndexService(tmp_path, SLOTS, ENTRIES)
    d = Dispatcher(log, cqs, idx)
    write_messages(log, 3, queues=1)
    d.dispatch(0, log.max_offset())
    with _reader(tmp_path, max_offset_fn=log.max_offset) as r:
        assert r.max_offset("T", 0) == 3
        write_messages(log, 60, queues=1, start=3)  # new segments, files, index keys
        d.dispatch(0, log.max_offset())
        g = r.get_messages("T", 0, 0, 100)
        assert len(g.messages) == 63 and [m.queue_offset for m in g.messages] == list(range(63))
        assert len(r.query_by_key("T", "key62")) == 1
    for c in (log, cqs, idx):
        c.close()


def test_real_stores(real_store_copy: StoreCopy) -> None:
    rust = real_store_copy("rocketmq-rust-0.9-store")
    with StoreReader.open(rust) as r:
        assert r.geometry.cq_file_size_bytes == 200 and r.geometry.segment_size_bytes == 4096
        assert [m.physical_offset for m in r.query_by_key("V1UpgradeTopic", "v1-upgrade-key")] == [
            0,
            141,
        ]
        g = r.get_messages("V1UpgradeTopic", 0, 0, 10)
        assert g.status is GetStatus.FOUND and [m.size for m in g.messages] == [141, 141]
    old = real_store_copy("broker-4.2-unit-store")
    report = recover_store(old)
    assert report.mode == "abnormal" and report.records_redispatched == 123
    with StoreReader.open(old) as r:
        got: list[DecodedRecord] = []
        nxt = 0
        while True:
            g = r.get_messages("abc", 0, nxt, 32)
            if g.status is not GetStatus.FOUND:
                break
            got.extend(g.messages)
            nxt = g.next_offset
        assert [m.queue_offset for m in got] == list(range(179))
        assert g.status is GetStatus.OFFSET_OVERFLOW_ONE
        assert all(m.crc_ok and m.topic == "abc" for m in got)
        # the broker's units hold consume-queue-ext addresses: tags are checked on records
        g = r.get_messages("abc", 0, 0, 500, tags="TAG1", max_bytes=1 << 30)
        assert len(g.messages) == 179
        assert r.get_messages("abc", 0, 0, 500, tags="TAG2").messages == []


def test_reader_opens_nothing_for_writing(tmp_path: Path) -> None:
    build_store(tmp_path, 5)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with _reader(tmp_path) as r:
        r.get_messages("T", 0, 0, 10)
        r.query_by_key("T", "key1")
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert before == after
    # a read-only commit log cannot be appended to
    log = CommitLog.open(tmp_path / "commitlog", SEGMENT, read_only=True)
    with pytest.raises((PermissionError, TypeError)):
        log.append(message(99))
    log.close()


def _maps_of(path: str) -> int:
    """How many mappings of `path` this process has (a deleted file's too)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if path in line)


def test_zero_copy_views_outlive_retention_and_the_reader(tmp_path: Path) -> None:
    """The rule in `RecordView`'s doc: views keep their mapping until released; the
    reader neither unmaps under them nor fails; a deleted segment stays readable."""
    build_store(tmp_path, 60)
    with _reader(tmp_path) as r:
        copies = r.get_messages("T", 0, 0, 8)
        got = r.get_messages("T", 0, 0, 8, zero_copy=True)
        first = r.log.queue.segments[0].path
        assert got.messages[-1].physical_offset < r.log.queue.segments[1].start_offset
        views = [m.body for m in got.messages]
        assert all(isinstance(m, RecordView) for m in got.messages)
        assert all(v.readonly for v in views) and len(views) == 8
        assert [bytes(v) for v in views] == [m.body for m in copies.messages]
        # retention, as the cleaner does it (its own mapping, then unlink)
        writer = open_log(tmp_path)
        assert writer.queue.delete_expired_by_time(
            0, delete_files_interval_ms=0, interval_forcibly_ms=0, clean_immediately=True,
            max_files=1,
        ) == 1  # fmt: skip
        writer.close()
        assert not Path(first).exists()
        r.refresh()  # the reader drops the deleted segment: its mapping has views
        assert r.get_messages("T", 0, 0, 1).status is GetStatus.OFFSET_TOO_SMALL
    assert _maps_of(first) == 1  # reader closed, file gone: still mapped for the views
    assert [bytes(v) for v in views] == [m.body for m in copies.messages]
    del got
    for v in views:
        v.release()
    gc.collect()
    assert _maps_of(first) == 0  # the last view released: unmapped


def test_pull_views_release_on_exit(tmp_path: Path) -> None:
    build_store(tmp_path, 10)
    with _reader(tmp_path) as r:
        with PullViews.of(r.get_messages("T", 1, 0, 4, zero_copy=True)) as pulled:
            body = pulled.messages[0].body
            part = body[:3]
            assert bytes(body) == b"body-1" * 5
        with pytest.raises(ValueError, match="released"):
            bytes(body)
        assert bytes(part) == b"bod"  # a slice lives on until released itself
        part.release()


def _fields(m: RecordFields) -> list[object]:
    return [
        (type(v), v.tobytes() if isinstance(v, memoryview) else v)
        for v in (getattr(m, f.name) for f in dataclasses.fields(m))
    ]


def test_pulls_walk_alike_in_c_and_in_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pulls over many commit-log segments and consume-queue files, fillers among the
    messages, tag filters, byte caps, copies and views: the C walk (what reads call)
    and the reference (`engine.pull.pull_units_py`) give the same results."""
    log = open_log(tmp_path)
    for i in range(90):
        if i % 17 == 5:
            log.append_encoded(filler_record(150 + i, "T", 0), "T", 0)
        else:
            log.append(message(i))
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE), IndexService(tmp_path, SLOTS, ENTRIES)
    Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    for c in (log, cqs, idx):
        c.close()
    cases = [
        (offset, count, tags, zero_copy, max_bytes)
        for offset in (0, 4, 9, 10, 41, 89)
        for count in (1, 3, 32)
        for tags in (None, "tag1", "tag0 || tag2", "none")
        for zero_copy in (False, True)
        for max_bytes in (DEFAULT_MAX_BYTES, 700)
    ]
    with _reader(tmp_path) as r:
        got = {}
        for impl in (pull_units, pull_units_py):
            monkeypatch.setattr(reader_module, "pull_units", impl)
            got[impl] = [
                r.get_messages("T", 0, o, n, tags=t, zero_copy=z, max_bytes=b)
                for o, n, t, z, b in cases
            ]
        found = 0
        for case, c, py in zip(cases, got[pull_units], got[pull_units_py], strict=True):
            assert (c.status, c.next_offset, c.min_offset, c.max_offset) == (
                py.status, py.next_offset, py.min_offset, py.max_offset,
            ), case  # fmt: skip
            assert [_fields(m) for m in c.messages] == [_fields(m) for m in py.messages], case
            found += len(c.messages)
        assert found > 0
        assert {g.status for g in got[pull_units]} >= {
            GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE,
        }  # fmt: skip


def test_a_reader_whose_limit_follows_dispatch_looks_again_when_the_limit_moves(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, StepClock())
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE), IndexService(tmp_path, SLOTS, ENTRIES)
    d = Dispatcher(log, cqs, idx)
    write_messages(log, 3, queues=1)
    d.dispatch(0, log.max_offset())
    limit = [log.max_offset()]
    with _reader(tmp_path, max_offset_fn=lambda: limit[0], limit_follows_dispatch=True) as r:
        assert len(r.get_messages("T", 0, 0, 100).messages) == 3
        write_messages(log, 40, queues=1, start=3)  # new segments and queue files
        d.dispatch(0, log.max_offset())
        g = r.get_messages("T", 0, 0, 100)  # the limit stayed: the last look holds
        assert (len(g.messages), g.max_offset) == (3, 3)
        limit[0] = log.max_offset()
        g = r.get_messages("T", 0, 0, 100)
        assert [m.queue_offset for m in g.messages] == list(range(43)) and g.max_offset == 43
    for c in (log, cqs, idx):
        c.close()


def test_a_unit_not_written_yet_ends_the_pull_there(tmp_path: Path) -> None:
    """A reader in another process can see a run of units the dispatcher writes with
    one slice write in part: its first bytes still zero (glibc's memcpy stores the first
    vector last), the units after it written. The read-only refresh's search settles the
    queue's end past them (here its probes, units 5, 8 and 7, miss unit 6). The pull
    ends at such a unit, and takes it once it is written: it passed it as no unit (its
    message lost), and one with its offset still zero gave the record at 0 again."""
    build_store(tmp_path, 8, queues=1)
    path = tmp_path / "consumequeue" / "T" / "0" / ("0" * 20)
    with open(path, "r+b") as f:
        f.seek(6 * 20)
        unit6 = f.read(20)

        def put6(b: bytes) -> None:
            f.seek(6 * 20)
            f.write(b)
            f.flush()

        put6(bytes(20))  # nothing of it stored yet
        with _reader(tmp_path) as r:
            g = r.get_messages("T", 0, 0, 100)
            assert g.max_offset == 8  # the refresh settled past unit 6
            assert [m.queue_offset for m in g.messages] == list(range(6))
            assert (g.status, g.next_offset) == (GetStatus.FOUND, 6)
            g = r.get_messages("T", 0, 6, 100)
            assert (g.status, g.next_offset, g.messages) == (GetStatus.NO_MATCHED_MESSAGE, 6, [])
            put6(bytes(8) + unit6[8:])  # its size and tag code stored, its offset not
            g = r.get_messages("T", 0, 6, 100)
            assert (g.status, g.next_offset, g.messages) == (GetStatus.NO_MATCHED_MESSAGE, 6, [])
            assert [m.queue_offset for m in r.get_messages("T", 0, 0, 100).messages] == [
                0, 1, 2, 3, 4, 5,
            ]  # fmt: skip
            put6(unit6)  # the write is done
            g = r.get_messages("T", 0, 6, 100)
            assert [m.queue_offset for m in g.messages] == [6, 7] and g.next_offset == 8
