"""The record scanner: walk a range of a commit-log segment and return every record's
header fields as columns (compact native arrays), not one Python object per record.

Everything that reads the log in bulk (the dispatcher, recovery, reads, the Spark source,
`mqstore check` and `dump`) walks with `scan_records`: the C twin
`mqstore._native.scan_records` (engine/native/mqs_scan.c), which walks without the GIL
while it holds the buffer. `scan_records_py` is the reference: `engine.record.check_record`
record by record; tests/native/test_scan_diff.py compares the two column by column. A
record the scanner accepts is exactly one `check_record` accepts (same CRC rule, same
torn-end rule), and where it stops, `reason` is `check_record`'s.

Columns are memoryviews of native-endian arrays, read-only, `len == count`:
`scan.pos[i]` is record i's start in `buf`. Record i's index-key hashes are
`key_hash[key_first[i]:key_first[i + 1]]`: `indexfile.key_hash(build_key(topic, k))`
for k in [UNIQ_KEY] + the non-empty KEYS tokens split on ' ', in
`IndexService.build_index`'s order; none for a filler. The ROLLBACK and
already-indexed rules stay the dispatcher's.
"""

from __future__ import annotations

import enum
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeAlias

from mqstore import _native
from mqstore.engine import filler, indexfile
from mqstore.engine.record import (
    MESSAGE_MAGIC_CODE,
    Buffer,
    CheckStatus,
    RecordHeader,
    check_record,
)
from mqstore.engine.recordcodes import DELAY_LEVEL_MS

BIT_BODY_CRC_OK: Final = 0x1  # `bits`: the body CRC matched (or was not checked)
BIT_FILLER: Final = 0x2  # `bits`: `engine.filler.is_filler` says the record is a filler

# `ScanSummary.flags`: what makes a batch other than plain messages for the dispatcher.
SUMMARY_FILLER: Final = 0x1  # a record is a filler
SUMMARY_TX: Final = 0x2  # a PREPARED or ROLLBACK transaction part (sys_flag & 0x4)
SUMMARY_NEG_QUEUE: Final = 0x4  # a negative queue id
SUMMARY_MAX_BUCKETS: Final = 64
SummaryColumn: TypeAlias = "Buffer | array[int]"  # a scan column, an array or its bytes


class ScanStop(enum.IntEnum):
    """Why a scan stopped."""

    LIMIT = 0  # reached `limit` or `max_records`; stop_pos is where the next record starts
    BLANK = 1  # a BLANK (end-of-segment) record starts at stop_pos; blank_size = its TOTALSIZE
    CORRUPT = 2  # the record at stop_pos fails check_record (zeros / illegal magic = end
    # of written data, or damage); `reason` is check_record's reason text


@dataclass(slots=True)  # not frozen: a frozen init of 24 fields cost ~2 µs a scan
class RecordScan:
    """The records a scan accepted, as columns, and where and why it stopped. Read
    it, never assign to it (one is made per dispatch round, so it is not frozen)."""

    count: int
    stop: ScanStop
    stop_pos: int
    reason: str
    blank_size: int
    pos: memoryview  # 'q' record start, a position in `buf`
    size: memoryview  # 'i' TOTALSIZE
    queue_id: memoryview  # 'i'
    queue_offset: memoryview  # 'q'
    physical_offset: memoryview  # 'q' the PHYSICALOFFSET field as stored
    sys_flag: memoryview  # 'i'
    flag: memoryview  # 'i'
    born_timestamp: memoryview  # 'q'
    store_timestamp: memoryview  # 'q'
    tags_code: memoryview  # 'q' exactly what check_record's tags_code is
    body_pos: memoryview  # 'q' position in buf
    body_len: memoryview  # 'i'
    topic_pos: memoryview  # 'q'
    topic_len: memoryview  # 'i'
    props_pos: memoryview  # 'q'
    props_len: memoryview  # 'i'
    bits: memoryview  # 'B' BIT_BODY_CRC_OK (1 when check_crc is False), BIT_FILLER
    key_first: memoryview  # 'i' len count + 1
    key_hash: memoryview  # 'i'


# Column name -> array typecode, in RecordScan's order (key_first / key_hash apart).
ColumnCode = Literal["q", "i", "B"]  # array typecodes: int64, int32, uint8

