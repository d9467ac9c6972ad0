"""Retention rules with a moved clock and an injected usage probe (spec §8.14)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mqstore.conf.settings import StoreSettings
from mqstore.engine.diskguard import DiskGuard, store_paths
from mqstore.engine.record import Message
from mqstore.engine.retention import (
    CleanReason,
    Retention,
    SegmentFileInfo,
    checkpointed_offset,
    is_delete_hour,
    keep_from,
    select_expired,
)
from tests.retention.helpers import (
    HOUR_MS,
    SEG,
    Clock,
    Probe,
    build_log,
    local_time_at_hour,
    set_mtime,
    write_cq_file,
    write_index_file,
)

S = StoreSettings(segment_size_bytes=SEG)


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, ms: int) -> None:
        self.calls.append(ms)


def _retention(
    store: Path, clock: Clock, probe: Probe, settings: StoreSettings = S, segments: int = 6
) -> tuple[Retention, Sleeps]:
    log = build_log(store, clock, segments)
    guard = DiskGuard(store_paths(store), settings, probe=probe)
    sleeps = Sleeps()
    return Retention(store, log.queue, guard, settings, clock_ms=clock, sleep_ms=sleeps), sleeps


def _names(ret: Retention) -> list[int]:
    return [s.start_offset for s in ret.queue.segments]


def test_delete_hour_is_local_time() -> None:
    now = local_time_at_hour(1_700_000_000_000, 4, 10)
    assert is_delete_hour(now, (4,))
    assert is_delete_hour(now, (3, 4, 5))
    assert not is_delete_hour(now, (5,))
    assert not is_delete_hour(now + HOUR_MS, (4,))


def test_nothing_runs_outside_the_hour_with_room_on_disk(tmp_path: Path) -> None:
    clock = Clock()
    clock.ms = local_time_at_hour(clock.ms + 80 * HOUR_MS, 13)
    ret, _ = _retention(tmp_path, clock, Probe(0.5))
    for seg in ret.queue.segments:
        set_mtime(seg.path, clock.ms - 100 * HOUR_MS)  # long expired
    before = _names(ret)
    r = ret.run_once(keep_from_offset=None)
    assert r.trigger is not None and not r.trigger.run
    assert _names(ret) == before and r.files_deleted == 0


def test_expired_segments_go_at_the_delete_hour_oldest_first_never_the_last(
    tmp_path: Path,
) -> None:
    clock = Clock()
    ret, sleeps = _retention(tmp_path, clock, Probe(0.5))
    segs = ret.queue.segments
    clock.ms = local_time_at_hour(clock.ms + 73 * HOUR_MS, 4)
    for seg in segs:
        set_mtime(seg.path, clock.ms - 73 * HOUR_MS)
    r = ret.run_once(keep_from_offset=None)
    assert r.trigger is not None and r.trigger.time_up and not r.trigger.clean_at_once
    assert _names(ret) == [segs[-1].start_offset]
    assert [d.start_offset for d in r.deleted] == [s.start_offset for s in segs[:-1]]
    assert all(d.reason is CleanReason.EXPIRED for d in r.deleted)
    assert all(not os.path.exists(s.path) for s in segs[:-1])
    assert os.path.exists(segs[-1].path)
    assert sleeps.calls == [S.delete_commitlog_files_interval_ms] * (len(segs) - 2)
    assert r.bytes_deleted == SEG * (len(segs) - 1)
    assert r.min_offset_after == segs[-1].start_offset
    json.dumps(r.to_json_dict())


def test_a_fresh_segment_stops_the_walk_never_delete_in_the_middle(tmp_path: Path) -> None:
    clock = Clock()
    ret, _ = _retention(tmp_path, clock, Probe(0.5))
    segs = ret.queue.segments
    clock.ms = local_time_at_hour(clock.ms, 4)
    old, fresh = clock.ms - 72 * HOUR_MS, clock.ms - 71 * HOUR_MS
    for i, seg in enumerate(segs):
        set_mtime(seg.path, fresh if i == 2 else old)
    r = ret.run_once(keep_from_offset=None)
    assert [d.start_offset for d in r.deleted] == [segs[0].start_offset, segs[1].start_offset]
    assert _names(ret)[0] == segs[2].start_offset
    assert "has not expired" not in " ".join(r.notes)


def test_disk_over_max_ratio_runs_outside_the_hour_but_only_expired(tmp_path: Path) -> None:
    clock = Clock()
    clock.ms = local_time_at_hour(clock.ms, 13)
    probe = Probe(0.80)
    ret, _ = _retention(tmp_path, clock, probe)
    segs = ret.queue.segments
    set_mtime(segs[0].path, clock.ms - 73 * HOUR_MS)
    r = ret.run_once(keep_from_offset=None)
    assert r.trigger is not None
    assert r.trigger.space_to_delete and not r.trigger.time_up and not r.trigger.clean_at_once
    assert [d.start_offset for d in r.deleted] == [segs[0].start_offset]
    probe.ratio = 0.70
    set_mtime(segs[1].path, clock.ms - 73 * HOUR_MS)
    r = ret.run_once(keep_from_offset=None)
    assert r.files_deleted == 0  # under 75 % and not the hour: nothing runs


def test_over_the_force_ratio_deletes_unexpired_at_most_ten_per_run(tmp_path: Path) -> None:
    clock = Clock()
    clock.ms = local_time_at_hour(clock.ms, 13)
    ret, sleeps = _retention(tmp_path, clock, Probe(0.86), segments=13)
    segs = ret.queue.segments
    r = ret.run_once(keep_from_offset=None)
    assert r.trigger is not None and r.trigger.clean_at_once
    assert r.disk is not None and r.disk.clean_immediately and not r.disk.disk_full
    assert [d.start_offset for d in r.deleted] == [s.start_offset for s in segs[:10]]
    assert all(d.reason is CleanReason.CLEAN_IMMEDIATELY for d in r.deleted)
    assert len(sleeps.calls) == 9  # between deletions, not after the tenth
    r = ret.run_once(keep_from_offset=None)
    assert [d.start_offset for d in r.deleted] == [s.start_offset for s in segs[10:12]]
    assert _names(ret) == [segs[12].start_offset]


def test_force_ratio_without_forced_clean_only_expired(tmp_path: Path) -> None:
    clock = Clock()
    settings = S.replace(clean_file_forcibly_enable=False)
    ret, _ = _retention(tmp_path, clock, Probe(0.86), settings=settings)
    r = ret.run_once(keep_from_offset=None)
    assert r.trigger is not None and r.trigger.run and not r.trigger.clean_at_once
    assert r.files_deleted == 0


def test_never_past_the_protected_offset(tmp_path: Path) -> None:
    clock = Clock()
    ret, _ = _retention(tmp_path, clock, Probe(0.95))
    segs = ret.queue.segments
    # flushed is inside segment 3, dispatched inside segment 2, checkpoint at segment 4
    flushed = segs[3].start_offset + 100
    dispatched = segs[2].start_offset + 5
    checkpointed = segs[4].start_offset
    protect = keep_from(flushed, dispatched, checkpointed, None)
    assert protect == dispatched
    r = ret.run_once(keep_from_offset=protect)
    assert [d.start_offset for d in r.deleted] == [segs[0].start_offset, segs[1].start_offset]
    assert _names(ret)[0] == segs[2].start_offset
    r = ret.run_once(keep_from_offset=protect)
    assert r.files_deleted == 0
    assert any("not yet flushed" in n for n in r.notes)
    assert keep_from(None, None) is None


def test_manual_clean_runs_outside_the_hour(tmp_path: Path) -> None:
    clock = Clock()
    clock.ms = local_time_at_hour(clock.ms, 13)
    ret, _ = _retention(tmp_path, clock, Probe(0.5))
    segs = ret.queue.segments
    for seg in segs:
        set_mtime(seg.path, clock.ms - 73 * HOUR_MS)
    ret.request_manual(runs=1)
    r = ret.run_once(keep_from_offset=None)
    assert r.trigger is not None and r.trigger.manual
    assert r.files_deleted == len(segs) - 1
    r = ret.run_once(keep_from_offset=None)
    assert r.trigger is not None and not r.trigger.manual


def test_select_expired_is_the_same_rule_pure() -> None:
    infos = [SegmentFileInfo(f"p{i}", i * 10, 10, 1000 * i) for i in range(15)]
    kw = {"reserved_ms": 5000, "clean_at_once": False, "keep_from_offset": None, "max_files": 10}
    assert [s.start_offset for s in select_expired(infos, now=7500, **kw)] == [0, 10, 20]  # type: ignore[arg-type]
    kw["clean_at_once"] = True
    assert len(select_expired(infos, now=0, **kw)) == 10  # type: ignore[arg-type]
    kw["keep_from_offset"] = 35
    assert [s.start_offset for s in select_expired(infos, now=0, **kw)] == [0, 10, 20]  # type: ignore[arg-type]


def test_consume_queue_and_index_files_below_the_log_min_offset(tmp_path: Path) -> None:
    clock = Clock()
    cq_size = 4 * 20
    # its own pause, unlike the commit log's, so the queue walk's sleeps are told apart
    settings = S.replace(
        consume_queue_file_size_bytes=cq_size, delete_consume_queue_files_interval_ms=37
    )
    ret, sleeps = _retention(tmp_path, clock, Probe(0.95), settings=settings)
    segs = ret.queue.segments
    new_min = segs[3].start_offset  # after deleting 3 segments (bounded below)
    qdir = tmp_path / "consumequeue" / "T" / "0"
    a = write_cq_file(qdir, 0, [(0, 10), (10, 10), (20, 10), (new_min - 50, 10)], cq_size)
    b = write_cq_file(qdir, 80, [(new_min - 40, 10)] * 3 + [(new_min, 10)], cq_size)
    c = write_cq_file(qdir, 160, [(new_min - 10, 10)] * 4, cq_size)  # the last: kept
    (tmp_path / "consumequeue" / "T" / "notanint").mkdir()
    q1 = tmp_path / "consumequeue" / "T" / "1"
    d = write_cq_file(q1, 0, [(1, 1)] * 2, cq_size)  # not full: the walk stops at it
    write_cq_file(q1, 80, [(1, 1)], cq_size)
    idir = tmp_path / "index"
    i1 = write_index_file(idir, "20240101000000000", new_min - 1)
    i2 = write_index_file(idir, "20240101000000001", new_min + 5)
    i3 = write_index_file(idir, "20240101000000002", 0)  # last: kept whatever it says
    r = ret.run_once(keep_from_offset=new_min)
    assert r.min_offset_after == new_min
    gone = {d.path for d in r.deleted if d.kind != "commitlog"}
    assert gone == {str(a), str(i1)}
    assert all(p.exists() for p in (b, c, d, i2, i3))
    # one pause after queue T/0, which lost a file; none after T/1, which lost none
    assert sleeps.calls.count(37) == 1 and sleeps.calls[-1] == 37
    assert all(d.reason is CleanReason.BELOW_MIN_OFFSET for d in r.deleted if d.kind != "commitlog")


def test_unconsumed_bytes_from_committed_consumer_offsets(tmp_path: Path) -> None:
    clock = Clock()
    ret, _ = _retention(tmp_path, clock, Probe(0.95))
    segs = ret.queue.segments
    # 7 records per segment, queue offsets 0.. in order; group A consumed up to 10,
    # group B up to 3: a record is unconsumed by every group from offset 10 on.
    consumed = {"A": {("T", 0): 10}, "B": {("T", 0): 3}}
    r = ret.run_once(keep_from_offset=segs[3].start_offset, consumed=consumed)
    assert r.files_deleted == 3
    per = [d.unconsumed_bytes for d in r.deleted]
    rec = 1000 + 91 + len("T")  # body + fixed part + topic, no properties
    records_per_seg = (SEG - 8) // rec
    assert per == [0, (2 * records_per_seg - 10) * rec, records_per_seg * rec]
    assert r.unconsumed_bytes_deleted == sum(per)  # type: ignore[arg-type]
    assert ret.totals.unconsumed_bytes_deleted == sum(per)  # type: ignore[arg-type]
    r2 = ret.run_once(keep_from_offset=None)
    assert r2.unconsumed_bytes_deleted is None and r2.files_deleted > 0
    json.dumps(ret.totals.to_json_dict())


def test_checkpointed_offset_is_where_abnormal_recovery_starts(tmp_path: Path) -> None:
    clock = Clock(1_700_000_000_000)
    log = build_log(tmp_path, clock, 1)
    starts = []
    for step in range(4):
        clock.advance(1000)
        while len(log.queue) < step + 2:
            log.append(Message(topic="T", body=b"x" * 1000))
        starts.append(log.queue.last().start_offset)  # type: ignore[union-attr]
    # segment k's first record was stored at 1_700_000_000_000 + 1000 * k
    assert checkpointed_offset(log.queue, 1_700_000_002_500) == SEG * 2
    assert checkpointed_offset(log.queue, 0) == 0
    assert checkpointed_offset(log.queue, 1 << 62) == SEG * 4


@pytest.mark.parametrize("fail", [True, False])
def test_unknown_disk_usage_lets_the_cleaner_run_and_sets_no_flag(
    tmp_path: Path, fail: bool
) -> None:
    clock = Clock()
    clock.ms = local_time_at_hour(clock.ms, 13)
    probe = Probe(0.99)
    probe.fail = fail
    ret, _ = _retention(tmp_path, clock, probe)
    r = ret.run_once(keep_from_offset=None)
    assert r.disk is not None
    assert r.disk.disk_full is (not fail)
    assert r.trigger is not None and r.trigger.space_to_delete
