"""Recovery's re-dispatch: which validated records the consume queues or the index lack,
found without writing (recovery's validate step) and written (its apply step).

A record is held when its consume queue's max physical offset reaches its end (a record
that takes no queue offset needs no unit) and, when it has index keys, the newest index
file's end is past it (or at it, with keys written there). `Holdings` answers that per
chunk of scanned records (`engine.scan`, `engine.logwalk.ChunkScan`): a whole chunk is
decided from each queue's last record in it (found in C, `verify.queue_last_ends`) and
the index's end, so a store whose queues are complete costs a few microseconds a chunk;
only the first chunk that lacks something is walked record by record (to find where
re-dispatch starts).

`redispatch` writes what is lacking over a span of the log, a chunk of records at a time
through the dispatcher's batch path (`Dispatcher.dispatch_scan`): at the dispatcher's
speed, linear in the records. Recovery only: the caller holds the store lock.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import time

from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import ConsumeQueue
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher, DispatchResult
from mqstore.engine.indexservice import IndexService
from mqstore.engine.logwalk import ChunkScan
from mqstore.engine.recordcodes import decode_utf8
from mqstore.engine.recovery_progress import REDISPATCHING, Progress, Step
from mqstore.engine.scan import RecordScan
from mqstore.engine.verify import queue_last_ends

_PREPARED_OR_ROLLBACK = 0x4  # the sysflag bit of the records that take no queue offset


class Holdings:
    """What the consume queues and the index hold, as log offsets. `index` None: no index
    is built, so every record counts as indexed. Re-read the index's end with
    `refresh_index` after writing to it; queue ends are read live (cached per queue)."""

    def __init__(self, cqs: ConsumeQueueStore, index: IndexService | None) -> None:
        self._cqs = cqs
        self._index = index
        self._cq_cache: dict[tuple[bytes, int], ConsumeQueue] = {}
        self._index_end = self._read_index_end()

    def refresh_index(self) -> None:
        self._index_end = self._read_index_end()

    def first_lacking(self, view: memoryview, base: int, scan: RecordScan, start: int) -> int:
        """The first record i >= `start` of `scan` (of `view`, whose first byte is log
        offset `base`) that a queue or the index lacks; -1: none."""
        if start >= scan.count or self.all_held(view, base, scan, start):
            return -1
        pos, size, queue_id, sys_flag = scan.pos, scan.size, scan.queue_id, scan.sys_flag
        topic_pos, topic_len, key_first = scan.topic_pos, scan.topic_len, scan.key_first
        ends: dict[tuple[bytes, int], int] = {}  # queue -> its max physical offset, -1 none
        for i in range(start, scan.count):
            offset = base + pos[i]
            need = False
            if not sys_flag[i] & _PREPARED_OR_ROLLBACK:  # takes a queue offset
                tp = topic_pos[i]
                key = (view[tp : tp + topic_len[i]].tobytes(), queue_id[i])
                cq_end = ends.get(key)
                if cq_end is None:
                    cq_end = ends[key] = self._queue_end(key)
                need = offset + size[i] > cq_end
            if not need and key_first[i + 1] > key_first[i]:  # has index keys
                end_phy, has_end = self._index_end
                need = not (offset < end_phy or (offset == end_phy and has_end))
            if need:
                return i
        return -1

    def all_held(self, view: memoryview, base: int, scan: RecordScan, start: int) -> bool:
        """True when the queues and the index hold every record from `start` on: decided
        per queue (its last record in the chunk, found in C) and from the index's end."""
        end_phy, has_end = self._index_end
        first = max(bisect.bisect_left(scan.pos, end_phy - base), start)
        if first < scan.count and has_end and base + scan.pos[first] == end_phy:
            first += 1  # the record at the index's end is indexed
        if first < scan.count and scan.key_first[scan.count] > scan.key_first[first]:
            return False  # a record past the index's end has keys
        flags = scan.sys_flag[start:]
        if any(map(operator.and_, flags, itertools.repeat(_PREPARED_OR_ROLLBACK))):
            return False  # PREPARED / ROLLBACK records: see record by record
        last_end = queue_last_ends(view, scan, start)  # per queue: its last record's end
        return all(base + end <= self._queue_end(key) for key, end in last_end.items())

    def _queue_end(self, key: tuple[bytes, int]) -> int:
        """The max physical offset of the queue of (topic bytes, queue id); -1 if none."""
        cq = self._cq_cache.get(key)
        if cq is None:
            cq = self._cqs.get(decode_utf8(key[0]), key[1])
            if cq is None:
                return -1
            self._cq_cache[key] = cq
        return cq.max_physical_offset

    def _read_index_end(self) -> tuple[int, bool]:
        if self._index is None:
            return 1 << 62, True  # no index to build: everything counts as indexed
        files = self._index.files
        if not files:
            return -1, False
        f = files[-1]
        return f.end_phy_offset, f.end_timestamp > 0


def first_lacking(
    holdings: Holdings, view: memoryview, base: int, scan: RecordScan, from_offset: int
) -> int | None:
    """The log offset of the first record of `scan` at or past `from_offset` that a
    queue or the index lacks, or None. Writes nothing."""
    i = holdings.first_lacking(view, base, scan, bisect.bisect_left(scan.pos, from_offset - base))
    return None if i < 0 else base + scan.pos[i]


def redispatch(
    log: CommitLog,
    holdings: Holdings,
    disp: Dispatcher,
    res: DispatchResult,
    span: tuple[int, int],
    progress: Progress | None = None,
) -> None:
    """Dispatch into `res` what the queues or the index lack of the records in `span`
    (from, to: from at a record; CRC not checked, the caller validated what it must):
    chunk by chunk of the record scanner's columns through the dispatcher's batch path
    (`Dispatcher.dispatch_scan`, as the dispatcher process does), a chunk they hold
    whole skipped. Re-dispatching a record they hold is harmless (`engine.dispatch`), so
    a chunk that lacks anything goes whole. `progress` after every chunk (it may raise
    `RecoveryInterrupted`); the time taken is added to `res.seconds`. O(records).
    Raises StoreIOError."""
    t0 = time.perf_counter()
    from_offset, to_offset = span
    walk = ChunkScan(
        log.queue, from_offset, check_crc=False, to_offset=to_offset, delay_ms=disp.delay_ms
    )
    try:
        for base, view, scan in walk:
            if not holdings.all_held(view, base, scan, 0):
                disp.dispatch_scan(view, base, scan, res)
                holdings.refresh_index()
            if progress is not None:
                done = base + scan.pos[scan.count - 1] + scan.size[scan.count - 1] - from_offset
                progress(Step(REDISPATCHING, done, to_offset - from_offset, walk.records))
    finally:
        res.seconds += time.perf_counter() - t0