COLUMNS: Final[tuple[tuple[str, ColumnCode], ...]] = (
    ("pos", "q"), ("size", "i"), ("queue_id", "i"), ("queue_offset", "q"),
    ("physical_offset", "q"), ("sys_flag", "i"), ("flag", "i"), ("born_timestamp", "q"),
    ("store_timestamp", "q"), ("tags_code", "q"), ("body_pos", "q"), ("body_len", "i"),
    ("topic_pos", "q"), ("topic_len", "i"), ("props_pos", "q"), ("props_len", "i"),
    ("bits", "B"),
)  # fmt: skip

_ROW_COLUMNS: Final = tuple(c for c in COLUMNS if c[0] != "tags_code")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")


def _record_scan(
    count: int, stop: ScanStop, stop_pos: int, reason: str, blank_size: int, cols: list[memoryview]
) -> RecordScan:
    """A RecordScan from its columns in COLUMNS' order, then key_first and key_hash."""
    (
        pos, size, queue_id, queue_offset, physical_offset, sys_flag, flag, born_timestamp,
        store_timestamp, tags_code, body_pos, body_len, topic_pos, topic_len, props_pos,
        props_len, bits, key_first, key_hash,
    ) = cols  # fmt: skip
    return RecordScan(
        count, stop, stop_pos, reason, blank_size, pos, size, queue_id, queue_offset,
        physical_offset, sys_flag, flag, born_timestamp, store_timestamp, tags_code, body_pos,
        body_len, topic_pos, topic_len, props_pos, props_len, bits, key_first, key_hash,
    )  # fmt: skip


def _wrap64(code: int) -> int:
    """A tags code as the 'q' column holds it: the schedule topic's delivery time is a
    long addition in RocketMQ, which wraps (check_record's int does not)."""
    return (code + (1 << 63)) % (1 << 64) - (1 << 63)


def _readonly(a: array[int]) -> memoryview:
    return memoryview(a).toreadonly()


def _spans(buf: Buffer, h: RecordHeader) -> tuple[int, int, int, int]:
    """(topic_pos, topic_len, props_pos, props_len) of an accepted record. A negative
    stored length reads as 0, as check_record counts it."""
    p = h.body_pos + h.body_len
    if h.magic == MESSAGE_MAGIC_CODE:
        topic_len = _I8.unpack_from(buf, p)[0]
        p += 1
    else:
        topic_len = _I16.unpack_from(buf, p)[0]
        p += 2
    topic_len = max(topic_len, 0)
    props_pos = p + topic_len + 2
    props_len = max(_I16.unpack_from(buf, props_pos - 2)[0], 0)
    return p, topic_len, props_pos, props_len


def _key_hashes(h: RecordHeader) -> list[int]:
    """The index-key hashes of a message, in `IndexService.build_index`'s order."""
    keys = [h.uniq_key] if h.uniq_key else []
    if h.keys:
        keys.extend(k for k in h.keys.split(" ") if k)
    return [indexfile.key_hash(indexfile.build_key(h.topic, k)) for k in keys]


def _end(buf: Buffer, pos: int, limit: int) -> int:
    """The scan's end: `limit` within the buffer (negative: the buffer's length)."""
    if pos < 0:
        raise ValueError(f"scan position {pos} is negative")
    return len(buf) if limit < 0 else min(limit, len(buf))


def record_step_py(buf: Buffer, pos: int, limit: int, want: int) -> int:
    """From the record boundary `pos`, follow each record's TOTALSIZE (its first 4 bytes,
    big-endian) to the first record boundary at or past `want`; the last boundary reached
    when a size is not positive or the record runs past `limit` (`pos` itself if the
    first does). Only sizes are read, nothing checked: for bytes known to be whole
    records (the committer's published range, `ipc.commit`). `_native.record_step` is
    its C twin (tests/native/test_record_step_diff.py). ValueError unless
    0 <= pos <= limit <= len(buf)."""
    if not 0 <= pos <= limit <= len(memoryview(buf)):
        raise ValueError("record_step: need 0 <= pos <= limit <= len(buf)")
    while pos < want and limit - pos >= 4:
        size = int(_I32_BE.unpack_from(buf, pos)[0])
        if size <= 0 or size > limit - pos:
            break
        pos += size
    return pos


_I32_BE: Final = struct.Struct(">i")


