"""Read one split of a commit-log segment into Arrow record batches.

A split is a byte range `[begin, end)` of one segment file. It owns the records that
START inside it; the last of them may run past `end`, so the split reads up to one
maximal record beyond it.

Finding the first record. The segment's first byte always starts a record. Elsewhere a
split looks for a *sync point*: a message magic code at +4 whose own PHYSICALOFFSET (at
+28) equals its position and which passes the engine's structural check; or a BLANK
magic at +4 whose TOTALSIZE is exactly the rest of the file (the end of the segment).
Then it walks the chain (`pos += TOTALSIZE`), checking every record.

Bytes after a BLANK are stale (RocketMQ leaves old pool data there) and may hold whole
old records whose offsets look right. A BLANK is shorter than one maximal record plus 8
bytes (`blank_bound`), so it lies in the last `blank_bound` bytes of the file. A split
that begins there therefore does not trust a sync point it finds: it walks from the
first sync point at or after `file_size - blank_bound`, which is still before any BLANK.

Damage. A record that fails its checks ends the chain; the walk resumes at the next sync
point (so a split that begins inside a damaged range finds the same next record as a
whole-file read). Under `include_corrupt`, the split that owns the first bad byte also
yields one row for the unreadable range, up to the next sync point, or to the end of the
readable bytes unless they are all zeros (the unwritten end of the last segment is not
damage). A record cut by a live store's flushed offset is not damage: it is not there yet.
A damaged record reached from the split before, with no sync point between that split's
end and it (a torn last record), is found by no walk of the split it lies in: the split
that walked into it reports it (`_orphaned`), so the range is one row whatever the splits.

Walking. `engine.scan.scan_records` (the record scanner, in C) walks up to `batch_rows`
records at a time and checks each one as `engine.record.check_record` does, body CRC
included. On top of that a record must state its own PHYSICALOFFSET and be no longer
than `max_record_bytes`. A record whose only fault is its body CRC ends the scanner's
walk; it is a row only under `include_corrupt`, and the walk goes on after it.

Who may call: `pipeline.source` on executors, tests and the benchmark. Cost: one ranged
read of the split plus one maximal record, the scanner's walk, then bulk decoding
(`pipeline.columnar`): a fixed number of Python calls per batch, none per record.
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from mqstore.engine import record as rec
from mqstore.engine.scan import RecordScan, ScanStop, scan_records
from mqstore.pipeline import columnar, storefs
from mqstore.pipeline.columnar import NO_FILTER, RecordFilter
from mqstore.pipeline.schema import COLUMN_NAMES

DEFAULT_MAX_RECORD_BYTES = rec.DEFAULT_MAX_MESSAGE_SIZE + rec.RECORD_SIZE_SLACK
DEFAULT_BATCH_ROWS = 16384
_TAIL_CHUNK_BYTES = 8 * 1024 * 1024

_II = struct.Struct(">iI")
_I64 = struct.Struct(">q")
_SYNC = re.compile(rb"\xda\xa3\x20[\xa7\xab]|\xcb\xd4\x31\x94", re.DOTALL)
_BLANK_FIRST_BYTE = 0xCB
_MESSAGE_MAGICS = (rec.MESSAGE_MAGIC_CODE, rec.MESSAGE_MAGIC_CODE_V2)
_MIN_RECORD_BYTES = rec.record_length(0, 0, 0)


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """The bytes `[begin, end)` (file positions) of one segment that a task owns."""

    path: str
    segment_start: int
    file_size_bytes: int
    readable_bytes: int
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class ScanOptions:
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    batch_rows: int = DEFAULT_BATCH_ROWS
    include_corrupt: bool = False
    # the columns to build, in this order (those the query reads, when Spark prunes)
    columns: tuple[str, ...] = COLUMN_NAMES

    @property
    def blank_bound(self) -> int:
        """A BLANK (and the stale bytes after it) fits in this many bytes at a file's end."""
        return self.max_record_bytes + rec.END_FILE_MIN_BLANK_LENGTH


