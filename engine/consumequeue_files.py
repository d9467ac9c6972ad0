"""Consume-queue files: the 20-byte unit, the directory layout, and reading the files
without opening a queue (spec §3).

A consume queue (one per (topic, queue id), `engine.consumequeue.ConsumeQueue`) is a
chain of equal-sized files under `consumequeue/<topic>/<queueId>/`, named by their first
logical byte offset (20 digits, like commit-log segments). It holds one 20-byte unit per
message of the queue, big-endian:

| off | size | field                                   | written by              |
| --- | ---- | --------------------------------------- | ----------------------- |
| 0   | 8    | commit-log physical offset (int64)      | the dispatcher (`put`)  |
| 8   | 4    | message TOTALSIZE (int32)               | the dispatcher          |
| 12  | 8    | tags code (int64; spec §3.2)            | the dispatcher          |

(The table's third row starts at byte 12: 8 + 4.) Unit *n* (the message with queue
offset *n*) lives at logical byte offset `n * 20`, in file `floor(n*20 / file_size)`.
The file size is RocketMQ's `mappedFileSizeConsumeQueue` rounded up to a multiple of 20
(`cq_file_size`). A valid unit has offset >= 0 and size > 0; an all-zero unit marks the
end of the written data. A **pre-blank** unit `(0, 2147483647, 0)` stands for a queue
offset that holds no message: RocketMQ writes them from the start of a queue's first
file up to the first unit when a queue starts at an offset other than 0; mqstore also
writes them over a gap (a unit whose queue offset is past the queue's end), where
RocketMQ 4.9.8 logs "[BUG]" and appends the unit at the wrong place. Readers skip
pre-blanks; they count in `max_offset()`, as RocketMQ's.

Here: the unit's layout (`UNIT`, `CqUnit`, `pack_unit`), the walks over packed units
with their C twins (`group_units` for the dispatcher, `valid_units` and `zero_tail` for
recovery), the directories (`queue_dirs`), and the file readers the cleaner and tools on
a stopped store use (`last_file_unit`, `last_unit_end`, `expired_files`,
`dispatched_offset_from_files`): one pread or a binary search per file, no open queue.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterator
from typing import Final, NamedTuple

from mqstore import _native
from mqstore.engine import fileio
from mqstore.engine.indexfile import IntColumn
from mqstore.engine.record import Buffer
from mqstore.engine.segment_files import numbered_files

CQ_STORE_UNIT_SIZE: Final = 20
PRE_BLANK_SIZE: Final = 2_147_483_647  # Integer.MAX_VALUE
CONSUME_QUEUE_DIR: Final = "consumequeue"
UNIT: Final = struct.Struct(">qiq")
PRE_BLANK_BYTES: Final = UNIT.pack(0, PRE_BLANK_SIZE, 0)


def cq_file_size(configured_bytes: int) -> int:
    """RocketMQ's getter: round up to a multiple of 20 (128 -> 140, 4096 -> 4100)."""
    if configured_bytes <= 0:
        raise ValueError(f"consume-queue file size must be positive, got {configured_bytes}")
    return -(-configured_bytes // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


class CqUnit(NamedTuple):
    """One consume-queue unit."""

    physical_offset: int
    size: int
    tags_code: int

    @property
    def is_pre_blank(self) -> bool:
        return self.size == PRE_BLANK_SIZE

    @property
    def is_valid(self) -> bool:
        return self.physical_offset >= 0 and self.size > 0

    @property
    def end(self) -> int:
        """Commit-log offset one past the message."""
        return self.physical_offset + self.size


def pack_unit(physical_offset: int, size: int, tags_code: int) -> bytes:
    return UNIT.pack(physical_offset, size, tags_code)


# --- walks over packed units, each with its C twin (engine/native/mqs_cq.c) ----------------


Group = tuple[bytes, int, int, bool, bytes, bytes]  # see group_units


def group_units(
    buf: Buffer,
    topic_pos: IntColumn,
    topic_len: IntColumn,
    queue_id: IntColumn,
    queue_offset: IntColumn,
    pos: IntColumn,
    size: IntColumn,
    tags_code: IntColumn,
    base: int,
) -> list[Group]:
    """The reference of `mqstore._native.group_units`: a scanned batch's records
    grouped per (topic bytes, queue id), groups in order of first appearance. Per
    group: (topic bytes, queue id, the first record's queue offset, dense: the queue
    offsets run first, first + 1, ... and the commit-log ends rise, the records as
    native 'i' bytes, their units packed as `pack_unit(base + pos, size, tags)`).
    Raises ValueError for columns that do not fit, as the C twin does."""
    if base < 0:
        raise ValueError("base must not be negative")
    view = memoryview(buf).cast("B")
    tp_view = memoryview(topic_pos)
    n = len(tp_view) if tp_view.itemsize == 8 else 0
    tp, tl, qid, qo, ps, sz, tags = (
        _exact(c, name, itemsize, n)
        for c, name, itemsize in (
            (topic_pos, "topic_pos", 8), (topic_len, "topic_len", 4), (queue_id, "queue_id", 4),
            (queue_offset, "queue_offset", 8), (pos, "pos", 8), (size, "size", 4),
            (tags_code, "tags_code", 8),
        )
    )  # fmt: skip
    for r in range(n):
        if tp[r] < 0 or tl[r] < 0 or tp[r] + tl[r] > len(view) or ps[r] < 0:
            raise ValueError("a topic span or position is out of range")
        if base + ps[r] + 2**31 - 1 > 2**63 - 1:
            raise ValueError("a topic span or position is out of range")
    groups: dict[tuple[bytes, int], list[int]] = {}
    for r in range(n):
        groups.setdefault((bytes(view[tp[r] : tp[r] + tl[r]]), qid[r]), []).append(r)
    out: list[Group] = []
    for (topic, q), recs in groups.items():
        first, dense, last_end = qo[recs[0]], True, 0
        units = bytearray()
        for k, r in enumerate(recs):
            end = base + ps[r] + sz[r]
            if qo[r] != first + k or (k > 0 and end <= last_end):
                dense = False
            last_end = end
            units += UNIT.pack(base + ps[r], sz[r], tags[r])
        out.append((topic, q, first, dense, array("i", recs).tobytes(), bytes(units)))
    return out


def _exact(b: IntColumn, name: str, itemsize: int, n: int) -> memoryview:
    v = memoryview(b)
    if v.itemsize != itemsize or v.nbytes // itemsize != n:
        raise ValueError(f"{name} must hold {n} items of {itemsize} bytes")
    return v.cast("B").cast("i" if itemsize == 4 else "q")


group_units_c: Final = _native.group_units  # the C twin, what the dispatcher calls


def valid_units_py(units: Buffer) -> tuple[int, int]:
    """The reference of `valid_units`: (how many units lead `units` that are valid,
    i.e. physical offset >= 0 and size > 0, the first invalid one ending them; the index
    of the last of those that is not a pre-blank, -1 if none). ValueError for a partial
    unit, as the C twin."""
    view = memoryview(units).cast("B")
    if len(view) % CQ_STORE_UNIT_SIZE:
        raise ValueError(f"units holds {len(view)} bytes, not whole 20-byte units")
    count, last = 0, -1
    for off, size, _t in UNIT.iter_unpack(view):
        if off < 0 or size <= 0:
            break
        if size != PRE_BLANK_SIZE:
            last = count
        count += 1
    return count, last


def zero_tail_py(buf: Buffer, start: int) -> int:
    """The reference of `zero_tail`: where the trailing zero bytes of buf[start:] begin
    (one past its last non-zero byte; `start` when all are zero). ValueError for a
    `start` outside the buffer, as the C twin."""
    view = memoryview(buf).cast("B")
    if not 0 <= start <= len(view):
        raise ValueError(f"start {start} is outside the buffer of {len(view)} bytes")
    return start + len(bytes(view[start:]).rstrip(b"\0"))


# The C twins (engine/native/mqs_cq.c), what recovery calls: memory speed, no GIL held,
# so a normal recovery's walk of the last 3 files of every queue stays small.
valid_units: Final = _native.valid_units
zero_tail: Final = _native.zero_tail


# --- the directories ------------------------------------------------------------------------


def queue_dirs(store_dir: str | os.PathLike[str]) -> Iterator[tuple[str, str, str]]:
    """(topic, queue id as named, path) of every `consumequeue/<topic>/<qid>/` directory,
    sorted; names are not validated (callers that open queues do)."""
    root = os.path.join(store_dir, CONSUME_QUEUE_DIR)
    if not os.path.isdir(root):
        return
    for topic in sorted(os.listdir(root)):
        tdir = os.path.join(root, topic)
        if not os.path.isdir(tdir):
            continue
        for qid in sorted(os.listdir(tdir)):
            qdir = os.path.join(tdir, qid)
            if os.path.isdir(qdir):
                yield topic, qid, qdir


def numbered_queue_dirs(store_dir: str | os.PathLike[str]) -> list[tuple[str, int, str]]:
    """(topic, queue id, path) of every `consumequeue/<topic>/<queueId>/` whose queue id is
    an int; other directories are skipped, as RocketMQ's load does."""
    return [(t, int(q), d) for t, q, d in queue_dirs(store_dir) if q.lstrip("-").isdigit()]


def topic_queue_ids(store_dir: str | os.PathLike[str], topic: str) -> set[int]:
    """The queue ids named by `consumequeue/<topic>/`'s entries made of digits; empty
    when there is no such directory or it cannot be listed."""
    try:
        names = os.listdir(os.path.join(store_dir, CONSUME_QUEUE_DIR, topic))
    except OSError:
        return set()
    return {int(n) for n in names if n.isdigit()}


def detect_file_size(store_dir: str | os.PathLike[str]) -> int | None:
    """The size of the consume-queue files already in a store (the largest found: a
    damaged file may be shorter, never longer), or None when there are none: the size of a
    store without a geometry record (`engine.geometry`)."""
    best = 0
    for _topic, _qid, qdir in queue_dirs(store_dir):
        for path in numbered_files(qdir):
            best = max(best, os.stat(path).st_size)
    return best or None


# --- reading queue files without opening the queue (the cleaner, stopped stores) ---------


def file_unit(fd: int, index: int, path: str) -> CqUnit:
    """Unit `index` of an open queue file; all zeros past the file's end. One pread."""
    raw = fileio.pread(fd, CQ_STORE_UNIT_SIZE, index * CQ_STORE_UNIT_SIZE, path)
    if len(raw) < CQ_STORE_UNIT_SIZE:
        return CqUnit(0, 0, 0)
    return CqUnit(*UNIT.unpack(raw))


def last_file_unit(path: str, file_size: int) -> CqUnit | None:
    """The last unit slot of a queue file of `file_size` bytes (written or not), or None
    when the file holds no whole unit. Raises StoreIOError."""
    if file_size < CQ_STORE_UNIT_SIZE:
        return None
    fd = fileio.open_file(path, create=False, read_only=True)
    try:
        raw = fileio.pread(fd, CQ_STORE_UNIT_SIZE, file_size - CQ_STORE_UNIT_SIZE, path)
    finally:
        fileio.close(fd, path)
    return CqUnit(*UNIT.unpack(raw)) if len(raw) == CQ_STORE_UNIT_SIZE else None


def last_unit_end(path: str, file_size: int) -> int | None:
    """End (phys + size) of the last written unit of one queue file, found by binary
    search over "unit i is written" (units are written contiguously from 0). None if no
    real unit is written. O(log units) preads. Raises StoreIOError."""
    fd = fileio.open_file(path, create=False, read_only=True)
    try:
        lo, hi = 0, file_size // CQ_STORE_UNIT_SIZE  # first unwritten unit is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if file_unit(fd, mid, path).size > 0:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return None
        last = file_unit(fd, lo - 1, path)
        return None if last.is_pre_blank else last.end
    finally:
        fileio.close(fd, path)


def dispatched_offset_from_files(store_dir: str | os.PathLike[str]) -> int | None:
    """A lower bound of the dispatcher's position read from the consume-queue files:
    the highest end (phys + size) of the last unit of any queue. None when the store has
    no consume queues (then nothing was dispatched that deletion could orphan). For a
    stopped store, or a cleaner process that has no dispatcher position to read.
    O(queues x log units) preads."""
    best: int | None = None
    for _topic, _qid, qdir in numbered_queue_dirs(store_dir):
        for path in reversed(numbered_files(qdir)):
            end = last_unit_end(path, os.stat(path).st_size)
            if end is not None:
                best = end if best is None else max(best, end)
                break
    return best


def expired_files(qdir: str, min_offset: int, file_size_bytes: int) -> list[tuple[str, int, int]]:
    """RocketMQ's ConsumeQueue.deleteExpiredFile(minOffset) on one queue's files, choice
    only: (path, size, physical offset of its last unit) of every file but the last,
    oldest first, whose last unit is written (size > 0) and points below `min_offset`.
    The first file that is not, or is not `file_size_bytes` long, ends the list. One
    pread per file. Raises StoreIOError."""
    out: list[tuple[str, int, int]] = []
    for path in numbered_files(qdir)[:-1]:
        size = os.stat(path).st_size
        last = last_file_unit(path, size) if size == file_size_bytes else None
        if last is None or last.size <= 0 or last.physical_offset >= min_offset:
            break
        out.append((path, size, last.physical_offset))
    return out
