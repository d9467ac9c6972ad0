"""The disk guard's states and hysteresis, the space check before a new segment, puts
refused while DISK_FULL, and readers holding a segment across a forced destroy."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from mqstore.conf.settings import StoreSettings
from mqstore.engine.commitlog import AppendStatus, CommitLog
from mqstore.engine.diskguard import (
    DiskGuard,
    DiskState,
    DiskUsage,
    guarded_allocator,
    space_problem,
    store_paths,
)
from mqstore.engine.record import Message
from mqstore.engine.retention import CleanReason, Retention
from mqstore.engine.segment import Segment
from mqstore.engine.segment_queue import SegmentQueue
from tests.retention.helpers import SEG, Clock, Probe, build_log

S = StoreSettings(segment_size_bytes=SEG)


def test_ratio_is_rocketmqs_rounded_up_percent() -> None:
    assert DiskUsage("/", 1000, 851, 149).ratio == 0.86
    assert DiskUsage("/", 1000, 850, 150).ratio == 0.85
    # root-reserved blocks: used + usable < total; the ratio is over used + usable
    assert DiskUsage("/", 1000, 450, 450).ratio == 0.5
    assert DiskUsage("/", 0, 0, 0).ratio == -1.0


def test_states_and_hysteresis(tmp_path: Path) -> None:
    probe = Probe(0.50)
    g = DiskGuard(store_paths(tmp_path), S, probe=probe)
    seen = []
    for ratio in (0.50, 0.80, 0.86, 0.91, 0.88, 0.86, 0.85, 0.87, 0.91, 0.50):
        probe.ratio = ratio
        v = g.check()
        seen.append((ratio, v.state, v.changed))
        json.dumps(v.to_json_dict())
    assert seen == [
        (0.50, DiskState.OK, False),
        (0.80, DiskState.OK, False),
        (0.86, DiskState.CLEAN_IMMEDIATELY, False),
        (0.91, DiskState.DISK_FULL, True),
        (0.88, DiskState.DISK_FULL, False),  # between the ratios: still full
        (0.86, DiskState.DISK_FULL, False),
        (0.85, DiskState.OK, True),  # at the force ratio: writable again by itself
        (0.87, DiskState.CLEAN_IMMEDIATELY, False),  # does not flap back to full
        (0.91, DiskState.DISK_FULL, True),
        (0.50, DiskState.OK, True),
    ]
    assert probe.calls == 2 * 10  # commitlog/ and consumequeue/ each time


def test_ratios_come_from_the_settings_each_check(tmp_path: Path) -> None:
    probe = Probe(0.80)
    g = DiskGuard(store_paths(tmp_path), S, probe=probe)
    assert g.check().state is DiskState.OK
    tighter = S.replace(disk_space_warning_level_ratio=0.79, disk_space_clean_forcibly_ratio=0.7)
    v = g.check(tighter)
    assert v.state is DiskState.DISK_FULL and "79%" in g.refusal_reason()
    assert not g.check(S.replace(disk_max_used_space_ratio_pct=85)).space_to_delete


def test_the_worse_path_counts(tmp_path: Path) -> None:
    ratios = {"commitlog": 0.5, "consumequeue": 0.95}

    def probe(path: str) -> DiskUsage:
        r = ratios[os.path.basename(path)]
        return DiskUsage(path, 100, int(r * 100), 100 - int(r * 100))

    g = DiskGuard(store_paths(tmp_path), S, probe=probe)
    assert g.check().state is DiskState.DISK_FULL


def test_puts_refused_while_disk_full_then_resume(tmp_path: Path) -> None:
    clock = Clock()
    log = build_log(tmp_path, clock, 1)
    probe = Probe(0.95)
    g = DiskGuard(store_paths(tmp_path), S, probe=probe)
    g.check()
    g.apply(log)
    end = log.max_offset()
    wrote = log.queue.last().wrote_position  # type: ignore[union-attr]
    r = log.append(Message(topic="T", body=b"x"))
    assert r.status is AppendStatus.SERVICE_NOT_AVAILABLE
    assert "DISK_FULL" in r.reason and "95%" in r.reason
    rs = log.append_batch([Message(topic="T", body=b"x")] * 3)
    assert [x.status for x in rs] == [AppendStatus.SERVICE_NOT_AVAILABLE] * 3
    assert log.max_offset() == end and log.queue.last().wrote_position == wrote  # type: ignore[union-attr]
    probe.ratio = 0.85
    assert g.check().changed and not g.disk_full
    g.apply(log)
    assert log.append(Message(topic="T", body=b"x")).ok


def test_no_new_segment_without_room_for_it(tmp_path: Path) -> None:
    free = {"bytes": 10 * SEG}

    def probe(path: str) -> DiskUsage:
        return DiskUsage(path, 100 * SEG, 100 * SEG - free["bytes"], free["bytes"])

    d = tmp_path / "commitlog"
    assert space_problem(d, SEG, probe=probe) == ""
    free["bytes"] = SEG - 1
    assert "no space for a new 8192-byte segment" in space_problem(d, SEG, probe=probe)

    def create(start: int) -> Segment:
        return Segment.create(d, start, SEG)

    queue = SegmentQueue(d, SEG, allocator=guarded_allocator(create, d, SEG, probe=probe))
    queue.load()
    log = CommitLog(queue)
    r = log.append(Message(topic="T", body=b"x"))
    assert r.status is AppendStatus.CREATE_MAPPED_FILE_FAILED and "no space" in r.reason
    assert os.listdir(d) == []  # nothing half-created
    free["bytes"] = SEG
    assert log.append(Message(topic="T", body=b"x")).ok


def test_allocator_refuses_while_the_guard_says_full(tmp_path: Path) -> None:
    d = tmp_path / "commitlog"
    probe = Probe(0.95)
    g = DiskGuard(store_paths(tmp_path), S, probe=probe)
    g.check()

    def create(start: int) -> Segment:
        return Segment.create(d, start, SEG)

    queue = SegmentQueue(d, SEG, allocator=guarded_allocator(create, d, SEG, probe=probe, guard=g))
    queue.load()
    r = CommitLog(queue).append(Message(topic="T", body=b"x"))
    assert r.status is AppendStatus.CREATE_MAPPED_FILE_FAILED and "DISK_FULL" in r.reason


def test_a_reader_holds_a_segment_across_a_forced_destroy(tmp_path: Path) -> None:
    clock = Clock()
    settings = S.replace(destroy_mapped_file_interval_forcibly_ms=120_000)
    log = build_log(tmp_path, clock, 4)
    segs = log.queue.segments
    g = DiskGuard(store_paths(tmp_path), settings, probe=Probe(0.86))
    ret = Retention(tmp_path, log.queue, g, settings, clock_ms=clock, sleep_ms=lambda ms: None)
    reader = segs[0].select(0, 200)
    expected = bytes(reader.view)
    r = ret.run_once(keep_from_offset=None)
    # The held segment is shut down (no new readers) but not deleted; the walk stops.
    assert r.files_deleted == 0 and r.held == [segs[0].path]
    assert os.path.exists(segs[0].path) and not segs[0].available
    assert log.queue.min_offset() == segs[1].start_offset  # readers skip it already
    assert segs[0].select(0, 10).status.name == "UNAVAILABLE"
    clock.advance(119_000)
    assert ret.run_once(keep_from_offset=None).files_deleted == 0
    clock.advance(1_000)
    r = ret.run_once(keep_from_offset=None)
    assert [d.start_offset for d in r.deleted][:1] == [segs[0].start_offset]
    assert r.deleted[0].reason is CleanReason.CLEAN_IMMEDIATELY
    assert not os.path.exists(segs[0].path)
    assert bytes(reader.view) == expected  # the reader's mapping outlives the file
    reader.release()
    reader.release()  # a second release is harmless
    assert segs[0].is_cleanup_over()


def test_a_hung_first_segment_is_retried_every_redelete_interval(tmp_path: Path) -> None:
    clock = Clock()
    settings = S.replace(
        destroy_mapped_file_interval_forcibly_ms=1000,
        redelete_hanged_file_interval_ms=5000,
        delete_when=((time.localtime().tm_hour + 12) % 24,),  # never the delete hour here
    )
    log = build_log(tmp_path, clock, 3)
    segs = log.queue.segments
    probe = Probe(0.86)
    g = DiskGuard(store_paths(tmp_path), settings, probe=probe)
    ret = Retention(tmp_path, log.queue, g, settings, clock_ms=clock, sleep_ms=lambda ms: None)
    reader = segs[0].select(0, 100)
    assert ret.run_once(keep_from_offset=None).held == [segs[0].path]
    probe.ratio = 0.5  # deletion no longer triggered; only the hung-file retry runs
    clock.advance(2000)
    r = ret.run_once(keep_from_offset=None)
    assert r.files_deleted == 0  # the retry waits for redeleteHangedFileInterval
    clock.advance(3000)
    r = ret.run_once(keep_from_offset=None)
    assert [(d.start_offset, d.reason) for d in r.deleted] == [
        (segs[0].start_offset, CleanReason.HANGED_RETRY)
    ]
    reader.release()