class Stop(enum.Enum):
    MORE = "more"  # `batch_rows` records read; the walk goes on from here
    OWNED_END = "owned end"  # the next record starts at or after the split's end
    BLANK = "blank"  # the segment's end-of-file record
    CUT = "cut"  # a record runs past the readable bytes
    BAD_CRC = "bad crc"  # a whole record whose body CRC does not match
    BROKEN = "broken"  # the bytes here are not a sound record


@dataclass(frozen=True, slots=True)
class SyncPoint:
    pos: int  # buffer position
    blank: bool


class Window:
    """A buffer of file bytes `[file_pos, file_pos + len(buf))` of one segment."""

    def __init__(self, spec: SplitSpec, file_pos: int, buf: bytes | memoryview) -> None:
        self.spec = spec
        self.file_pos = file_pos
        self.buf = buf
        self.base = spec.segment_start + file_pos  # commit-log offset of buf[0]
        self.rest_of_file = spec.file_size_bytes - file_pos  # a BLANK here has this size

    def find_sync(self, frm: int, stop: int) -> SyncPoint | None:
        """The first sync point at buffer position p, frm <= p < stop."""
        buf = self.buf
        end = min(stop + 8, len(buf))
        for m in _SYNC.finditer(buf, max(frm, 0) + 4, end):
            q = m.start() - 4
            if buf[m.start()] == _BLANK_FIRST_BYTE:
                if _II.unpack_from(buf, q)[0] == self.rest_of_file - q:
                    return SyncPoint(q, True)
                continue
            po = q + rec.POS_PHYSICALOFFSET  # a record states its own commit-log offset
            if po + 8 > len(buf) or _I64.unpack_from(buf, po)[0] != self.base + q:
                continue
            h = rec.check_record(buf, q, check_crc=False, read_body=False)
            if h.status is rec.CheckStatus.OK:
                return SyncPoint(q, False)
        return None


@dataclass(frozen=True, slots=True)
class Run:
    """Sound records the split owns, read by one scanner call, and where and why it ended."""

    cols: columnar.Columns
    stopped_at: int  # buffer position
    why: Stop
    bad_crc: columnar.Columns | None = None  # the record at stopped_at, when why is BAD_CRC


def _runs_past(buf: bytes | memoryview, pos: int, max_record: int) -> bool:
    """Does a record whose header looks sound start at `pos` and end past the buffer?"""
    if pos + 8 > len(buf):
        return True
    total, magic = _II.unpack_from(buf, pos)
    sane = magic in _MESSAGE_MAGICS and _MIN_RECORD_BYTES <= total <= max_record
    return sane and pos + total > len(buf)


def _sound(w: Window, cols: columnar.Columns, max_record: int) -> npt.NDArray[np.bool_]:
    """What the scanner does not check: a record states its own offset, and it is no
    longer than the writer allowed."""
    sound: npt.NDArray[np.bool_] = (cols["physical_offset"] == cols["pos"] + w.base) & (
        cols["size"] <= max_record
    )
    return sound


def _bad_crc_record(w: Window, pos: int, max_record: int) -> columnar.Columns | None:
    """The columns of the record at `pos` when its body CRC is its only fault."""
    sc = scan_records(w.buf, pos, len(w.buf), check_crc=False, max_records=1)
    cols = columnar.scan_columns(sc)
    return cols if sc.count == 1 and _sound(w, cols, max_record).all() else None


