"""Recovery: the real RocketMQ stores, clean and crashed mqstore stores built on disk
phase by phase (torn tail, flipped body byte, seeded garbage, lagging or leading
consume queues, a roll cut short), the checkpoint's choice of start file, idempotence,
dry runs, the report, and I/O faults."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.engine.checkpoint import StoreCheckpoint
from mqstore.engine.commitlog import AppendResult, CommitLog
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.findings import errors
from mqstore.engine.indexservice import IndexService
from mqstore.engine.reader import Geometry, GetStatus, StoreReader
from mqstore.engine.record import Message, decode, encode_properties
from mqstore.engine.recovery import (
    RecoveryReport,
    apply,
    load_store,
    plan_recovery,
    read_report,
    recover_store,
    validate,
    write_report,
)
from mqstore.engine.recovery_progress import (
    REDISPATCHING,
    VALIDATING,
    RecoveryInterrupted,
    Step,
)
from mqstore.engine.segment import now_ms
from tests.engine.storebuild import (
    CQ_FILE,
    ENTRIES,
    SEGMENT,
    SLOTS,
    build_store,
    message,
    open_log,
    write_messages,
)

StoreCopy = Callable[[str], Path]
GEO = Geometry(SEGMENT, CQ_FILE, SLOTS, ENTRIES)
ALL = (0, (1 << 63) - 1)


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def _recover(store: Path, **kw: object) -> RecoveryReport:
    return recover_store(store, StoreSettings(), geometry=GEO, **kw)  # type: ignore[arg-type]


def _snapshot(store: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(store)): p.read_bytes()
        for p in sorted(store.rglob("*"))
        if p.is_file() and p.name != "recovery.json"
    }


def _crash(store: Path) -> None:
    (store / "abort").write_bytes(b"")


def _write_at(store: Path, offset: int, data: bytes) -> None:
    seg = offset - offset % SEGMENT
    with open(store / "commitlog" / f"{seg:020d}", "r+b") as f:
        f.seek(offset - seg)
        f.write(data)


def _zero_from(store: Path, offset: int) -> None:
    seg = offset - offset % SEGMENT
    _write_at(store, offset, bytes(SEGMENT - offset % SEGMENT))
    for name in os.listdir(store / "commitlog"):
        if int(name) > seg:
            (store / "commitlog" / name).write_bytes(bytes(SEGMENT))


def _pull_all(store: Path, topic: str = "T", queues: int = 2) -> list[int]:
    """Physical offsets of every message pullable, queue by queue."""
    out = []
    with StoreReader(store, GEO) as r:
        for q in range(queues):
            g = r.get_messages(topic, q, 0, 1000, max_bytes=1 << 30)
            out.extend(m.physical_offset for m in g.messages)
    return sorted(out)


def _assert_consistent(store: Path) -> None:
    log = CommitLog.open(store / "commitlog", SEGMENT, read_only=True)
    assert not errors(log.check())
    log.close()
    cqs = ConsumeQueueStore(store, CQ_FILE, read_only=True).load()
    assert not errors(cqs.check())
    cqs.close()


# --- the real RocketMQ stores -------------------------------------------------------------


def test_real_42_store_abnormal_recovery_is_idempotent(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("broker-4.2-unit-store")
    cq_dir = d / "consumequeue" / "abc" / "0"
    broker_units = b"".join((cq_dir / n).read_bytes() for n in sorted(os.listdir(cq_dir)))
    rep = recover_store(d)
    assert (rep.mode, rep.start_file, rep.end_offset) == ("abnormal", f"{0:020d}", 31112)
    assert (rep.records_validated, rep.records_redispatched) == (179, 123)
    assert rep.bytes_truncated == 0 and rep.queues_truncated == {}
    assert rep.queue_offsets == {"abc/0": 179}
    assert not (d / "commitlog" / f"{4 * 8192:020d}").exists()  # the empty pre-allocation
    mine = b"".join((cq_dir / n).read_bytes() for n in sorted(os.listdir(cq_dir)))
    assert mine[: 56 * 20] == broker_units[: 56 * 20]  # the broker's units are kept
    before = _snapshot(d)
    again = recover_store(d)
    assert (again.records_redispatched, again.index_keys_redispatched) == (0, 0)
    assert _snapshot(d) == before
    assert RecoveryReport.from_json(again.to_json()) == again


def test_real_49_and_rust_stores(real_store_copy: StoreCopy) -> None:
    d = real_store_copy("broker-4.9-commitlog")
    rep = recover_store(d)
    assert (rep.mode, rep.end_offset, rep.records_validated) == ("normal", 47 * 172, 47)
    assert rep.bytes_truncated == 8  # the BLANK of the last segment, as RocketMQ cuts it
    assert rep.records_redispatched == 47 and rep.queue_offsets == {"abc/0": 47}
    rust = real_store_copy("rocketmq-rust-0.9-store")
    cq_file = rust / "consumequeue" / "V1UpgradeTopic" / "0" / f"{0:020d}"
    broker = cq_file.read_bytes()
    rep = recover_store(rust)
    assert (rep.mode, rep.end_offset, rep.records_redispatched) == ("normal", 282, 0)
    assert cq_file.read_bytes() == broker
    with StoreReader.open(rust) as r:
        hits = r.query_by_key("V1UpgradeTopic", "v1-upgrade-key")
        assert [h.physical_offset for h in hits] == [0, 141]


# --- mqstore stores, crash phases built on disk -------------------------------------------


def test_clean_store_normal_recovery_changes_nothing(tmp_path: Path) -> None:
    _results, end = build_store(tmp_path, 40)
    before = _snapshot(tmp_path)
    rep = _recover(tmp_path)
    assert (rep.mode, rep.end_offset, rep.records_redispatched) == ("normal", end, 0)
    assert rep.queue_offsets == {"T/0": 20, "T/1": 20}
    assert rep.queue_offset_table() == {("T", 0): 20, ("T", 1): 20}
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "checkpoint"} == {
        k: v for k, v in before.items() if k != "checkpoint"
    }


def test_torn_tail_is_cut_at_the_record_and_queues_follow(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    cut = results[25].wrote_offset
    _zero_from(tmp_path, cut + results[25].wrote_bytes // 2)  # half of record 25 written
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert (rep.end_offset, rep.stop) == (cut, "CORRUPT")
    assert 0 < rep.bytes_truncated <= results[25].wrote_bytes // 2  # up to its last non-zero
    assert sum(rep.queues_truncated.values()) == 5
    assert rep.index_entries_truncated == 5 * 3
    assert rep.queue_offsets == {"T/0": 13, "T/1": 12}
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results[:25]]
    with StoreReader(tmp_path, GEO) as r:
        assert r.query_by_key("T", "key27") == []
        assert len(r.query_by_key("T", "key24")) == 1
    _assert_consistent(tmp_path)
    # the appender continues from the rebuilt table, the dispatcher from the end
    q = open_log(tmp_path).queue
    q.truncate_dirty(rep.end_offset)  # a fresh load starts full; the runtime sets positions
    log = CommitLog(q, queue_offsets=rep.queue_offset_table())
    res = log.append(message(99, queue_id=1))
    assert (res.wrote_offset, res.queue_offset) == (cut, 12)
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE).load(), IndexService(tmp_path, SLOTS, ENTRIES)
    cqs.recover()
    idx.load()
    assert Dispatcher(log, cqs, idx).dispatch(cut, log.max_offset()).units_written == 1
    for c in (log, cqs, idx):
        c.close()
    assert len(_pull_all(tmp_path)) == 26


def test_tail_torn_inside_the_properties_is_cut(tmp_path: Path) -> None:
    """A write torn at a page boundary leaves the record's header and body (CRC good) but
    zeros where its properties end: the body CRC cannot see it, the zero end can. The
    crash suite found such a record kept with the wrong tags."""
    results, _end = build_store(tmp_path, 30)
    cut = results[25].wrote_offset
    _zero_from(tmp_path, cut + results[25].wrote_bytes - 3)  # the last 3 bytes never came
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert (rep.end_offset, rep.stop) == (cut, "CORRUPT")
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results[:25]]
    _assert_consistent(tmp_path)


def test_flipped_body_byte_fails_the_crc(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    body_at = results[12].wrote_offset + 88 + 3
    rec_bytes = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
    assert (
        decode(rec_bytes, results[12].wrote_offset - 0).physical_offset == results[12].wrote_offset
    )
    _write_at(tmp_path, body_at, bytes([0xFF]))
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert (rep.end_offset, rep.stop, rep.stop_reason) == (
        results[12].wrote_offset,
        "CORRUPT",
        "body CRC mismatch",
    )
    assert rep.records_validated == 12
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results[:12]]
    _assert_consistent(tmp_path)


@pytest.mark.parametrize("seed", range(6))
def test_seeded_garbage_in_a_body_cuts_exactly_there(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    results, _end = build_store(tmp_path, 40)
    k = rng.randrange(5, 40)
    body_len = len(message(k).body)
    at = results[k].wrote_offset + 88 + rng.randrange(body_len)
    log_bytes = b"".join(
        (tmp_path / "commitlog" / n).read_bytes()
        for n in sorted(os.listdir(tmp_path / "commitlog"))
    )
    old = log_bytes[at]
    _write_at(tmp_path, at, bytes([(old + rng.randrange(1, 256)) % 256]))
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert rep.end_offset == results[k].wrote_offset, f"seed {seed}: record {k}, byte {at}"
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results[:k]], f"seed {seed}"


def _dispatched_up_to(store: Path, n: int, k: int) -> list[AppendResult]:
    """`n` messages written and flushed, the first `k` dispatched: the dispatcher died."""
    log = open_log(store)
    results = write_messages(log, n)
    cqs, idx = ConsumeQueueStore(store, CQ_FILE), IndexService(store, SLOTS, ENTRIES)
    Dispatcher(log, cqs, idx).dispatch(0, results[k].wrote_offset)
    log.queue.flush_all()
    for c in (log, cqs, idx):
        c.close()
    return results


def test_queues_lagging_behind_the_log_are_caught_up(tmp_path: Path) -> None:
    results = _dispatched_up_to(tmp_path, 30, 10)
    rep = _recover(tmp_path)  # no abort: normal recovery still catches the queues up
    assert rep.mode == "normal" and rep.records_redispatched == 20
    assert rep.dispatch_from == results[9].wrote_offset + results[9].wrote_bytes
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results]
    _crash(tmp_path)
    assert _recover(tmp_path).records_redispatched == 0


def test_queues_ahead_of_the_log_are_truncated(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    # the log lost its last 6 records (never flushed), the consume queues did not
    _zero_from(tmp_path, results[24].wrote_offset)
    rep = _recover(tmp_path)  # even without abort: RocketMQ truncates past the log's end
    assert sum(rep.queues_truncated.values()) == 6
    assert rep.queue_offsets == {"T/0": 12, "T/1": 12}
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results[:24]]


def test_roll_cut_short_leaves_an_empty_next_segment(tmp_path: Path) -> None:
    _results, end = build_store(tmp_path, 30)
    last = end - end % SEGMENT
    nxt = tmp_path / "commitlog" / f"{last + SEGMENT:020d}"
    nxt.write_bytes(bytes(SEGMENT))  # pre-allocated, nothing written yet
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert rep.end_offset == end and rep.records_redispatched == 0
    assert not nxt.exists()  # past the end: the next append goes on in the current segment
    _assert_consistent(tmp_path)
    assert len(_pull_all(tmp_path)) == 30


def test_checkpoint_picks_the_start_file(tmp_path: Path) -> None:
    results, end = build_store(tmp_path, 60)
    by_seg: dict[int, AppendResult] = {}
    for r in results:
        by_seg.setdefault(r.wrote_offset - r.wrote_offset % SEGMENT, r)
    segs = sorted(by_seg)
    assert len(segs) >= 3
    with StoreCheckpoint.open_in(tmp_path) as cp:
        # everything up to the third segment's first record is known to be flushed
        t = by_seg[segs[2]].store_timestamp + 3000
        cp.physic_msg_timestamp = cp.logics_msg_timestamp = t
        cp.flush()
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert (rep.start_file, rep.start_offset) == (f"{segs[2]:020d}", segs[2])
    assert rep.end_offset == end and rep.records_redispatched == 0
    assert rep.dispatch_from == segs[2]


def test_dry_run_writes_nothing_and_predicts(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    _zero_from(tmp_path, results[20].wrote_offset + 10)
    _crash(tmp_path)
    before = _snapshot(tmp_path)
    dry = _recover(tmp_path, dry_run=True)
    assert _snapshot(tmp_path) == before
    real = _recover(tmp_path)
    for field in ("end_offset", "bytes_truncated", "queues_truncated", "stop", "start_file"):
        assert getattr(dry, field) == getattr(real, field), field


def test_report_is_kept_as_json(tmp_path: Path) -> None:
    build_store(tmp_path, 5)
    rep = _recover(tmp_path, clear_abort=True)
    write_report(tmp_path, rep)
    assert read_report(tmp_path) == rep
    assert "normal recovery" in rep.summary()
    assert read_report(tmp_path / "nope") is None


def test_clear_abort_and_progress(tmp_path: Path) -> None:
    build_store(tmp_path, 60)
    _crash(tmp_path)
    seen: list[Step] = []
    rep = _recover(tmp_path, clear_abort=True, progress=seen.append)
    assert rep.mode == "abnormal" and not (tmp_path / "abort").exists()
    validated = [s for s in seen if s.phase == VALIDATING]
    assert validated and validated[-1].done_bytes == rep.bytes_validated
    assert validated[-1].records == rep.records_validated
    assert [s.done_bytes for s in validated] == sorted(s.done_bytes for s in validated)


def test_empty_store(tmp_path: Path) -> None:
    rep = _recover(tmp_path)
    assert (rep.mode, rep.end_offset, rep.queue_offsets) == ("empty", 0, {})


def test_fsync_failure_surfaces(tmp_path: Path) -> None:
    build_store(tmp_path, 10)
    _crash(tmp_path)
    fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected"))
    with pytest.raises(fileio.StoreIOError) as ei:
        _recover(tmp_path)
    assert ei.value.errno == errno.EIO
    fileio.clear_faults()
    rep = _recover(tmp_path)
    assert rep.end_offset > 0
    with StoreReader(tmp_path, GEO) as r:
        assert r.get_messages("T", 0, 0, 100).status is GetStatus.FOUND


@pytest.mark.parametrize("seed", range(12))
def test_garbage_anywhere_cuts_where_the_reference_scan_stops(tmp_path: Path, seed: int) -> None:
    """Recovery's inline record check must stop exactly where the commit log's reference
    scan (`check_record` per record, CRC on) stops, whatever bytes were hit."""
    rng = random.Random(seed)
    results, end = build_store(tmp_path, 40)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(results[3].wrote_offset, end)
        _write_at(tmp_path, at, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9))))
    ref = CommitLog.open(tmp_path / "commitlog", SEGMENT, read_only=True)
    sc = ref.scan(0, check_crc=True)
    n = sum(1 for _ in sc)
    expected = (sc.end_offset, sc.stop.value, sc.reason, n)
    ref.close()
    _crash(tmp_path)
    rep = _recover(tmp_path)
    got = (rep.end_offset, rep.stop, rep.stop_reason, rep.records_validated)
    assert got == expected, f"seed {seed}"
    # (bytes that hit fields no check covers, e.g. a queue offset, pass, as in RocketMQ)
    cqs = ConsumeQueueStore(tmp_path, CQ_FILE, read_only=True).load()
    assert not errors(cqs.check()), f"seed {seed}"
    cqs.close()


def test_abnormal_recovery_catches_up_queues_behind_the_checkpoint(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    results = write_messages(log, 60)
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE), IndexService(tmp_path, SLOTS, ENTRIES)
    Dispatcher(log, cqs, idx).dispatch(0, results[5].wrote_offset)
    log.queue.flush_all()
    for c in (log, cqs, idx):
        c.close()
    with StoreCheckpoint.open_in(tmp_path) as cp:  # claims far more than the queues hold
        cp.physic_msg_timestamp = cp.logics_msg_timestamp = results[-1].store_timestamp + 5000
        cp.flush()
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert rep.start_offset > results[5].wrote_offset  # the checkpoint's choice...
    assert rep.dispatch_from == results[5].wrote_offset  # ...but the queues are caught up
    assert rep.records_redispatched == 55
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results]


def test_one_queue_behind_a_checkpoint_ahead_of_it_gets_its_units_not_pre_blanks(
    tmp_path: Path,
) -> None:
    """Queue 0 holds every record, queue 1 lost its last 20 units (some of their records
    are in older segments than the one the checkpoint picks): the queues' common end is
    past them, so only queue 1's next offset after them shows the hole. On the code
    before, its re-dispatch filled the hole with pre-blanks: acknowledged messages no
    pull served, while the queue's max offset counted them."""
    build_store(tmp_path, 60)
    cqs = ConsumeQueueStore(tmp_path, CQ_FILE).load()
    q1 = cqs.get("T", 1)
    assert q1 is not None and q1.max_offset() == 30
    assert q1.cut_at(10) == 20
    cqs.flush_all()
    cqs.close()
    log = open_log(tmp_path)
    segs = [s.start_offset for s in log.queue.segments]
    log.close()
    offsets = _pull_all(tmp_path)
    assert len(offsets) == 40 and len(segs) >= 3
    with StoreCheckpoint.open_in(tmp_path) as cp:  # claims the queues hold everything
        cp.physic_msg_timestamp = cp.logics_msg_timestamp = now_ms() + 10**7
        cp.flush()
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert rep.start_offset == segs[-1] and rep.queue_offsets == {"T/0": 30, "T/1": 30}
    with StoreReader(tmp_path, GEO) as r:
        got = r.get_messages("T", 1, 0, 1000, max_bytes=1 << 30)
        assert [m.queue_offset for m in got.messages] == list(range(30))
    assert len(_pull_all(tmp_path)) == 60
    assert rep.queues_rebuilt == {"T/1": 10}
    _assert_consistent(tmp_path)