def scan_records_py(
    buf: Buffer,
    pos: int,
    limit: int,
    *,
    check_crc: bool = True,
    max_records: int = -1,
    delay_ms: tuple[int, ...] = DELAY_LEVEL_MS,
) -> RecordScan:
    """The reference scanner: `check_record` at `pos`, then at each next record, until
    `limit` (negative: the buffer's end), `max_records` (negative: no cap), a BLANK or a
    record check_record rejects. `delay_ms` is the store's delay table (check_record's).
    Never raises on bad bytes; ValueError if `pos` < 0 or `delay_ms` is not 1 to 64
    levels."""
    delay_table(delay_ms)
    end = _end(buf, pos, limit)
    cols = {name: array(code) for name, code in COLUMNS}
    key_first, key_hash = array("i", [0]), array("i")
    stop, reason, blank_size = ScanStop.LIMIT, "", 0
    p = pos
    while p < end and max_records != len(cols["pos"]):
        h = check_record(buf, p, check_crc=check_crc, limit=end, delay_ms=delay_ms)
        if h.status is not CheckStatus.OK:
            if h.status is CheckStatus.BLANK:
                stop, blank_size = ScanStop.BLANK, h.size
            else:
                stop, reason = ScanStop.CORRUPT, h.reason
            break
        cols["tags_code"].append(_wrap64(h.tags_code))
        is_filler = filler.is_filler(h)
        topic_pos, topic_len, props_pos, props_len = _spans(buf, h)
        row = (
            p, h.size, h.queue_id, h.queue_offset, h.physical_offset, h.sys_flag, h.flag,
            h.born_timestamp, h.store_timestamp, h.body_pos, h.body_len,
            topic_pos, topic_len, props_pos, props_len,
            (BIT_BODY_CRC_OK if h.body_crc_ok else 0) | (BIT_FILLER if is_filler else 0),
        )  # fmt: skip
        for (name, _code), value in zip(_ROW_COLUMNS, row, strict=True):
            cols[name].append(value)
        if not is_filler:
            key_hash.extend(_key_hashes(h))
        key_first.append(len(key_hash))
        p += h.size
    columns = [_readonly(cols[name]) for name, _code in COLUMNS]
    columns += [_readonly(key_first), _readonly(key_hash)]
    return _record_scan(len(cols["pos"]), stop, p, reason, blank_size, columns)


def scan_records(
    buf: Buffer,
    pos: int,
    limit: int,
    *,
    check_crc: bool = True,
    max_records: int = -1,
    delay_ms: tuple[int, ...] = DELAY_LEVEL_MS,
) -> RecordScan:
    """Walk whole records in buf[pos:limit]. Never raises on bad bytes (stops CORRUPT).

    The arguments are `scan_records_py`'s, and so is the answer, from C: O(bytes) for the
    CRC, O(records) for the rest; the GIL is released while walking. Raises MemoryError
    when the columns do not fit (cap them with `max_records`), ValueError if `pos` < 0
    or `delay_ms` is not 1 to 64 levels.
    """
    count, stop, stop_pos, blank_size, raw, fixups = _native.scan_records(
        buf,
        pos,
        limit,
        check_crc=check_crc,
        max_records=max_records,
        delay_ms=None if delay_ms is DELAY_LEVEL_MS else delay_table(delay_ms),
    )
    # (map over C callables: no Python frame per column, a fixed cost of every scan)
    cols = list(map(_cast, map(_view, raw), _CODES))
    if fixups:
        cols[_TAGS] = _fix_tags(buf, memoryview(fixups).cast("q"), cols, check_crc, delay_ms)
    reason = ""
    if stop == ScanStop.CORRUPT:  # the reason's text is check_record's, whatever it is
        end = len(buf) if limit < 0 else min(limit, len(buf))
        reason = check_record(buf, stop_pos, check_crc=check_crc, limit=end).reason
    return _record_scan(count, ScanStop(stop), stop_pos, reason, blank_size, cols)


_TAGS: Final = [name for name, _code in COLUMNS].index("tags_code")
_view: Final[Callable[[bytes], memoryview]] = memoryview
_cast: Final = memoryview.cast
_CODES: Final[list[ColumnCode]] = [code for _name, code in COLUMNS] + ["i", "i"]


def _fix_tags(
    buf: Buffer,
    fixups: memoryview,
    cols: list[memoryview],
    check_crc: bool,
    delay_ms: tuple[int, ...],
) -> memoryview:
    """The tags codes C leaves to the reference (a schedule-topic DELAY that is not
    ASCII, which Python's int() may read as Unicode digits)."""
    tags = array("q", cols[_TAGS])
    for i in fixups:
        h = check_record(buf, cols[0][i], check_crc=check_crc, delay_ms=delay_ms)
        tags[i] = _wrap64(h.tags_code)
    return _readonly(tags)


