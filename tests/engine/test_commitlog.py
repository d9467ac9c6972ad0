"""CommitLog: golden bytes, statuses, queue offsets, batches, rolling, reads, the
validating scan, the fast path against the reference encoder, real RocketMQ stores,
and I/O faults."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.engine import fileio
from mqstore.engine.commitlog import AppendStatus, CommitLog, LookupStatus
from mqstore.engine.findings import Severity, errors
from mqstore.engine.logwalk import ScanStop
from mqstore.engine.record import (
    BLANK_MAGIC_CODE,
    Message,
    SysFlag,
    decode,
    encode,
    patch_append_fields,
)
from mqstore.engine.recordcodes import make_msg_id
from mqstore.engine.segment import Segment, segment_file_name
from mqstore.engine.segment_queue import SegmentAllocationError, SegmentQueue
from tests.engine import commitlog_golden as golden

StoreCopy = Callable[[str], Path]


class Clock:
    def __init__(self, ms: int = 1_700_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def _msg(body: bytes = b"x" * 100, **kw: object) -> Message:
    return Message(topic=str(kw.pop("topic", "T")), body=body, **kw)  # type: ignore[arg-type]


# --- golden ---------------------------------------------------------------------------


def test_golden_small_commit_log_is_byte_exact(tmp_path: Path) -> None:
    log, results = golden.build(tmp_path)
    log.close()
    assert golden.segment_bytes(tmp_path) == golden.GOLDEN.read_bytes()
    assert [r.status for r in results] == [AppendStatus.PUT_OK] * 4
    assert [r.wrote_offset for r in results] == [0, 270, 552, 1024]
    assert [r.queue_offset for r in results] == [
        0,
        0,
        0,
        0,
    ]  # two queues, a PREPARED, another topic


def test_golden_bytes_read_as_rocketmq_records() -> None:
    raw = golden.GOLDEN.read_bytes()
    recs = [decode(raw, 0), decode(raw, 270), decode(raw, 552)]
    assert [(r.topic, r.queue_id, r.queue_offset, r.physical_offset) for r in recs] == [
        ("GoldenTopic", 0, 0, 0),
        ("GoldenTopic", 1, 0, 270),
        ("GoldenTopic", 0, 0, 552),
    ]
    assert recs[2].sys_flag == SysFlag.TRANSACTION_PREPARED
    assert [r.store_timestamp for r in recs] == [1_700_000_000_100 + i for i in range(3)]
    assert recs[0].properties == {"TAGS": "TagA", "KEYS": "k0"}
    assert recs[1].flag == 7 and recs[0].store_host == "192.168.0.1:10911"
    # BLANK: TOTALSIZE = 200 bytes left, BLANK magic, zeros after the header (fresh file)
    assert int.from_bytes(raw[824:828], "big") == 200
    assert int.from_bytes(raw[828:832], "big") == BLANK_MAGIC_CODE
    assert raw[832:1024] == bytes(192)
    last = decode(raw, 1024)
    assert (last.topic, last.physical_offset, last.reconsume_times) == ("OtherTopic", 1024, 2)
    assert raw[1024 + last.size :] == bytes(1024 - last.size)


# --- statuses -----------------------------------------------------------------------


def test_bad_messages_return_statuses_and_write_nothing(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 4096, max_message_size=1000)
    cases = [
        (_msg(topic=""), AppendStatus.MESSAGE_ILLEGAL),
        (_msg(topic="t" * 128), AppendStatus.MESSAGE_ILLEGAL),
        (_msg(properties={"k": "v" * 40000}), AppendStatus.PROPERTIES_SIZE_EXCEEDED),
        (_msg(properties={"k": ""}), AppendStatus.MESSAGE_ILLEGAL),
        (_msg(body=b"b" * 1001), AppendStatus.MESSAGE_ILLEGAL),
        (_msg(queue_id=-1), AppendStatus.MESSAGE_ILLEGAL),
        (_msg(born_host="nonsense"), AppendStatus.MESSAGE_ILLEGAL),
        (_msg(flag=2**40), AppendStatus.MESSAGE_ILLEGAL),
    ]
    log.append(_msg())  # warm the fast path's caches: bad messages must still be caught
    before = log.queue.max_wrote_offset()
    for msg, status in cases:
        res = log.append(msg)
        assert res.status is status, msg
        assert res.reason and res.msg_id == "" and not res.ok
    assert log.queue.max_wrote_offset() == before
    assert log.check() == []
    log.close()


def test_record_larger_than_a_segment(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 1024)
    res = log.append(_msg(body=b"z" * 930))  # 91 + 1 + 930 + ... + 8 > 1024
    assert res.status is AppendStatus.MESSAGE_SIZE_EXCEEDED
    assert log.append(_msg(body=b"z" * 900)).ok
    log.close()


def test_queue_offsets_per_queue_and_transactions(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 1 << 16)
    seq = [
        (_msg(queue_id=0), 0),
        (_msg(queue_id=1), 0),
        (_msg(queue_id=0), 1),
        (_msg(queue_id=0, sys_flag=SysFlag.TRANSACTION_PREPARED), 0),
        (_msg(queue_id=0, sys_flag=SysFlag.TRANSACTION_ROLLBACK), 0),
        (_msg(queue_id=0, sys_flag=SysFlag.TRANSACTION_COMMIT), 2),
        (_msg(topic="U", queue_id=0), 0),
        (_msg(queue_id=0), 3),
    ]
    for msg, qo in seq:
        res = log.append(msg)
        assert res.ok and res.queue_offset == qo
        assert log.read(res.wrote_offset).record.queue_offset == qo  # type: ignore[union-attr]
    assert log.queue_offsets == {("T", 0): 4, ("T", 1): 1, ("U", 0): 1}
    log.set_queue_offset("T", 1, 0)
    log.rebuild_queue_offsets()
    assert log.queue_offsets == {("T", 0): 4, ("T", 1): 1, ("U", 0): 1}
    log.close()


def test_store_timestamp_and_msg_id(tmp_path: Path) -> None:
    clock = Clock(1_234_567)
    log = CommitLog.open(tmp_path, 4096, clock_ms=clock)
    for _ in range(2):
        clock.ms += 10
        res = log.append(_msg(store_host="10.1.2.3:10911"))
        assert res.store_timestamp == clock.ms
        assert res.msg_id == make_msg_id(bytes([10, 1, 2, 3]), 10911, res.wrote_offset)
        rec = log.read(res.wrote_offset).record
        assert rec is not None and rec.msg_id == res.msg_id
        assert rec.store_timestamp == clock.ms
    log.close()


def test_ipv6_hosts_take_the_reference_path(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 4096)
    for _ in range(2):
        res = log.append(_msg(born_host="[::1]:5", store_host="[fe80::1]:10911"))
        assert res.ok and len(res.msg_id) == 56
        rec = log.read(res.wrote_offset).record
        assert rec is not None and rec.store_host == "[fe80::1]:10911"
    assert log.check() == []
    log.close()


# --- rolling and batches ----------------------------------------------------------------


def test_end_of_file_rolls_with_a_blank_and_retries(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 1024)
    offsets = [log.append(_msg(body=b"r" * 300)).wrote_offset for _ in range(5)]
    # 392-byte records: two fit (784 + 8 <= 1024), the third rolls
    assert offsets == [0, 392, 1024, 1416, 2048]
    sc = log.scan()
    assert [r.offset for r in sc] == offsets
    assert sc.stop is ScanStop.END_OF_DATA and sc.end_offset == 2048 + 392
    assert log.queue_offsets == {("T", 0): 5}
    assert log.check() == []
    log.close()


def test_batch_is_atomic_and_never_spans_segments(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 1024)
    log.append(_msg(body=b"a" * 400))  # 492 bytes
    res = log.append_batch([_msg(body=b"b" * 200, queue_id=q) for q in (0, 1, 0)])
    # 3 x 292 = 876 does not fit after 492: BLANK, then the whole batch in segment 2
    assert [r.wrote_offset for r in res] == [1024, 1316, 1608]
    assert [r.queue_offset for r in res] == [1, 0, 2]
    assert len({r.store_timestamp for r in res}) == 1
    bad = log.append_batch([_msg(), _msg(topic=""), _msg()])
    assert {r.status for r in bad} == {AppendStatus.MESSAGE_ILLEGAL}
    assert all("message 1 of the batch" in r.reason for r in bad)
    too_big = log.append_batch([_msg(body=b"c" * 400) for _ in range(3)])
    assert {r.status for r in too_big} == {AppendStatus.MESSAGE_SIZE_EXCEEDED}
    assert log.append_batch([]) == []
    assert log.queue.max_wrote_offset() == 1900
    assert log.check() == []
    log.close()


def test_allocation_failure_is_a_status(tmp_path: Path) -> None:
    refuse = {"on": False}

    def alloc(start: int) -> Segment:
        if refuse["on"]:
            raise SegmentAllocationError("no pool buffer left")
        return Segment.create(tmp_path, start, 1024)

    queue = SegmentQueue(tmp_path, 1024, allocator=alloc)
    log = CommitLog(queue)
    assert log.append(_msg(body=b"a" * 500)).ok
    refuse["on"] = True
    res = log.append(_msg(body=b"a" * 500))
    assert res.status is AppendStatus.CREATE_MAPPED_FILE_FAILED and "pool" in res.reason
    refuse["on"] = False
    res = log.append(_msg(body=b"a" * 500))
    assert res.ok and res.wrote_offset == 1024 and res.queue_offset == 1
    assert log.check() == []
    log.close()


def test_write_buffer_path_reads_only_committed(tmp_path: Path) -> None:
    returned: list[object] = []

    def alloc(start: int) -> Segment:
        return Segment.create(
            tmp_path, start, 1024, write_buffer=bytearray(1024), on_buffer_done=returned.append
        )

    log = CommitLog(SegmentQueue(tmp_path, 1024, allocator=alloc))
    res = log.append(_msg())
    assert log.read(res.wrote_offset).status is LookupStatus.OFFSET_OVERFLOW
    assert log.commit(0) == res.wrote_bytes
    assert log.read(res.wrote_offset).status is LookupStatus.FOUND
    for _ in range(6):
        log.append(_msg(body=b"y" * 300))
    assert log.queue.commit_all() > 0 and len(returned) == 2  # two segments filled
    assert log.flush(0) > 0
    assert log.check(deep=True) == []
    log.close()


# --- reads and the validating scan -------------------------------------------------------


def test_read_statuses(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 1024)
    assert log.read(0).status is LookupStatus.OFFSET_OVERFLOW
    a = log.append(_msg())
    assert log.read(a.wrote_offset).status is LookupStatus.FOUND
    assert log.read(a.wrote_offset + 1).status is LookupStatus.NOT_A_RECORD
    assert log.read(a.wrote_offset + a.wrote_bytes).status is LookupStatus.OFFSET_OVERFLOW
    assert log.read_bytes(0, 4) == a.wrote_bytes.to_bytes(4, "big")
    for _ in range(10):
        log.append(_msg(body=b"q" * 300))
    assert log.queue.delete_expired_by_time(
        0, delete_files_interval_ms=0, interval_forcibly_ms=0, clean_immediately=True
    )
    assert log.read(0).status is LookupStatus.OFFSET_TOO_SMALL
    recs = list(log.iter_records())
    assert recs[0].physical_offset == log.min_offset()
    log.close()


def _corrupt_byte(log_dir: Path, log_offset: int, seg_size: int) -> None:
    name = segment_file_name(log_offset - log_offset % seg_size)
    with open(log_dir / name, "r+b") as f:
        f.seek(log_offset % seg_size)
        b = f.read(1)
        f.seek(log_offset % seg_size)
        f.write(bytes([b[0] ^ 0xFF]))


def test_scan_finds_a_crc_fault_and_recovery_cuts_there(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 4096)
    offs = [log.append(_msg(body=bytes([i]) * 200)).wrote_offset for i in range(8)]
    log.flush(0)
    log.close()
    _corrupt_byte(tmp_path, offs[5] + 100, 4096)  # inside the sixth body
    log = CommitLog.open(tmp_path, 4096)
    sc = log.scan(0)
    assert [r.offset for r in sc] == offs[:5]
    assert (sc.stop, sc.end_offset, sc.reason) == (ScanStop.CORRUPT, offs[5], "body CRC mismatch")
    no_crc = log.scan(0, check_crc=False)
    assert sum(1 for _ in no_crc) == 8 and no_crc.stop is ScanStop.END_OF_DATA
    assert any("corrupt" in f.what for f in errors(log.check()))
    rec = log.recover_tail(0)
    assert (rec.end_offset, rec.records, rec.stop) == (offs[5], 5, ScanStop.CORRUPT)
    assert log.queue_offsets == {("T", 0): 5}
    assert log.check() == []
    res = log.append(_msg())
    assert res.wrote_offset == offs[5] and res.queue_offset == 5
    log.close()


def test_scan_garbage_and_zeros_and_limits(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 4096)
    offs = [log.append(_msg()).wrote_offset for _ in range(3)]
    end = log.max_offset()
    sc = log.scan(0, to_offset=offs[2])
    assert sum(1 for _ in sc) == 2 and sc.stop is ScanStop.LIMIT and sc.end_offset == offs[2]
    sc = log.scan(10**9)
    assert list(sc) == [] and sc.stop is ScanStop.OFFSET_NOT_FOUND
    sc = log.scan(end)
    assert list(sc) == [] and sc.stop is ScanStop.END_OF_DATA
    log.close()
    _corrupt_byte(tmp_path, offs[1] + 5, 4096)  # the magic
    log = CommitLog.open(tmp_path, 4096)
    sc = log.scan(0)
    assert sum(1 for _ in sc) == 1 and sc.stop is ScanStop.CORRUPT
    assert "magic" in sc.reason
    log.close()


def test_iterating_can_be_abandoned_without_leaking_a_reference(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 4096)
    for _ in range(3):
        log.append(_msg())
    it = log.iter_records()
    next(it)
    seg = log.queue.first()
    assert seg is not None and seg.ref_count == 2
    it.close()  # type: ignore[attr-defined]
    assert seg.ref_count == 1
    log.close()


# --- fast path == reference encoder ------------------------------------------------------

_texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=0, max_size=12)
_messages = st.builds(
    Message,
    topic=st.one_of(st.sampled_from(["T", "Topic-A"]), _texts),
    body=st.binary(max_size=300),
    properties=st.one_of(
        st.just({}),
        st.dictionaries(st.sampled_from(["TAGS", "KEYS", "a"]), _texts, max_size=3),
    ),
    queue_id=st.integers(-2, 3),
    flag=st.one_of(st.integers(-5, 5), st.just(2**31)),
    sys_flag=st.sampled_from([0, 1, 2, 4, 8, 0xC, 0x30, 0x40]),
    born_timestamp=st.integers(0, 2**41),
    born_host=st.sampled_from(["127.0.0.1:0", "10.0.0.2:7", "[::1]:3", "bad"]),
    store_host=st.sampled_from(["127.0.0.1:10911", "10.9.8.7:1"]),
    reconsume_times=st.integers(0, 3),
    prepared_transaction_offset=st.integers(0, 2**40),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(msgs=st.lists(_messages, min_size=1, max_size=6))
def test_fast_path_writes_what_the_reference_encoder_writes(
    tmp_path_factory: pytest.TempPathFactory, msgs: list[Message]
) -> None:
    d = tmp_path_factory.mktemp("fast")
    clock = Clock()
    log = CommitLog.open(d, 1 << 16, clock_ms=clock)
    expected_offsets: dict[tuple[str, int], int] = {}
    for msg in msgs * 2:  # the second round hits the caches the first one filled
        clock.ms += 1
        ref = encode(msg)
        res = log.append(msg)
        if ref.status.value != "OK":
            assert res.status.value == ref.status.value and res.reason == ref.reason
            continue
        assert res.ok
        takes = msg.sys_flag & 0xC in (0, 8)
        key = (msg.topic, msg.queue_id)
        qo = expected_offsets.get(key, 0) if takes else 0
        if takes:
            expected_offsets[key] = qo + 1
        want = bytearray(len(ref.data))
        patch_append_fields(want, 0, ref, qo, res.wrote_offset, clock.ms)
        assert log.read_bytes(res.wrote_offset, res.wrote_bytes) == bytes(want)
        batch = log.append_batch([msg])
        if takes:
            expected_offsets[key] += 1
        assert batch[0].ok
        got = log.read_bytes(batch[0].wrote_offset, batch[0].wrote_bytes)
        want2 = bytearray(len(ref.data))
        patch_append_fields(want2, 0, ref, batch[0].queue_offset, batch[0].wrote_offset, clock.ms)
        assert got == bytes(want2)
    # A whole batch (packed in one go when every member hits the caches) writes what the
    # reference encoder writes, member by member, with consecutive queue offsets.
    valid = [m for m in msgs if encode(m).status.value == "OK"]
    if valid and sum(len(encode(m).data) for m in valid) + 8 <= 1 << 16:
        clock.ms += 1
        results = log.append_batch(valid)
        assert all(r.ok for r in results)
        for m, r in zip(valid, results, strict=True):
            ref = encode(m)
            takes = m.sys_flag & 0xC in (0, 8)
            key = (m.topic, m.queue_id)
            qo = expected_offsets.get(key, 0) if takes else 0
            if takes:
                expected_offsets[key] = qo + 1
            assert r.queue_offset == qo
            want3 = bytearray(len(ref.data))
            patch_append_fields(want3, 0, ref, qo, r.wrote_offset, clock.ms)
            assert log.read_bytes(r.wrote_offset, r.wrote_bytes) == bytes(want3)
    assert log.check() == []
    log.close()
    shutil.rmtree(d)


# --- real RocketMQ stores -----------------------------------------------------------------


def test_real_49_commitlog(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("broker-4.9-commitlog") / "commitlog"
    log = CommitLog.open(d, 8192, read_only=True)
    sc = log.scan(0)
    recs = list(sc)
    assert len(recs) == 47 and {r.header.size for r in recs} == {172}
    assert (sc.stop, sc.end_offset) == (ScanStop.BLANK_IN_LAST_SEGMENT, 47 * 172)
    assert [r.header.queue_offset for r in recs] == list(range(47))
    assert log.check() == []
    log.close()


def test_real_42_unit_store(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("broker-4.2-unit-store") / "commitlog"
    log = CommitLog.open(d, 8192, read_only=True)
    assert len(log.queue) == 4  # the empty fifth file is skipped, not deleted
    assert (d / segment_file_name(4 * 8192)).exists()
    recs = list(log.iter_records())
    assert len(recs) == 179 and all(r.crc_ok for r in recs)
    assert [r.queue_offset for r in recs] == list(range(179))
    assert {(r.topic, r.queue_id) for r in recs} == {("abc", 0)}
    found = log.check()
    assert not errors(found)
    assert any(f.severity is Severity.WARNING and "empty last segment" in f.what for f in found)
    log.rebuild_queue_offsets()
    assert log.queue_offsets == {("abc", 0): 179}
    log.close()


def test_real_rust_store(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("rocketmq-rust-0.9-store") / "commitlog"
    log = CommitLog.open(d, 4096, read_only=True)
    assert [r.size for r in log.iter_records()] == [141, 141]
    assert not errors(log.check())
    log.close()


# --- I/O faults -----------------------------------------------------------------------------


def test_roll_fault_raises_and_the_log_stays_valid(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 1024)
    log.append(_msg(body=b"a" * 500))
    fileio.set_fault("fallocate", lambda: OSError(errno.ENOSPC, "injected"))
    with pytest.raises(fileio.StoreIOError) as ei:
        log.append(_msg(body=b"a" * 500))
    assert ei.value.errno == errno.ENOSPC
    fileio.clear_faults()
    assert log.check() == []
    res = log.append(_msg(body=b"a" * 500))
    assert res.ok and res.wrote_offset == 1024 and res.queue_offset == 1
    log.close()


def test_flush_fault_raises_and_keeps_flushed_where(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, 4096)
    log.append(_msg())
    fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected"))
    with pytest.raises(fileio.StoreIOError):
        log.flush(0)
    assert log.queue.flushed_where == 0
    fileio.clear_faults()
    assert log.flush(0) > 0
    log.close()