def test_last_file_truncated_mid_record(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    torn = results[27]
    seg = torn.wrote_offset - torn.wrote_offset % SEGMENT
    path = tmp_path / "commitlog" / f"{seg:020d}"
    os.truncate(path, torn.wrote_offset - seg + 50)  # the file ends inside record 27
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert rep.segments_extended == [path.name] and path.stat().st_size == SEGMENT
    assert (rep.end_offset, rep.stop) == (torn.wrote_offset, "CORRUPT")
    assert 0 < rep.bytes_truncated <= 50
    assert rep.queue_offsets == {"T/0": 14, "T/1": 13}
    _assert_consistent(tmp_path)


def test_index_disabled_builds_queues_only(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    write_messages(log, 10)
    log.queue.flush_all()
    log.close()
    rep = recover_store(tmp_path, StoreSettings(message_index_enable=False), geometry=GEO)
    assert rep.records_redispatched == 10 and rep.index_keys_redispatched == 0
    assert not (tmp_path / "index").exists() or os.listdir(tmp_path / "index") == []


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 50),
    dispatched=st.integers(0, 50),
    cut_at=st.integers(0, 49),
    cut_into=st.integers(0, 200),
    abort=st.booleans(),
)
def test_any_crash_phase_recovers_to_the_valid_prefix(
    tmp_path_factory: pytest.TempPathFactory,
    n: int,
    dispatched: int,
    cut_at: int,
    cut_into: int,
    abort: bool,
) -> None:
    """Appends, a dispatch that got some way, a log that lost its tail from some byte of
    some record on: recovery leaves exactly the records before that one, each pullable
    once, queue offsets dense, and the table the appender continues from."""
    store = tmp_path_factory.mktemp("s")
    log = open_log(store)
    results = write_messages(log, n, queues=3)
    cqs, idx = ConsumeQueueStore(store, CQ_FILE), IndexService(store, SLOTS, ENTRIES)
    k = min(dispatched, n)
    limit = results[k - 1].wrote_offset + results[k - 1].wrote_bytes if k else 0
    Dispatcher(log, cqs, idx).dispatch(0, limit)
    log.queue.flush_all()
    cqs.flush_all()
    for c in (log, cqs, idx):
        c.close()
    c = min(cut_at, n - 1)
    # Lost bytes are found up to the properties' length field; lost property bytes are
    # not (no CRC covers them, in RocketMQ either), so the tail is cut no later.
    props_at = results[c].wrote_bytes - len(encode_properties(message(c).properties))
    lost_from = results[c].wrote_offset + min(cut_into, props_at - 1)
    _zero_from(store, lost_from)
    if abort:
        _crash(store)
    rep = _recover(store)
    kept = results[:c]
    assert rep.end_offset == results[c].wrote_offset
    assert _pull_all(store, queues=3) == [r.wrote_offset for r in kept]
    expect = {f"T/{q}": sum(1 for i in range(len(kept)) if i % 3 == q) for q in range(3)}
    assert {k2: v for k2, v in rep.queue_offsets.items() if v} == {
        k2: v for k2, v in expect.items() if v
    }
    _assert_consistent(store)


