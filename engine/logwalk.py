"""Walks over the commit log: `RecordScan`, `ChunkScan`, and what is built on them.

`RecordScan` (`CommitLog.scan`) walks records from an offset, validating each (CRC
optional) as RocketMQ's `checkMessageAndReturnSize`, hopping BLANKs to the next segment,
and says where valid data ends and why it stopped (`ScanStop`); recovery uses it.
`ChunkScan` (`CommitLog.scan_chunks`) is the same walk through the C record scanner
(`engine.scan`), a chunk of columns at a time. Both read bytes below each segment's read
position only, from the `SegmentQueue` they are given.

Built on them: `check_records` (`CommitLog.check`'s findings on the records) and
`TailRecovery` (what `CommitLog.recover_tail` found and did).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
from collections.abc import Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Final, NamedTuple

from mqstore.engine.findings import Finding, Severity
from mqstore.engine.record import CheckStatus, RecordHeader, check_record
from mqstore.engine.record_decode import DecodedRecord, decode
from mqstore.engine.recordcodes import DELAY_LEVEL_MS, decode_utf8
from mqstore.engine.scan import RecordScan as ScannedColumns
from mqstore.engine.scan import ScanStop as RecordStop
from mqstore.engine.scan import scan_records
from mqstore.engine.segment import ReadStatus, Segment
from mqstore.engine.segment_queue import SegmentQueue

_TX_MASK: Final = 0xC
_TX_COMMIT: Final = 0x8
_CHUNK_RECORDS: Final = 8192  # records per scanner call in ChunkScan: bounded columns

QueueKey = tuple[str, int]


class ScanStop(enum.Enum):
    """Why a scan stopped; `end_offset` is then where valid data ends."""

    END_OF_DATA = "END_OF_DATA"  # zeros, or the readable end of the last segment
    BLANK_IN_LAST_SEGMENT = "BLANK_IN_LAST_SEGMENT"  # RocketMQ: ends at the BLANK itself
    CORRUPT = "CORRUPT"  # invalid bytes (reason says what)
    OFFSET_NOT_FOUND = "OFFSET_NOT_FOUND"  # from_offset is in no segment
    LIMIT = "LIMIT"  # reached to_offset


class ScannedRecord(NamedTuple):
    offset: int  # where the record starts in the log
    header: RecordHeader


def _takes_offset(sys_flag: int) -> bool:
    tx = sys_flag & _TX_MASK
    return tx == 0 or tx == _TX_COMMIT


@dataclass(eq=False)
class _LogWalk:
    """Where a walk over the log is: set while iterating, read after (`RecordScan`,
    `ChunkScan`): `end_offset` (from `from_offset` on), `stop`, `reason`, `records`."""

    _queue: SegmentQueue
    from_offset: int
    _: KW_ONLY
    check_crc: bool
    to_offset: int
    # the store's delay table: ChunkScan's schedule-topic tags codes (engine.scan)
    delay_ms: tuple[int, ...] = DELAY_LEVEL_MS
    stop: ScanStop = field(default=ScanStop.END_OF_DATA, init=False)
    reason: str = field(default="", init=False)
    records: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.end_offset = self.from_offset

    def _end(self, offset: int, stop: ScanStop, reason: str = "") -> None:
        self.end_offset = offset
        self.stop = stop
        self.reason = reason


class RecordScan(_LogWalk):
    """A validating walk over the log; iterate it, then read `end_offset` / `stop`.

    Yields a `ScannedRecord` per valid message record (BLANKs are hopped, not yielded).
    After iteration: `end_offset` is where valid data ends, `stop` why it stopped,
    `reason` the corrupt record's fault, `records` how many were yielded. Holds one
    segment reference while suspended; abandon it with `close()` or by exhausting it.
    """

    def __init__(
        self,
        queue: SegmentQueue,
        from_offset: int,
        *,
        check_crc: bool,
        read_body: bool,
        to_offset: int,
    ) -> None:
        super().__init__(queue, from_offset, check_crc=check_crc, to_offset=to_offset)
        self.read_body = read_body
        self._gen: Iterator[tuple[int, RecordHeader, memoryview, int]] | None = None

    def __iter__(self) -> Iterator[ScannedRecord]:
        for offset, header, _view, _pos in self._walk():
            yield ScannedRecord(offset, header)

    def decoded(self) -> Iterator[DecodedRecord]:
        """Iterate decoded records instead (`engine.record.decode`); same walk, same
        `end_offset` / `stop` afterwards."""
        for _offset, _header, view, pos in self._walk():
            yield decode(view, pos)

    def _walk(self) -> Iterator[tuple[int, RecordHeader, memoryview, int]]:
        queue = self._queue
        offset = self.from_offset
        seg = queue.find(offset)
        if seg is None:
            self.end_offset = offset
            at_end = offset == queue.max_offset() or (len(queue) == 0 and offset == 0)
            self.stop = ScanStop.END_OF_DATA if at_end else ScanStop.OFFSET_NOT_FOUND
            return
        pos = offset - seg.start_offset
        while True:
            read = seg.read_position
            with seg.select(0, read) as sl:
                if sl.status is not ReadStatus.OK:
                    self._end(seg.start_offset + pos, ScanStop.CORRUPT, f"segment {sl.status}")
                    return
                view = sl.view
                next_seg: Segment | None = None
                while next_seg is None:
                    here = seg.start_offset + pos
                    if here >= self.to_offset:
                        self._end(here, ScanStop.LIMIT)
                        return
                    if pos >= read:
                        nxt = queue.find(seg.start_offset + seg.size_bytes)
                        if pos < seg.size_bytes or nxt is None:
                            self._end(here, ScanStop.END_OF_DATA)
                            return
                        next_seg = nxt
                        break
                    h = check_record(
                        view, pos, check_crc=self.check_crc, read_body=self.read_body, limit=read
                    )
                    if h.status is CheckStatus.OK:
                        self.records += 1
                        yield here, h, view, pos
                        pos += h.size
                    elif h.status is CheckStatus.BLANK:
                        nxt = queue.find(seg.start_offset + seg.size_bytes)
                        if nxt is None:
                            self._end(here, ScanStop.BLANK_IN_LAST_SEGMENT)
                            return
                        next_seg = nxt
                    else:
                        head = bytes(view[pos : pos + 8])
                        if head == bytes(len(head)):
                            self._end(here, ScanStop.END_OF_DATA)
                        else:
                            self._end(here, ScanStop.CORRUPT, h.reason)
                        return
            seg, pos = next_seg, 0


class LogChunk(NamedTuple):
    """Records of one segment, as columns: `scan.pos[i]` is a position in `view`, whose
    first byte is commit-log offset `base`. The view is valid until the walk moves on."""

    base: int
    view: memoryview
    scan: ScannedColumns


def _head(scan: ScannedColumns, n: int) -> ScannedColumns:
    """The first `n` records of `scan` (the walk stops LIMIT after them)."""
    cols = {f.name: getattr(scan, f.name)[:n] for f in dataclasses.fields(scan)[5:-2]}
    return dataclasses.replace(
        scan, count=n, stop=RecordStop.LIMIT, stop_pos=scan.pos[n], reason="", blank_size=0,
        key_first=scan.key_first[: n + 1], key_hash=scan.key_hash[: scan.key_first[n]], **cols,
    )  # fmt: skip


class ChunkScan(_LogWalk):
    """`RecordScan`'s walk through the record scanner (`engine.scan`, in C), a chunk of
    columns at a time: iterate it for `LogChunk`s, then read `end_offset` / `stop`.

    As `RecordScan`: the same records, and after iteration `end_offset` is where valid
    data ends, `stop` why, `reason` the corrupt record's fault, `records` how many were
    yielded. Holds one segment view while suspended. O(bytes) for the CRC, in C.
    """

    def __iter__(self) -> Iterator[LogChunk]:
        queue = self._queue
        seg = queue.find(self.from_offset)
        if seg is None:
            at_end = self.from_offset == queue.max_offset() or (
                len(queue) == 0 and self.from_offset == 0
            )
            self._end(
                self.from_offset, ScanStop.END_OF_DATA if at_end else ScanStop.OFFSET_NOT_FOUND
            )
            return
        pos = self.from_offset - seg.start_offset
        while True:
            read = seg.read_position
            base = seg.start_offset
            with seg.select(0, read) as sl:
                if sl.status is not ReadStatus.OK:
                    self._end(base + pos, ScanStop.CORRUPT, f"segment {sl.status}")
                    return
                while True:
                    if base + pos >= self.to_offset:
                        self._end(base + pos, ScanStop.LIMIT)
                        return
                    if pos >= read:
                        break
                    scan = scan_records(
                        sl.view,
                        pos,
                        read,
                        check_crc=self.check_crc,
                        max_records=_CHUNK_RECORDS,
                        delay_ms=self.delay_ms,
                    )
                    n = bisect.bisect_left(scan.pos, self.to_offset - base)
                    if n < scan.count:  # records from to_offset on are not this walk's
                        scan = _head(scan, n)
                    if scan.count:
                        self.records += scan.count
                        yield LogChunk(base, sl.view, scan)
                    pos = scan.stop_pos
                    if scan.stop is RecordStop.LIMIT:
                        continue
                    if base + pos >= self.to_offset:
                        self._end(base + pos, ScanStop.LIMIT)
                        return
                    if scan.stop is RecordStop.BLANK:
                        break
                    head = bytes(sl.view[pos : pos + 8])
                    if head == bytes(len(head)):
                        self._end(base + pos, ScanStop.END_OF_DATA)
                    else:
                        self._end(base + pos, ScanStop.CORRUPT, scan.reason)
                    return
            nxt = queue.find(base + seg.size_bytes)
            if nxt is None or (pos >= read and pos < seg.size_bytes):
                blank = pos < read
                self._end(
                    base + pos, ScanStop.BLANK_IN_LAST_SEGMENT if blank else ScanStop.END_OF_DATA
                )
                return
            seg, pos = nxt, 0


def _check_chunk(
    chunk: LogChunk,
    path: str | None,
    seen: dict[QueueKey, int],
    deleted: Mapping[str, int],
) -> list[Finding]:
    """`CommitLog.check`'s findings on one chunk's records: a stored physical offset that
    is not the record's, a queue offset that does not follow the (topic, queue)'s last in
    `seen` (updated). A record of a deleted topic below its end offset (`deleted`,
    `engine.deleted_topics`) is in no queue: its queue offsets are not followed, and the
    topic's records put after the deletion start again from queue offset 0."""
    out: list[Finding] = []
    sc, view = chunk.scan, chunk.view
    topics: dict[bytes, str] = {}
    for i in range(sc.count):
        offset = chunk.base + sc.pos[i]
        if sc.physical_offset[i] != offset:
            what = f"record says physical offset {sc.physical_offset[i]}"
            out.append(Finding(Severity.ERROR, what, path, offset))
        if _takes_offset(sc.sys_flag[i]):
            raw = view[sc.topic_pos[i] : sc.topic_pos[i] + sc.topic_len[i]].tobytes()
            topic = topics.get(raw)
            if topic is None:
                topic = topics[raw] = decode_utf8(raw)
            if offset < deleted.get(topic, -1):
                continue
            key, qo = (topic, sc.queue_id[i]), sc.queue_offset[i]
            prev = seen.get(key)
            if prev is not None and qo != prev + 1:
                what = f"{key}: queue offset {qo} follows {prev}"
                out.append(Finding(Severity.ERROR, what, path, offset))
            seen[key] = qo
    return out


