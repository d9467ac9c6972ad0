"""Retention over consume queues and index files built by the real dispatcher
(`engine.dispatch`): the dispatched bound read from the files, deletion below the log's
minimum, and the consume-queue store still loading and answering afterwards."""

from __future__ import annotations

import os
from pathlib import Path

from mqstore.conf.settings import StoreSettings
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue_files import dispatched_offset_from_files
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.reader import Geometry
from mqstore.engine.record import Message
from mqstore.engine.segment_queue import SegmentQueue
from mqstore.workers.cleaner import clean_once
from tests.retention.helpers import BODY, HOUR_MS, SEG, Clock, set_mtime

CQ_FILE = 4 * 20
S = StoreSettings(
    segment_size_bytes=SEG,
    consume_queue_file_size_bytes=CQ_FILE,
    max_hash_slot_num=16,
    max_index_num=12,
)


def _store(tmp_path: Path, segments: int) -> CommitLog:
    clock = Clock()
    queue = SegmentQueue(tmp_path / "commitlog", SEG, clock_ms=clock)
    queue.load()
    log = CommitLog(queue, clock_ms=clock)
    i = 0
    while len(queue) < segments:
        m = Message(topic="T", body=BODY, queue_id=i % 2, properties={"KEYS": f"k{i}"})
        assert log.append(m).ok
        i += 1
    return log


def _dispatch(tmp_path: Path, limit: int) -> None:
    d = Dispatcher.open(tmp_path, Geometry.of(tmp_path, S))
    try:
        d.dispatch(d.resume_offset(), limit)
        d.queues.flush_all()
    finally:
        d.close()


def _dispatched_store(store: Path, segments: int) -> list[str]:
    """`_store` flushed, closed and wholly dispatched; its segments' paths."""
    log = _store(store, segments)
    paths = [s.path for s in log.queue.segments]
    end = log.max_offset()
    log.queue.flush_all()
    log.close()
    _dispatch(store, end)
    return paths


def test_dispatched_bound_from_files_protects_undispatched_segments(tmp_path: Path) -> None:
    log = _store(tmp_path, 6)
    paths = [s.path for s in log.queue.segments]
    log.queue.flush_all()
    log.close()
    assert dispatched_offset_from_files(tmp_path) is None  # no consume queues yet
    _dispatch(tmp_path, 3 * SEG)
    bound = dispatched_offset_from_files(tmp_path)
    assert bound is not None and 2 * SEG < bound <= 3 * SEG
    for p in paths:
        set_mtime(p, Clock().ms - 100 * HOUR_MS)
    r = clean_once(tmp_path, S, now=True, sleep_ms=lambda ms: None)
    deleted_logs = [d.path for d in r.deleted if d.kind == "commitlog"]
    assert deleted_logs == paths[:2]  # segment 2 is not wholly dispatched
    assert r.keep_from_offset == bound


def test_queues_and_index_below_the_minimum_go_and_the_store_still_loads(
    tmp_path: Path,
) -> None:
    paths = _dispatched_store(tmp_path, 6)
    cq_before = {q: sorted(os.listdir(tmp_path / "consumequeue" / "T" / q)) for q in ("0", "1")}
    idx_before = sorted(os.listdir(tmp_path / "index"))
    assert len(idx_before) > 2 and all(len(v) > 3 for v in cq_before.values())
    for p in paths:
        set_mtime(p, Clock().ms - 100 * HOUR_MS)
    r = clean_once(tmp_path, S, now=True, sleep_ms=lambda ms: None)
    new_min = 5 * SEG
    assert r.min_offset_after == new_min
    kinds = {d.kind for d in r.deleted}
    assert kinds == {"commitlog", "consumequeue", "index"}
    store = ConsumeQueueStore(tmp_path, CQ_FILE).load()
    try:
        for cq in store:
            cq.correct_min_offset(new_min)
            assert cq.min_offset() <= cq.max_offset()
            if cq.min_offset() < cq.max_offset():
                first = cq.get(cq.min_offset())
                assert first is not None and first.physical_offset >= new_min
            assert cq.get(cq.min_offset() - 1) is None
    finally:
        store.close()
    for q, names in cq_before.items():
        left = sorted(os.listdir(tmp_path / "consumequeue" / "T" / q))
        assert left == names[len(names) - len(left) :]  # oldest files went, newest stay
        assert len(left) < len(names)
    idx_left = sorted(os.listdir(tmp_path / "index"))
    assert idx_left == idx_before[len(idx_before) - len(idx_left) :]
    assert len(idx_left) < len(idx_before)
