"""Follow a live store's commit log from another process, without a dispatcher.

`LogTail` decodes the records of `<store>/commitlog` from a physical offset up to a
limit the caller gives (the flushed offset under SYNC_FLUSH, the committed one under
ASYNC_FLUSH: below it every record is complete in the files). Fillers are skipped.
`LogQueues` builds, from a `LogTail`, an in-memory index per (topic, queue id) and
answers `get_messages` like `engine.reader.StoreReader` does: the consumer's read path
while the runtime runs no dispatcher (consume queues are not written yet).

Both open the segment files read-only, pick up segments created later, and never write.
Not thread-safe: one per thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from mqstore.engine.commitlog import CommitLog
from mqstore.engine.filler import is_filler
from mqstore.engine.logwalk import ScanStop
from mqstore.engine.reader import GetResult, GetStatus
from mqstore.engine.record import DecodedRecord, RecordFields
from mqstore.engine.scan_decode import read_records
from mqstore.engine.storedir import list_segments

_TX_MASK = 0xC
_TX_COMMIT = 0x8


def _segment_size(store_dir: str) -> int | None:
    for seg in list_segments(store_dir):
        if seg.size_bytes > 0:
            return seg.size_bytes
    return None


class LogTail:
    """Decode records `[position, limit)` of a live log, a bit more on every `poll`."""

    def __init__(self, store_dir: str | os.PathLike[str], from_offset: int | None = None) -> None:
        self.store_dir = os.fspath(store_dir)
        self._log: CommitLog | None = None
        self.position = from_offset
        self.records = 0
        self.fillers = 0

    def _open(self) -> CommitLog | None:
        if self._log is None:
            size = _segment_size(self.store_dir)
            if size is None:
                return None
            self._log = CommitLog.open(
                os.path.join(self.store_dir, "commitlog"), size, read_only=True
            )
            if self.position is None:
                self.position = max(self._log.min_offset(), 0)
        return self._log

    def poll(self, limit: int, max_records: int = 1 << 30) -> Iterator[DecodedRecord]:
        """Records ending at or below `limit` from the current position (fillers
        skipped; at most `max_records`); the position advances past what is yielded."""
        log = self._open()
        if log is None or self.position is None or self.position >= limit:
            return
        if log.queue.find(self.position) is None or log.queue.max_offset() < limit:
            log.queue.refresh()
        n = 0
        sc = log.scan(self.position, check_crc=False, to_offset=limit)
        gen = sc.decoded()
        try:
            for rec in gen:
                end = rec.physical_offset + rec.size
                if end > limit:
                    self.position = rec.physical_offset
                    return
                self.position = end
                if is_filler(rec):
                    self.fillers += 1
                    continue
                self.records += 1
                n += 1
                yield rec
                if n >= max_records:
                    return
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()  # release the segment the walk holds
        if sc.stop is ScanStop.CORRUPT:
            raise ValueError(f"corrupt record at {sc.end_offset}: {sc.reason}")
        if sc.end_offset > self.position:
            self.position = sc.end_offset  # a BLANK hopped at the end

    def read_many(self, offsets: Sequence[int]) -> dict[int, RecordFields]:
        """The valid records (CRC checked) starting at `offsets`, by offset, decoded
        through the record scanner (`engine.scan_decode.read_records`)."""
        log = self._open()
        if log is None:
            return {}
        return read_records(log.queue, [(off, 0) for off in offsets], 1 << 62)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class LogQueues:
    """Per-queue physical offsets, indexed from the log by a `LogTail`; reads like
    `StoreReader.get_messages` (no tag filter, no byte cap)."""

    def __init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.tail = LogTail(store_dir)
        self._queues: dict[tuple[str, int], list[int]] = {}

    def catch_up(self, limit: int) -> int:
        """Index every record up to `limit`; returns how many were new."""
        n = 0
        for rec in self.tail.poll(limit):
            tx = rec.sys_flag & _TX_MASK
            if not (tx == 0 or tx == _TX_COMMIT):
                continue
            q = self._queues.setdefault((rec.topic, rec.queue_id), [])
            if rec.queue_offset == len(q):
                q.append(rec.physical_offset)
            elif rec.queue_offset > len(q):  # fillers before it were skipped: keep dense
                q.extend([-1] * (rec.queue_offset - len(q)))
                q.append(rec.physical_offset)
            n += 1
        return n

    def max_offset(self, topic: str, queue_id: int) -> int:
        return len(self._queues.get((topic, queue_id), ()))

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult:
        q = self._queues.get((topic, queue_id))
        if q is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        hi = len(q)
        if offset < 0:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, 0, 0, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, 0, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, 0, hi)
        res = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, 0, hi)
        while res.next_offset < hi and len(res.messages) < max_count:
            units = q[res.next_offset : res.next_offset + max_count - len(res.messages)]
            recs = self.tail.read_many([phys for phys in units if phys >= 0])
            for phys in units:
                res.next_offset += 1
                rec = recs.get(phys)
                if rec is None:
                    if phys >= 0 and not res.messages:
                        res.status = GetStatus.MESSAGE_WAS_REMOVING
                    continue
                res.messages.append(rec)
                res.status = GetStatus.FOUND
        return res

    def close(self) -> None:
        self.tail.close()