def _orphaned(w: Window, sc: RecordScan, at: int, end: int, opts: ScanOptions) -> bool:
    """The chain broke at `at`, past the split's end: will the split that owns `at` not
    find it? That split walks from its first sync point, and the record at `at` is none
    (not sound, not cut by this split's read alone, no record whose only fault is its
    CRC). Reached by a chain from before its begin, it is that split's only when its
    walk starts there too: in a file's last `blank_bound` bytes, from the first sync
    point there, which the chain's record before `at` is when it starts there. Otherwise
    the split that walked into it reports it, so the range is one row whatever the split
    boundaries."""
    if sc.stop is not ScanStop.CORRUPT or w.find_sync(at, at + 1) is not None:
        return False
    if _runs_past(w.buf, at, opts.max_record_bytes) and (
        w.file_pos + len(w.buf) < w.spec.readable_bytes
    ):
        return False  # cut by this split's read only: the owner reads it whole
    if _bad_crc_record(w, at, opts.max_record_bytes) is not None:
        return False
    tail_from = w.spec.file_size_bytes - opts.blank_bound  # file position
    if w.file_pos + end >= tail_from and sc.count:
        return w.file_pos + int(sc.pos[sc.count - 1]) < tail_from
    return True


def read_run(w: Window, pos: int, end: int, opts: ScanOptions) -> Run:
    """Up to `batch_rows` sound records from `pos` that start before `end`."""
    buf = w.buf
    sc = scan_records(buf, pos, len(buf), max_records=opts.batch_rows)
    cols = columnar.scan_columns(sc)
    starts = cols["pos"]
    bad = ~_sound(w, cols, opts.max_record_bytes) | (starts >= end)
    if bad.any():
        k = int(np.argmax(bad))
        at = int(starts[k])
        return Run(
            columnar.take(cols, slice(0, k)), at, Stop.OWNED_END if at >= end else Stop.BROKEN
        )
    at = sc.stop_pos
    if at >= end and not _orphaned(w, sc, at, end, opts):
        return Run(cols, at, Stop.OWNED_END)
    if sc.stop is ScanStop.BLANK:
        return Run(cols, at, Stop.BLANK)
    if sc.stop is ScanStop.LIMIT:
        return Run(cols, at, Stop.MORE if at < len(buf) else Stop.CUT)
    bad_crc = _bad_crc_record(w, at, opts.max_record_bytes)
    if bad_crc is not None:
        return Run(cols, at, Stop.BAD_CRC, bad_crc)
    return Run(cols, at, Stop.CUT if _runs_past(buf, at, opts.max_record_bytes) else Stop.BROKEN)


def _why_broken(w: Window, pos: int) -> tuple[int | None, str]:
    buf = w.buf
    magic = _II.unpack_from(buf, pos)[1] if pos + 8 <= len(buf) else None
    h = rec.check_record(buf, pos, check_crc=False, read_body=False)
    if h.status is rec.CheckStatus.CORRUPT:
        return magic, h.reason
    if h.status is rec.CheckStatus.BLANK:
        return magic, f"BLANK record of {h.size} bytes does not end the file"
    if h.physical_offset != w.base + pos:
        return magic, f"PHYSICALOFFSET field is {h.physical_offset}, not {w.base + pos}"
    return magic, "TOTALSIZE out of range"


def _scan_tail(fs: pafs.FileSystem, spec: SplitSpec, opts: ScanOptions, file_pos: int) -> int:
    """End of the damaged range starting at `file_pos`: the next sync point's file position,
    or the readable end, or `file_pos` itself when everything up to there is zeros."""
    pos = file_pos
    all_zero = True
    while pos < spec.readable_bytes:
        length = min(_TAIL_CHUNK_BYTES + opts.blank_bound, spec.readable_bytes - pos)
        w = Window(spec, pos, storefs.read_range(fs, spec.path, pos, length))
        frm = 1 if pos == file_pos else 0
        found = w.find_sync(frm, min(_TAIL_CHUNK_BYTES, len(w.buf)))
        chunk_end = found.pos if found else min(_TAIL_CHUNK_BYTES, len(w.buf))
        if all_zero and columnar.as_bytes_array(w.buf)[:chunk_end].any():
            all_zero = False
        if found:
            return pos + found.pos
        pos += _TAIL_CHUNK_BYTES
    return file_pos if all_zero else spec.readable_bytes


