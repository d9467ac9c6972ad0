"""Recovery's consume-queue check: does each unit agree with the commit log?

`verify_units` walks a run of 20-byte consume-queue units (`engine.consumequeue_files`'s
layout) of one queue, the unit at index i having queue offset `first_queue_offset + i`,
and returns (the first bad queue offset or -1, the new `prev_end`). A unit is right when:

* it is a pre-blank (skipped: it neither passes nor moves `prev_end`); or
* it is valid (physical offset >= 0, size > 0), starts at or past `prev_end` (the end of
  the previous right unit; -1 before the first), and ends by `log_end`; and
* below the log's first offset `log_min` (retention removed the record), no unit before
  it in the run ended past `log_min`; and
* at commit-log offsets >= `headers_from` and >= `log_min`, the record it points at has
  the unit's size, a message magic (V1 or V2), the queue's id, the unit's queue offset
  and its own physical offset (the 36 head bytes). `segments[k]` holds the log's bytes
  [segments_base + k * segment_size, ...) up to its read position, or None where no
  segment is (a unit pointing there, or past the list, is bad).

`prev_end` carries from one run to the next of the same queue. `verify_units` is the C
twin (`mqstore._native.verify_units`, engine/native/mqs_verify.c: no GIL, a segment's
buffer taken only when a unit points into it); `verify_units_py` is the reference, and
tests/native/test_verify_diff.py compares them. O(units): about 12 us a unit in Python,
tens of ns in C. Both raise ValueError for a partial unit or a segment size <= 0.

`queue_last_ends` serves recovery's validating walk, which skips a chunk of scanned
records when every queue they belong to already holds them: it gives each queue's last
record in the chunk, keyed as the walk keys queues, found in C by hashing topic spans
(`queue_last_ends_py` is the reference: one bytes object per record).

`verify_queues` drives the check over every queue of a store (recovery's apply step):
it cuts each queue at its first bad unit and says where to re-dispatch from.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from mqstore import _native
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import ConsumeQueue, QueueKey
from mqstore.engine.consumequeue_files import CQ_STORE_UNIT_SIZE, UNIT, CqUnit
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.record import (
    HEAD_TO_PHYSICAL,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    Buffer,
)
from mqstore.engine.scan import RecordScan
from mqstore.engine.segment import ReadStatus


@dataclass(frozen=True, slots=True)
class LogBounds:
    """The commit log as the check sees it: its bounds and its segments' bytes."""

    log_min: int  # the log's first offset (>= 0)
    log_end: int  # where valid data ends
    headers_from: int  # units at or past this offset are compared with their record
    segments: Sequence[Buffer | None]
    segments_base: int
    segment_size: int


def verify_units(
    units: Buffer, first_queue_offset: int, queue_id: int, prev_end: int, log: LogBounds
) -> tuple[int, int]:
    """Check one run of units (see the module doc), in C."""
    return _native.verify_units(
        units, first_queue_offset, queue_id, prev_end, log.log_min, log.log_end,
        log.headers_from, log.segments, log.segments_base, log.segment_size,
    )  # fmt: skip


def verify_units_py(
    units: Buffer, first_queue_offset: int, queue_id: int, prev_end: int, log: LogBounds
) -> tuple[int, int]:
    """The reference of `verify_units`."""
    if log.segment_size <= 0:
        raise ValueError(f"segment_size {log.segment_size} is not positive")
    if log.log_end < 0:
        raise ValueError(f"log_end {log.log_end} is negative")
    view = memoryview(units).cast("B")
    if len(view) % CQ_STORE_UNIT_SIZE:
        raise ValueError(f"units holds {len(view)} bytes, not whole 20-byte units")
    for i, t in enumerate(UNIT.iter_unpack(view)):
        u = CqUnit._make(t)
        if u.is_pre_blank:
            continue
        qo = first_queue_offset + i
        if not _unit_ok(u, qo, queue_id, prev_end, log):
            return qo, prev_end
        prev_end = u.end
    return -1, prev_end


def _unit_ok(u: CqUnit, qo: int, queue_id: int, prev_end: int, log: LogBounds) -> bool:
    phy, size = u.physical_offset, u.size
    ok = u.is_valid and phy >= prev_end and phy + size <= log.log_end
    if ok and phy < log.log_min:
        ok = prev_end < 0 or prev_end <= log.log_min  # below the log: retention
    if ok and phy >= log.headers_from and phy >= log.log_min:
        h = _header(phy, log)
        ok = (
            h is not None
            and h[0] == size
            and h[1] in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
            and h[3] == queue_id
            and h[5] == qo
            and h[6] == phy
        )
    return ok