def test_caller_says_whether_the_last_run_was_clean(tmp_path: Path) -> None:
    build_store(tmp_path, 5)
    _crash(tmp_path)  # a supervisor writes abort at boot, then recovers
    assert _recover(tmp_path, abnormal=False).mode == "normal"
    (tmp_path / "abort").unlink()
    assert _recover(tmp_path, abnormal=True).mode == "abnormal"


# --- damaged consume queues and short files -------------------------------------------------


def _cq_file(store: Path, queue_id: int) -> Path:
    return next(iter(sorted((store / "consumequeue" / "T" / str(queue_id)).iterdir())))


@pytest.mark.parametrize("crashed", [True, False], ids=["abnormal", "normal"])
def test_a_unit_pointing_mid_record_is_found_and_its_queue_rebuilt(
    tmp_path: Path, crashed: bool
) -> None:
    results, _end = build_store(tmp_path, 30)
    f = _cq_file(tmp_path, 0)
    data = bytearray(f.read_bytes())
    data[5 * 20 + 7] ^= 0x10  # unit 5's physical offset, low byte: now inside a record
    f.write_bytes(bytes(data))
    if crashed:
        _crash(tmp_path)
    rep = _recover(tmp_path)
    assert rep.mode == ("abnormal" if crashed else "normal")
    assert rep.queues_rebuilt == {"T/0": 5}
    assert rep.records_redispatched >= 10  # units 5.. of T/0 written again
    assert _pull_all(tmp_path) == sorted(r.wrote_offset for r in results)
    _assert_consistent(tmp_path)
    assert _recover(tmp_path).queues_rebuilt == {}  # and it stays repaired