def _batches(
    w: Window,
    nb: npt.NDArray[np.uint8],
    data: pa.Buffer,
    cols: columnar.Columns,
    begin: int,
    flt: RecordFilter,
    *,
    crc_ok: bool,
    columns: tuple[str, ...],
) -> Iterator[pa.RecordBatch]:
    """The rows of the scanned records that start in the split (at or after `begin`)."""
    starts = cols["pos"]
    if len(starts) and starts[0] < begin:
        cols = columnar.take(cols, starts >= begin)
    if len(cols["pos"]):
        batch = columnar.decode_run(w.buf, nb, data, cols, flt, crc_ok=crc_ok, columns=columns)
        if batch.num_rows:
            yield batch


def scan_split(
    fs: pafs.FileSystem,
    spec: SplitSpec,
    flt: RecordFilter = NO_FILTER,
    opts: ScanOptions = ScanOptions(),
) -> Iterator[pa.RecordBatch]:
    """Batches of the records the split owns that pass `flt` and their checks; never a
    filler (`engine.filler`)."""
    bound = opts.blank_bound
    if spec.begin == 0:
        read_from, trust_start = 0, True
    elif spec.begin < spec.file_size_bytes - bound:
        read_from, trust_start = spec.begin, False
    else:
        read_from = max(0, spec.file_size_bytes - bound)
        trust_start = read_from == 0
    read_to = min(spec.readable_bytes, spec.end + bound)
    if read_to <= read_from:
        return
    with storefs.read_range_reused(fs, spec.path, read_from, read_to - read_from) as buf:
        yield from _scan_window(fs, spec, opts, flt, Window(spec, read_from, buf), trust_start)


def _scan_window(
    fs: pafs.FileSystem,
    spec: SplitSpec,
    opts: ScanOptions,
    flt: RecordFilter,
    w: Window,
    trust_start: bool,
) -> Iterator[pa.RecordBatch]:
    """`scan_split` over the bytes it read (`w`)."""
    buf = w.buf
    read_from = w.file_pos
    nb = columnar.as_bytes_array(buf)
    data = pa.py_buffer(buf)
    begin, end = spec.begin - read_from, spec.end - read_from
    columns = opts.columns
    live_cut = spec.readable_bytes < spec.file_size_bytes
    if trust_start:
        pos = 0
    else:
        first = w.find_sync(0, end)
        if first is None or first.blank:
            return
        pos = first.pos
    while True:
        run = read_run(w, pos, end, opts)
        stopped_at, why = run.stopped_at, run.why
        yield from _batches(w, nb, data, run.cols, begin, flt, crc_ok=True, columns=columns)
        if why is Stop.MORE:
            pos = stopped_at
            continue
        if run.bad_crc is not None:
            if opts.include_corrupt:
                yield from _batches(
                    w, nb, data, run.bad_crc, begin, flt, crc_ok=False, columns=columns
                )
            pos = stopped_at + int(run.bad_crc["size"][0])
            continue
        if why in (Stop.OWNED_END, Stop.BLANK):
            return
        at_readable_end = read_from + len(buf) >= spec.readable_bytes
        if why is Stop.CUT and live_cut and at_readable_end:
            return  # the rest of this record is not flushed yet
        if at_readable_end and not nb[stopped_at:].any():
            return  # the unwritten end of the segment: no record, no damage
        nxt = w.find_sync(stopped_at + 1, end)
        if opts.include_corrupt and stopped_at >= begin and not flt.active:
            gap_end = _scan_tail(fs, spec, opts, read_from + stopped_at)
            if gap_end > read_from + stopped_at:
                magic, reason = _why_broken(w, stopped_at)
                if why is Stop.CUT:
                    reason = "record runs past the end of the readable bytes"
                row = columnar.gap_row(
                    w.base + stopped_at, gap_end - read_from - stopped_at, magic, reason
                )
                yield columnar.rows_to_batch([row], columns)
        if nxt is None or nxt.blank:
            return
        pos = nxt.pos