def _header(phy: int, log: LogBounds) -> tuple[int, ...] | None:
    """The 36 head bytes of the record at `phy`, None where no segment holds them."""
    if phy < log.segments_base:
        return None
    k, pos = divmod(phy - log.segments_base, log.segment_size)
    if k >= len(log.segments):
        return None
    seg = log.segments[k]
    if seg is None:
        return None
    view = memoryview(seg).cast("B")
    if pos + HEAD_TO_PHYSICAL.size > len(view):
        return None
    return HEAD_TO_PHYSICAL.unpack_from(view, pos)


def queue_last_ends(buf: Buffer, scan: RecordScan, start: int) -> dict[tuple[bytes, int], int]:
    """{(topic bytes, queue id): pos + size of its last record} over the scanned records
    from `start` on (positions in `buf`, which `scan` walked). In C, without the GIL."""
    return _native.queue_last_ends(
        buf, start, scan.pos, scan.size, scan.queue_id, scan.topic_pos, scan.topic_len
    )


def queue_last_ends_py(buf: Buffer, scan: RecordScan, start: int) -> dict[tuple[bytes, int], int]:
    """The reference of `queue_last_ends`."""
    view = memoryview(buf).cast("B")
    start = min(max(start, 0), scan.count)
    tp = scan.topic_pos[start:]
    spans = map(slice, tp, map(operator.add, tp, scan.topic_len[start:]))
    queues = zip(map(bytes, map(view.__getitem__, spans)), scan.queue_id[start:], strict=True)
    ends = map(operator.add, scan.pos[start:], scan.size[start:])
    return dict(zip(queues, ends, strict=True))


def verify_queues(
    cqs: ConsumeQueueStore,
    log: CommitLog,
    log_end: int,
    *,
    headers_from: int,
    all_files: bool,
) -> dict[QueueKey, tuple[int, int]]:
    """Find each consume queue's first unit that cannot be right, and cut the queue there.

    The rules are `verify_units`' (in C): units (pre-blanks aside) must be valid, point
    at or past the log's first offset and past the previous unit's end, and end by
    `log_end`; units at commit-log offsets >= `headers_from` are also compared with the
    record they point at (its size, magic, queue id, queue offset and physical offset).
    `all_files`: every unit of the queue, else those from the first pointing at or past
    `headers_from` (found by binary search: the units of the segments validated, so a
    normal recovery's cost does not grow with the store). Returns, per queue cut, (the
    first bad queue offset, the commit-log offset to re-dispatch from). O(units checked),
    tens of ns a unit; one held slice per commit-log segment from `headers_from` on.
    Recovery only."""
    out: dict[QueueKey, tuple[int, int]] = {}
    log_min = max(log.min_offset(), 0)
    with contextlib.ExitStack() as stack:
        bounds = _log_bounds(stack, log, log_min, log_end, headers_from)
        for cq in cqs:
            lo, hi = cq.min_offset(), cq.max_offset()
            if not all_files:
                lo = _first_unit_from(cq, lo, hi, headers_from)
            prev_end, bad_qo = -1, -1
            with contextlib.closing(cq.unit_runs(lo, hi - lo)) as runs:
                for qo, view in runs:
                    bad_qo, prev_end = verify_units(view, qo, cq.queue_id, prev_end, bounds)
                    if bad_qo >= 0:
                        break
            if bad_qo >= 0:
                cq.cut_at(bad_qo)
                out[cq.key] = (bad_qo, max(prev_end, log_min))
    return out


def _log_bounds(
    stack: contextlib.ExitStack, log: CommitLog, log_min: int, log_end: int, headers_from: int
) -> LogBounds:
    """The check's view of the log: a slice (held on `stack`) of every segment from the
    one holding max(headers_from, log_min) on, None for a segment that cannot be read."""
    size = log.queue.segment_size_bytes
    first = max(headers_from, log_min)
    base = first - first % size
    segments: list[memoryview | None] = []
    for seg in log.queue.segments:
        if seg.start_offset < base or seg.start_offset % size:
            continue
        k = (seg.start_offset - base) // size
        segments.extend([None] * (k + 1 - len(segments)))
        sl = stack.enter_context(seg.select(0, seg.read_position))
        segments[k] = sl.view if sl.status is ReadStatus.OK else None
    return LogBounds(log_min, log_end, headers_from, segments, base, size)


def _first_unit_from(cq: ConsumeQueue, lo: int, hi: int, phy: int) -> int:
    """The first queue offset in [lo, hi) whose unit points at or past `phy`, by binary
    search (pre-blanks count as before it: a search may start a few units late)."""
    while lo < hi:
        mid = (lo + hi) // 2
        u = cq.get(mid)
        if u is not None and u.is_valid and not u.is_pre_blank and u.physical_offset >= phy:
            hi = mid
        else:
            lo = mid + 1
    return lo