_DELAY_TABLES: dict[tuple[int, ...], bytes] = {}


def delay_table(delay_ms: tuple[int, ...]) -> bytes:
    """`delay_ms` as the C scanner and the dispatcher's C round take it (native int64s),
    checked and cached."""
    got = _DELAY_TABLES.get(delay_ms)
    if got is None:
        if not 1 <= len(delay_ms) <= 64 or not all(
            type(d) is int and 0 <= d < 1 << 62 for d in delay_ms
        ):
            raise ValueError("delay_ms must be 1 to 64 delays in ms (0 <= each < 2**62)")
        got = array("q", delay_ms).tobytes()
        if len(_DELAY_TABLES) >= 16:
            _DELAY_TABLES.clear()
        _DELAY_TABLES[delay_ms] = got
    return got


@dataclass(frozen=True, slots=True)
class ScanSummary:
    """What the dispatcher asks of every record of a batch (`scan_summary`)."""

    flags: int  # SUMMARY_* bits: 0 when every record is a plain message of a queue
    lag_sum_ms: int  # the lags' sum
    lag_counts: tuple[int, ...]  # records per lag bucket


class SummaryColumns(Protocol):
    """The columns `scan_summary` reads: a RecordScan's, or any object's with these."""

    @property
    def store_timestamp(self) -> SummaryColumn: ...  # 'q'
    @property
    def bits(self) -> SummaryColumn: ...  # 'B'
    @property
    def sys_flag(self) -> SummaryColumn: ...  # 'i'
    @property
    def queue_id(self) -> SummaryColumn: ...  # 'i'


def _summary_columns(sc: SummaryColumns) -> list[memoryview]:
    """The columns as bytes views of exactly n items each (n: the first's), as C checks."""
    cols = (
        ("store_timestamp", sc.store_timestamp, 8), ("bits", sc.bits, 1),
        ("sys_flag", sc.sys_flag, 4), ("queue_id", sc.queue_id, 4),
    )  # fmt: skip
    out = [memoryview(b).cast("B") for _name, b, _width in cols]
    n = len(out[0]) // 8
    for (name, _b, width), v in zip(cols, out, strict=True):
        if len(v) != n * width:
            raise ValueError(f"{name} must hold {n} items of {width} bytes")
    return out


def scan_summary_py(sc: SummaryColumns, now_ms: int, buckets: int) -> ScanSummary:
    """The reference pass over a batch's columns (native-endian, of one length): `flags`
    says whether any record is a filler, a PREPARED / ROLLBACK transaction part or of a
    negative queue id; with `buckets` > 0, each record's lag `max(0, now_ms -
    store_timestamp)` counts in bucket `min(lag.bit_length(), buckets - 1)` and adds to
    `lag_sum_ms`. ValueError for other lengths or buckets outside 0..SUMMARY_MAX_BUCKETS."""
    if not 0 <= buckets <= SUMMARY_MAX_BUCKETS:
        raise ValueError(f"buckets must be from 0 to {SUMMARY_MAX_BUCKETS}")
    ts_b, bits_b, sf_b, q_b = _summary_columns(sc)
    flags = 0
    if any(b & BIT_FILLER for b in bits_b):
        flags |= SUMMARY_FILLER
    if any(sf & 0x4 for sf in sf_b.cast("i")):
        flags |= SUMMARY_TX
    if any(q < 0 for q in q_b.cast("i")):
        flags |= SUMMARY_NEG_QUEUE
    counts = [0] * buckets
    total = 0
    if buckets:
        for ts in ts_b.cast("q"):
            lag = max(0, now_ms - ts)
            total += lag
            counts[min(lag.bit_length(), buckets - 1)] += 1
    return ScanSummary(flags, total, tuple(counts))


def scan_summary(sc: SummaryColumns, now_ms: int, buckets: int) -> ScanSummary:
    """`scan_summary_py`, in C (one pass, no Python object per record)."""
    flags, total, counts = _native.scan_summary(
        sc.store_timestamp, sc.bits, sc.sys_flag, sc.queue_id, now_ms, buckets
    )
    return ScanSummary(flags, total, counts)