@dataclass(frozen=True, slots=True)
class TailRecovery:
    """What `recover_tail` found and did."""

    end_offset: int
    stop: ScanStop
    reason: str
    records: int
    segments_deleted: int
    bytes_zeroed: int


def check_records(
    queue: SegmentQueue,
    offsets: Mapping[QueueKey, int],
    deleted: Mapping[str, int] | None = None,
) -> list[Finding]:
    """Every record of the log (CRC on): stored physical offsets, queue offsets rising by
    one per (topic, queue), the next offsets in `offsets` ahead of them, and where valid
    data ends against the readable end. `deleted`: {topic: end offset} of the deleted
    topics (`engine.deleted_topics`), whose records below it are in no queue. O(log size)."""
    out: list[Finding] = []
    if len(queue) == 0:
        return out
    sc = ChunkScan(queue, max(queue.min_offset(), 0), check_crc=True, to_offset=1 << 62)
    seen: dict[QueueKey, int] = {}
    gone = deleted or {}
    for chunk in sc:
        first = queue.find(chunk.base)
        out.extend(_check_chunk(chunk, first.path if first is not None else None, seen, gone))
    if sc.stop is ScanStop.CORRUPT:
        seg = queue.find(sc.end_offset)
        out.append(
            Finding(
                Severity.ERROR,
                f"corrupt record: {sc.reason}",
                seg.path if seg else None,
                sc.end_offset,
            )
        )
    elif sc.stop is ScanStop.OFFSET_NOT_FOUND:
        out.append(Finding(Severity.ERROR, "the log's first offset is in no segment"))
    elif sc.end_offset < queue.max_offset() and sc.stop is not ScanStop.BLANK_IN_LAST_SEGMENT:
        seg = queue.find(sc.end_offset)
        rest = b""
        if seg is not None:
            rest = seg.read_bytes(sc.end_offset - seg.start_offset, seg.size_bytes)
        if rest.count(0) == len(rest):
            out.append(
                Finding(
                    Severity.INFO,
                    f"valid data ends at {sc.end_offset}; the remaining {len(rest)} "
                    "readable bytes of the segment are zeros",
                    seg.path if seg else None,
                    sc.end_offset,
                )
            )
        else:
            out.append(
                Finding(
                    Severity.ERROR,
                    f"dirty tail: {queue.max_offset() - sc.end_offset} readable bytes "
                    "after the last valid record",
                    seg.path if seg else None,
                    sc.end_offset,
                )
            )
    for key, last_qo in seen.items():
        nxt = offsets.get(key)
        if nxt is not None and nxt <= last_qo:
            out.append(
                Finding(
                    Severity.ERROR,
                    f"{key}: next queue offset {nxt} is not past {last_qo} in the log",
                )
            )
    return out