def test_a_consume_queue_file_cut_short_is_extended_and_rebuilt(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    f = _cq_file(tmp_path, 1)
    with open(f, "r+b") as fh:
        fh.truncate(7 * 20 + 3)  # 7 whole units and part of the 8th
    rep = _recover(tmp_path)  # after a clean stop: nothing else would re-dispatch them
    assert rep.mode == "normal"
    assert rep.queue_files_extended == [f"T/1/{f.name}"]
    assert rep.queues_rebuilt == {"T/1": 7}
    assert f.stat().st_size == CQ_FILE
    assert _pull_all(tmp_path) == sorted(r.wrote_offset for r in results)
    _assert_consistent(tmp_path)


def test_a_segment_cut_short_before_the_preallocated_next_one(tmp_path: Path) -> None:
    results, _end = build_store(tmp_path, 30)
    last = results[-1]
    seg = last.wrote_offset - last.wrote_offset % SEGMENT
    path = tmp_path / "commitlog" / f"{seg:020d}"
    with open(path, "r+b") as fh:
        fh.truncate(last.wrote_offset - seg + last.wrote_bytes // 2)
    (tmp_path / "commitlog" / f"{seg + SEGMENT:020d}").write_bytes(bytes(SEGMENT))
    _crash(tmp_path)
    rep = _recover(tmp_path)
    assert rep.segments_extended == [path.name]
    assert (rep.end_offset, rep.stop) == (last.wrote_offset, "CORRUPT")
    assert _pull_all(tmp_path) == sorted(r.wrote_offset for r in results[:-1])
    _assert_consistent(tmp_path)


def test_a_full_disk_defers_re_dispatch_and_offsets_come_from_the_log(tmp_path: Path) -> None:
    """Recovery needs no new space: when a consume-queue file cannot be created (ENOSPC),
    the rest is left to the dispatcher, the boot succeeds, and the producers' next queue
    offsets are those of the log, not of the lagging queues (which would reuse offsets)."""
    log = open_log(tmp_path)
    results = write_messages(log, 30)
    cqs, idx = ConsumeQueueStore(tmp_path, CQ_FILE), IndexService(tmp_path, SLOTS, ENTRIES)
    Dispatcher(log, cqs, idx).dispatch(0, results[1].wrote_offset)  # queue 1 has no file yet
    log.queue.flush_all()
    for c in (log, cqs, idx):
        c.close()
    StoreCheckpoint(tmp_path / "checkpoint").close()
    fileio.set_fault("fallocate", lambda: OSError(errno.ENOSPC, "injected: disk full"))
    rep = _recover(tmp_path)
    assert (
        f"dispatch from {results[1].wrote_offset} left to the dispatcher" in rep.dispatch_deferred
    )
    assert "dispatch from" in rep.summary()
    assert rep.queue_offsets == {"T/0": 15, "T/1": 15}
    assert _pull_all(tmp_path) == [results[0].wrote_offset]
    fileio.clear_faults()  # space is back: the dispatcher goes on from the queues' end
    disp = Dispatcher.open(tmp_path, GEO)
    try:
        disp.dispatch(disp.resume_offset(), disp.log.max_offset())
    finally:
        disp.close()
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results]
    assert not list(tmp_path.rglob("*.tmp"))  # the failed allocation kept no blocks


class _Synced:
    """A sync watch (`fileio.set_sync_watch`, the sync seam): the names of the files
    whose data each sync made durable."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def data_synced(self, path: fileio.StrPath, offset: int, length: int) -> None:
        self.names.append(os.path.basename(os.fspath(path)))

    def dir_synced(self, path: fileio.StrPath) -> None:
        pass

    def renamed(self, src: fileio.StrPath, dst: fileio.StrPath) -> None:
        pass


def test_normal_recovery_forces_only_the_index_files_the_checkpoint_does_not_cover(
    tmp_path: Path,
) -> None:
    """A full index file was forced when the next one was made, before the checkpoint's
    index timestamp reached it: a normal recovery does not force it again (an fsync per
    index file would make recovery grow with the store). Without that timestamp, and
    after a crash, every file is forced."""
    build_store(tmp_path, 100)  # 3 keys a message, 63 entries a file
    names = sorted(os.listdir(tmp_path / "index"))
    assert len(names) >= 3
    synced = _Synced()
    fileio.set_sync_watch(synced)
    try:
        _recover(tmp_path)  # the checkpoint has no index timestamp yet
        assert set(names) <= set(synced.names)
        synced.names.clear()
        rep = _recover(tmp_path)
        assert rep.mode == "normal"
        assert [n for n in synced.names if n in names] == [names[-1]]
        synced.names.clear()
        _crash(tmp_path)
        rep = _recover(tmp_path)
        assert rep.mode == "abnormal" and rep.index_files_destroyed == []
        assert set(names) <= set(synced.names)
    finally:
        fileio.set_sync_watch(None)


def test_plan_and_validate_write_nothing_and_apply_does_what_they_found(tmp_path: Path) -> None:
    """The steps one by one: plan and validate leave the loaded store's files as they
    were; validate's cuts name the torn record and the first record the queues lack;
    apply re-dispatches from there, cuts there, and every record before the tear reads."""
    results = _dispatched_up_to(tmp_path, 30, 10)
    _zero_from(tmp_path, results[25].wrote_offset + 10)  # record 25 torn
    _crash(tmp_path)
    s = StoreSettings()
    report = RecoveryReport("abnormal", str(tmp_path))
    with contextlib.ExitStack() as stack:
        st = load_store(
            stack, str(tmp_path), GEO, s, read_only=False, abnormal=True, clock_ms=now_ms
        )
        before = _snapshot(tmp_path)
        plan = plan_recovery(
            st, abnormal=True, index_safe=False, segments_extended=[], queue_files_extended=[]
        )
        cuts = validate(st, plan, check_crc=True, progress=None)
        assert _snapshot(tmp_path) == before
        assert (plan.start_offset, plan.dispatch_from) == (0, 0)  # all-zero checkpoint
        assert (cuts.end_offset, cuts.stop.value) == (results[25].wrote_offset, "CORRUPT")
        assert cuts.lacking_from == results[10].wrote_offset
        assert cuts.records_validated == 25 and cuts.bytes_truncated > 0
        apply(report, st, plan, cuts)
    assert report.records_redispatched == 15
    assert _pull_all(tmp_path) == [r.wrote_offset for r in results[:25]]
    _assert_consistent(tmp_path)


# --- re-dispatch: the dispatcher's batches, the same files ------------------------------


def _built(store: Path, part: str) -> list[bytes]:
    """The files under `part` (consume queues or index) by path, contents only: index
    files are named by the time they were made."""
    files = sorted(p for p in (store / part).rglob("*") if p.is_file())
    if part == "index":
        return [p.read_bytes() for p in files]
    return [str(p.relative_to(store)).encode() + b"=" + p.read_bytes() for p in files]


@pytest.mark.parametrize("lost", [("consumequeue", "index"), ("index",), ("consumequeue",)])
def test_redispatch_rebuilds_what_the_dispatcher_built(tmp_path: Path, lost: tuple[str]) -> None:
    """A crashed store whose queues and/or index are gone gets them back byte for byte
    as the dispatcher built them, through the dispatcher's batches; the report counts
    the records it passed to the dispatcher and what it wrote, and says it in its
    summary (it said 're-dispatched 0 records' when only the index was lost)."""
    n = 200
    _results, end = build_store(tmp_path, n, queues=3)
    built = {part: _built(tmp_path, part) for part in ("consumequeue", "index")}
    keys = sum(len(message(i).properties["KEYS"].split()) + 1 for i in range(n))
    for part in lost:
        shutil.rmtree(tmp_path / part)
    _crash(tmp_path)
    steps: list[Step] = []
    rep = _recover(tmp_path, progress=steps.append)
    assert rep.end_offset == end and rep.redispatch_records == n
    assert rep.records_redispatched == (n if "consumequeue" in lost else 0)
    assert rep.index_keys_redispatched == (keys if "index" in lost else 0)
    assert f"re-dispatched {n} records ({rep.records_redispatched} queue units" in rep.summary()
    for part in ("consumequeue", "index"):
        assert _built(tmp_path, part) == built[part], part
    redone = [s for s in steps if s.phase == REDISPATCHING]
    assert [s.done_bytes for s in redone] == sorted(s.done_bytes for s in redone)
    assert redone[-1].done_bytes == redone[-1].total_bytes == end
    assert redone[-1].records == n
    assert _pull_all(tmp_path, queues=3) == [r.wrote_offset for r in _results]
    again = _recover(tmp_path)
    assert (again.records_redispatched, again.index_keys_redispatched) == (0, 0)


def test_a_stop_while_recovering_leaves_a_store_the_next_recovery_finishes(
    tmp_path: Path,
) -> None:
    """`RecoveryInterrupted` from the progress callback (a SIGTERM to `mqstore start`)
    stops recovery part way through the re-dispatch; `abort` stays, and the next
    recovery rebuilds the rest."""
    results, end = build_store(tmp_path, 200, queues=3)
    built = {part: _built(tmp_path, part) for part in ("consumequeue", "index")}
    shutil.rmtree(tmp_path / "consumequeue")
    shutil.rmtree(tmp_path / "index")
    _crash(tmp_path)

    def stop_half_way(step: Step) -> None:
        if step.phase == REDISPATCHING and step.done_bytes > end // 2:
            raise RecoveryInterrupted("stop")

    with pytest.raises(RecoveryInterrupted):
        _recover(tmp_path, progress=stop_half_way, clear_abort=True)
    assert (tmp_path / "abort").exists()
    assert _pull_all(tmp_path, queues=3) != [r.wrote_offset for r in results]
    rep = _recover(tmp_path, clear_abort=True)
    assert rep.end_offset == end and not (tmp_path / "abort").exists()
    for part in ("consumequeue", "index"):
        assert _built(tmp_path, part) == built[part], part
    assert _pull_all(tmp_path, queues=3) == [r.wrote_offset for r in results]


def test_a_record_straddling_a_kept_and_a_destroyed_index_file_keeps_every_key(
    tmp_path: Path,
) -> None:
    """Messages of 2 and 3 keys in turn, 63 a file: message 25 has its first key at the
    first file's end and its others in the second. A crash once the first file was
    forced (the checkpoint's index time at its end, as the dispatcher's flush thread
    leaves it after the roll): abnormal recovery destroys the second file (newer than
    the checkpoint) and keeps the first. Message 25's key there must go too, or it counts
    as indexed and is never re-dispatched, its other keys lost; the index then is the
    bytes of a run without the crash."""
    n = 40

    def msg(i: int) -> Message:
        m = message(i, queue_id=i % 2)
        keys = f"key{i}" + (" common" if i % 2 else "")
        return dataclasses.replace(m, properties={**m.properties, "KEYS": keys})

    def build(store: Path) -> list[AppendResult]:
        log = open_log(store)
        results = [log.append(msg(i)) for i in range(n)]
        cqs = ConsumeQueueStore(store, CQ_FILE)
        idx = IndexService(store, SLOTS, ENTRIES)
        Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
        log.queue.flush_all()
        cqs.flush_all()
        idx.flush()
        first = idx.files[0]
        assert len(idx.files) == 2 and first.end_phy_offset == results[25].wrote_offset
        assert sum(e[2] == first.end_phy_offset for e in first.entries()) == 1  # of 3
        cp = StoreCheckpoint(store / "checkpoint")
        cp.index_msg_timestamp = first.end_timestamp
        cp.flush()
        cp.close()
        for closing in (log, cqs, idx):
            closing.close()
        return results

    results = build(tmp_path / "crashed")
    build(tmp_path / "ref")
    _crash(tmp_path / "crashed")
    rep = _recover(tmp_path / "crashed")
    assert rep.mode == "abnormal" and len(rep.index_files_destroyed) == 1
    with StoreReader(tmp_path / "crashed", GEO) as r:
        for i in range(n):
            keys = [*msg(i).properties["KEYS"].split(), f"U{i:08d}"]
            for k in keys:
                hits = [h.physical_offset for h in r.query_by_key("T", k, 64)]
                assert results[i].wrote_offset in hits, (i, k, hits)
    assert rep.index_entries_truncated == 1  # message 25's key in the kept file
    assert _built(tmp_path / "crashed", "index") == _built(tmp_path / "ref", "index")
