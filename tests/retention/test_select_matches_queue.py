"""`select_expired` (the pure rule, used to predict what a run deletes) and
`SegmentQueue.delete_expired_by_time` (what a run does) choose the same segments."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.engine.retention import SegmentFileInfo, select_expired
from mqstore.engine.segment import Segment
from mqstore.engine.segment_queue import SegmentQueue
from tests.retention.helpers import Clock, set_mtime

SIZE = 4096
NOW = 1_800_000_000_000


@settings(max_examples=60, deadline=None)
@given(
    ages=st.lists(st.integers(0, 10), min_size=1, max_size=14),
    reserved=st.integers(0, 10),
    clean_at_once=st.booleans(),
    keep_from=st.one_of(st.none(), st.integers(0, 15 * SIZE)),
    max_files=st.integers(1, 12),
)
def test_prediction_equals_deletion(
    ages: list[int], reserved: int, clean_at_once: bool, keep_from: int | None, max_files: int
) -> None:
    d = Path(tempfile.mkdtemp(prefix="mqstore-sel-"))
    try:
        for i, age in enumerate(ages):
            Segment.create(d, i * SIZE, SIZE).close()
            set_mtime(str(d / f"{i * SIZE:020d}"), NOW - age * 1000)
        queue = SegmentQueue(d, SIZE, clock_ms=Clock(NOW))
        queue.load()
        infos = [SegmentFileInfo.of(s) for s in queue.segments]
        predicted = select_expired(
            infos,
            now=NOW,
            reserved_ms=reserved * 1000,
            clean_at_once=clean_at_once,
            keep_from_offset=keep_from,
            max_files=max_files,
        )
        before = {s.start_offset for s in queue.segments}
        n = queue.delete_expired_by_time(
            reserved * 1000,
            delete_files_interval_ms=0,
            interval_forcibly_ms=0,
            clean_immediately=clean_at_once,
            max_files=max_files,
            keep_from_offset=keep_from,
        )
        gone = sorted(before - {s.start_offset for s in queue.segments})
        assert gone == [p.start_offset for p in predicted], (ages, reserved, keep_from)
        assert n == len(gone)
        assert len(queue) >= 1  # never the last
        queue.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
