"""Consume queues: RocketMQ's ConsumeQueue, one per (topic, queue id) (spec §3).

A consume queue is a chain of equal-sized files under `consumequeue/<topic>/<queueId>/`
over a `SegmentQueue`, one 20-byte unit per message of the queue; the unit, the
pre-blank and the file layout are in `engine.consumequeue_files`, and every queue of a
store in `engine.consumequeue_store`.

Who calls what: the dispatcher `put()`s and `flush()`es; recovery calls `recover()`,
`truncate_dirty()` and `correct_min_offset()`; the cleaner `delete_expired()`. Readers
open queues read-only in their own process and call `refresh()` before reading, which
picks up files another process created and finds where the written units end.

Not thread-safe: one writer process (the dispatcher) per store.
"""

from __future__ import annotations

import enum
import functools
import operator
import struct
from collections.abc import Callable, Generator, Iterator, Sequence
from itertools import chain
from typing import Final

from mqstore.engine.consumequeue_files import (
    CQ_STORE_UNIT_SIZE,
    PRE_BLANK_BYTES,
    PRE_BLANK_SIZE,
    UNIT,
    CqUnit,
    valid_units,
    zero_tail,
)
from mqstore.engine.findings import Finding, Severity
from mqstore.engine.segment import ReadStatus, Segment
from mqstore.engine.segment_queue import SegmentQueue

MAX_GAP_FILES: Final = 4  # a gap wider than this many files is refused, not filled
_UNIT_FIELDS: Final = operator.itemgetter(1, 2, 3)

QueueKey = tuple[str, int]
# A unit for `put_units`: (queue offset, physical offset or -1 for a pre-blank, size, tags
# code, ...): what follows is the caller's (the dispatcher keeps the record's index there).
Unit = tuple[int, int, int, int, int]
StoreTimeOf = Callable[[int, int], int]  # (physical offset, size) -> store time, -1 if gone


@functools.lru_cache(maxsize=256)
def _units_struct(n: int) -> struct.Struct:
    """The layout of n consecutive units."""
    return struct.Struct(UNIT.format[0] + UNIT.format[1:] * n)


def _valid_unit(view: memoryview, k: int) -> bool:
    """Unit k of a file's units is a valid unit (offset >= 0, size > 0)."""
    off, size, _tags = UNIT.unpack_from(view, k * 20)
    return bool(off >= 0 and size > 0)


class PutStatus(enum.Enum):
    """What `ConsumeQueue.put` did; only REFUSED_GAP leaves the message out."""

    OK = "OK"
    ALREADY_BUILT = "ALREADY_BUILT"  # its commit-log end is not past the queue's (re-dispatch)
    DUPLICATE = "DUPLICATE"  # the queue already holds a unit at that queue offset
    GAP_FILLED = "GAP_FILLED"  # written, after pre-blanks over missing queue offsets
    REFUSED_GAP = "REFUSED_GAP"  # queue offset far past the end (corrupt record?)


class ConsumeQueue:
    """One (topic, queue id) consume queue. See the module docstring."""

    def __init__(self, queue: SegmentQueue, topic: str, queue_id: int) -> None:
        """An empty queue over `queue`, the not yet loaded files of
        `consumequeue/<topic>/<queueId>` (their size a multiple of 20, `cq_file_size`);
        `load()` next. Raises ValueError for another size."""
        if queue.segment_size_bytes % CQ_STORE_UNIT_SIZE:
            raise ValueError(
                f"consume-queue files hold whole units: {queue.segment_size_bytes} bytes "
                f"is not a multiple of {CQ_STORE_UNIT_SIZE}"
            )
        self.topic = topic
        self.queue_id = queue_id
        self.file_size_bytes = queue.segment_size_bytes
        self.read_only = queue.read_only
        self.queue = queue
        self.min_logic_offset = 0  # bytes; min_offset() = this // 20
        self.max_physical_offset = -1  # commit-log end of the newest real unit (-1: none)

    @property
    def directory(self) -> str:
        return self.queue.directory

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.queue_id)

    # --- loading and recovery ---------------------------------------------------------

    def load(self) -> ConsumeQueue:
        """Open the files (positions full, as RocketMQ's load) and return the queue.
        Writable queues must be `recover()`ed before `put()`; read-only ones find their
        end here (`refresh()`). Raises SegmentSizeError, StoreIOError."""
        self.queue.load()
        if self.read_only:
            self.refresh(list_files=False)
        else:
            self._init_min_logic_offset()
        return self

    def _init_min_logic_offset(self) -> None:
        first = self.queue.first()
        if first is None:
            self.min_logic_offset = 0
            return
        pos = 0
        with first.select(0, first.read_position) as sl:
            if sl.status is ReadStatus.OK:
                view = sl.view
                while pos + 20 <= len(view) and view[pos : pos + 20] == PRE_BLANK_BYTES:
                    pos += 20
        self.min_logic_offset = first.start_offset + pos

    def refresh(self, *, list_files: bool = True) -> None:
        """Read-only queues: pick up new files (when the last is full, or `list_files`
        and it is empty) and set the last file's position to the end of its written
        units (a search from where they ended at the last look: units are written in
        order). O(log units appended since the last refresh), O(log units per file)
        after a cut."""
        q = self.queue
        last = q.last()
        end = self._settle(last) if last is not None else 0
        listed = list_files and (last is None or end >= last.size_bytes)
        if listed:
            q.refresh()
        if listed or not list_files:  # files were listed, or loaded: settle them all
            segs = q.segments
            for seg in segs[:-1]:  # all full but the last
                if seg.wrote_position != seg.size_bytes:
                    seg.adopt_positions(seg.size_bytes, seg.size_bytes, 0)
            if segs and segs[-1] is not last:
                self._settle(segs[-1])
        self._init_min_logic_offset_read_only()
        tail = self._last_real_unit()
        self.max_physical_offset = -1 if tail is None else tail.end

    def _settle(self, seg: Segment) -> int:
        """Set `seg`'s positions to the end of its written units; return that end."""
        hint = seg.wrote_position
        seg.adopt_positions(seg.size_bytes, seg.size_bytes, 0)
        end = self._written_end(seg, hint)
        seg.adopt_positions(end, end, 0)
        return end

    def _init_min_logic_offset_read_only(self) -> None:
        first = self.queue.first()
        if first is not None and self.min_logic_offset < first.start_offset:
            self._init_min_logic_offset()

    def _written_end(self, seg: Segment, hint: int = 0) -> int:
        """Position after the last valid unit of `seg`. Units [0, hint) were valid at the
        last look: when the unit before `hint` still is, the search gallops on from it
        (a cut, found by that unit, searches the whole file)."""
        n = seg.size_bytes // 20
        with seg.select(0, seg.size_bytes) as sl:
            if sl.status is not ReadStatus.OK:
                return 0
            view = sl.view
            lo, hi = 0, n  # units [0, lo) valid, [hi, n) not
            k = min(hint // 20, n)
            if k > 0 and _valid_unit(view, k - 1):
                lo, step = k, 1
                while lo + step <= hi and _valid_unit(view, lo + step - 1):
                    lo += step
                    step *= 2
                hi = min(hi, lo + step - 1)
            while lo < hi:
                mid = (lo + hi) // 2
                if _valid_unit(view, mid):
                    lo = mid + 1
                else:
                    hi = mid
        return lo * 20

    def recover(self) -> int:
        """RocketMQ's ConsumeQueue.recover (spec §3.5): scan the last 3 files from their
        start while units are valid; the end found becomes every position, and bytes and
        files past it are cut. Returns `max_physical_offset` (-1 when empty).
        Recovery only. O(units in the last 3 files), walked in C (`valid_units`: about
        a nanosecond a unit, so 3 full default files of 300,000 units take ~1 ms)."""
        segs = self.queue.segments
        if not segs:
            self.max_physical_offset = -1
            self._init_min_logic_offset()
            return -1
        start = max(0, len(segs) - 3)
        max_phys = -1
        end = segs[start].start_offset
        for seg in segs[start:]:
            # positions are unknown here (a second recover() must rescan too)
            seg.adopt_positions(seg.size_bytes, seg.size_bytes, seg.flushed_position)
        for seg in segs[start:]:
            with seg.select(0, seg.size_bytes) as sl:
                if sl.status is not ReadStatus.OK:
                    break
                count, last = valid_units(sl.view)
                if last >= 0:
                    off, size, _t = UNIT.unpack_from(sl.view, last * CQ_STORE_UNIT_SIZE)
                    max_phys = off + size
            pos = count * CQ_STORE_UNIT_SIZE
            end = seg.start_offset + pos
            if pos < seg.size_bytes:
                break
        if max_phys < 0 and start > 0:
            tail = self._last_real_unit(before=segs[start].start_offset)
            max_phys = -1 if tail is None else tail.end
        self._cut(end)
        self.max_physical_offset = max_phys
        self._init_min_logic_offset()
        return max_phys

    def _cut(self, end: int) -> None:
        """Make `end` the end of the queue: positions there, later files gone, and the
        bytes past it zero (only written when they are not zero already)."""
        q = self.queue
        seg = q.find(end)
        dirty = False
        if seg is not None:
            pos = end - seg.start_offset
            read = seg.read_position
            if pos < read:
                with seg.select(0, read) as sl:
                    dirty = sl.status is ReadStatus.OK and zero_tail(sl.view, pos) > pos
        later = [s for s in q.segments if s.start_offset > end]
        if dirty or later:
            q.truncate_dirty(end)
        elif seg is not None:
            pos = end - seg.start_offset
            seg.adopt_positions(pos, pos, min(seg.flushed_position, pos))
            q.committed_where = min(q.committed_where, end)
            q.flushed_where = min(q.flushed_where, end)
        # RocketMQ deletes a file that ends up empty behind a full one.
        while len(q) > 1:
            last = q.last()
            assert last is not None
            if last.wrote_position != 0:
                break
            q.delete_last()
        if end == 0 and len(q) == 1:
            only = q.last()
            assert only is not None
            if only.start_offset == 0 and only.wrote_position == 0:
                q.delete_last()

    def cut_at(self, queue_offset: int) -> int:
        """Drop the units at and after `queue_offset` (a damaged unit and all after it,
        to be rebuilt from the log). Returns units dropped. Recovery, and the dispatcher
        cutting back a batch that failed (`Dispatcher._cut_back`)."""
        q = self.queue
        before = q.max_wrote_offset()
        end = max(queue_offset * 20, self.min_logic_offset)
        if end >= before:
            return 0
        self._cut(end)
        tail = self._last_real_unit()
        self.max_physical_offset = -1 if tail is None else tail.end
        if len(q) == 0:
            self.min_logic_offset = 0
        return (before - q.max_wrote_offset()) // 20

    def truncate_dirty(self, physical_offset: int) -> int:
        """Drop units that point at or past commit-log `physical_offset` (spec §3.5,
        truncateDirtyLogicFiles). Pre-blanks after the last kept unit go too. Returns
        how many units were dropped. Recovery only. O(units in the files cut)."""
        q = self.queue
        before = q.max_wrote_offset()
        while True:
            last = q.last()
            if last is None:
                break
            keep = 0
            max_phys = -1
            with last.select(0, last.wrote_position) as sl:
                view = sl.view if sl.status is ReadStatus.OK else memoryview(b"")
                pos = 0
                if last is q.first():
                    while pos + 20 <= len(view) and view[pos : pos + 20] == PRE_BLANK_BYTES:
                        pos += 20
                    keep = pos
                for off, size, _t in UNIT.iter_unpack(view[pos:]):
                    if off < 0 or size <= 0:
                        break
                    if size == PRE_BLANK_SIZE:
                        pos += 20
                        continue
                    if off >= physical_offset:
                        break
                    pos += 20
                    keep = pos
                    max_phys = off + size
            if keep == 0:
                q.delete_last()
                continue
            self._cut(last.start_offset + keep)
            if max_phys < 0:
                tail = self._last_real_unit()
                max_phys = -1 if tail is None else tail.end
            self.max_physical_offset = max_phys
            break
        if len(q) == 0:
            self.max_physical_offset = -1
            self.min_logic_offset = 0
        return (before - q.max_wrote_offset()) // 20

    def _last_real_unit(self, before: int | None = None) -> CqUnit | None:
        """The newest unit that is not a pre-blank, below logical offset `before`."""
        q = self.queue
        end = q.max_offset() if before is None else before
        first = q.first()
        lo_bound = max(self.min_logic_offset, first.start_offset if first is not None else 0)
        at = end - 20
        while at >= lo_bound:
            u = self._unit_at(at)
            if u is None:
                return None
            if u.is_valid and not u.is_pre_blank:
                return u
            at -= 20
        return None

    def correct_min_offset(self, log_min_offset: int) -> None:
        """RocketMQ's correctMinOffset: the min becomes the first unit that points at or
        past `log_min_offset`; if none does, the end of the units. Pre-blanks never count.
        Recovery and cleaner.

        RocketMQ 4.9.8 scans the first file only: after its deleteExpiredFile the first
        file left always holds such a unit. A cleaner that died between deleting
        segments and the queue files they emptied leaves whole files below the log, and
        their end is no min (its unit points into a deleted segment): the walk goes on
        through the next files, as 5.x's does. O(units of the files below the log's
        min, plus one file's)."""
        if self.queue.first() is None:
            self.min_logic_offset = 0
            return
        for f in self.queue.segments:
            end = f.read_position
            with f.select(0, end) as sl:
                if sl.status is not ReadStatus.OK:
                    return
                pos = 0
                for off, size, _t in UNIT.iter_unpack(sl.view):
                    if off >= 0 and 0 < size != PRE_BLANK_SIZE and off >= log_min_offset:
                        self.min_logic_offset = f.start_offset + pos
                        return
                    pos += 20
            self.min_logic_offset = max(self.min_logic_offset, f.start_offset + end)
            if end < f.size_bytes:  # a file not full: the queue's last
                return

    # --- writing ----------------------------------------------------------------------

    def put(self, physical_offset: int, size: int, tags_code: int, queue_offset: int) -> PutStatus:
        """Write the unit of queue offset `queue_offset` (RocketMQ's
        putMessagePositionInfo, spec §3.4, with gaps filled by pre-blanks).

        Dispatcher only. O(1) (plus the gap). Raises StoreIOError (file creation).
        """
        if self.read_only:
            raise PermissionError(f"{self.directory}: opened read-only")
        if physical_offset + size <= self.max_physical_offset:
            return PutStatus.ALREADY_BUILT
        q = self.queue
        expect = queue_offset * 20
        status = PutStatus.OK
        if len(q) == 0:
            seg = q.get_last(expect)
            assert seg is not None
            if expect > seg.start_offset:
                # first-created file of a queue that starts past 0: pre-blanks up to it
                seg.append_bytes(PRE_BLANK_BYTES * ((expect - seg.start_offset) // 20))
            self.min_logic_offset = expect
        current = q.max_wrote_offset()
        if expect < current:
            return PutStatus.DUPLICATE
        if expect > current:
            if expect - current > MAX_GAP_FILES * self.file_size_bytes:
                return PutStatus.REFUSED_GAP
            self._fill(current, expect)
            status = PutStatus.GAP_FILLED
        seg = q.get_last(expect)
        assert seg is not None
        seg.append_bytes(UNIT.pack(physical_offset, size, tags_code))
        self.max_physical_offset = physical_offset + size
        return status

    def put_units(self, units: Sequence[Unit]) -> list[PutStatus]:
        """`put` (or, for a unit of physical offset -1, `put_pre_blank`) of every unit in
        order, one status each. Units that continue the queue exactly (the next queue
        offset, past its commit-log end) go into a file with one slice write per run.
        Dispatcher only. O(units): each unit is looked at a bounded number of times, a
        batch of units the queue holds already (a re-dispatch) included. Raises
        StoreIOError (file creation)."""
        out: list[PutStatus] = []
        i = 0
        while i < len(units):
            j = self._append_run(units, i)
            if j > i:
                out.extend([PutStatus.OK] * (j - i))
                i = j
                continue
            qo, phys, size, tags = units[i][:4]
            out.append(self.put_pre_blank(qo) if phys < 0 else self.put(phys, size, tags, qo))
            i += 1
        return out

    def _append_run(self, units: Sequence[Unit], i: int) -> int:
        """Write units[i:j], the longest run from i that `put` would append as is into
        the last file (the next queue offsets, each past the queue's commit-log end, no
        pre-blank), with one slice write; return j (i: none). Looks at units i..j only
        (the first that does not continue ends the walk), so that `put_units` stays
        linear when most units do not continue the queue."""
        last = self.queue.last()
        if last is None or self.read_only or last.is_full():
            return i
        expect = last.start_offset + last.wrote_position
        if expect % CQ_STORE_UNIT_SIZE:
            return i
        stop = min(len(units), i + (last.size_bytes - last.wrote_position) // CQ_STORE_UNIT_SIZE)
        qo, end, j = expect // CQ_STORE_UNIT_SIZE, self.max_physical_offset, i
        while j < stop:
            u_qo, phys, size = units[j][:3]
            if u_qo != qo or phys < 0 or phys + size <= end:
                break
            qo, end, j = qo + 1, phys + size, j + 1
        if j > i:
            fields = chain.from_iterable(map(_UNIT_FIELDS, units[i:j]))
            last.append_bytes(_units_struct(j - i).pack(*fields))
            self.max_physical_offset = end
        return j

    def append_units(self, first_queue_offset: int, units: bytes) -> bool:
        """Append packed units (`group_units`' units of a dense group) when they continue
        the queue exactly: the first at the queue's next offset and past its commit-log
        end. Across files, one slice write per file. False, with nothing written, when
        they do not continue it (the caller then `put_units` them one by one).
        Dispatcher only. Raises StoreIOError (file creation)."""
        q = self.queue
        last = q.last()
        if self.read_only or not units or last is None:
            return False
        current = last.start_offset + last.wrote_position  # `max_wrote_offset`
        phys, size, _tags = UNIT.unpack_from(units, 0)
        if first_queue_offset * CQ_STORE_UNIT_SIZE != current or phys + size <= (
            self.max_physical_offset
        ):
            return False
        done = 0
        while done < len(units):
            # the last segment while it has room (`get_last`'s answer, without its lookup)
            seg = last if last.wrote_position < last.size_bytes else q.get_last(current)
            assert seg is not None
            last = seg
            n = min(len(units) - done, seg.size_bytes - seg.wrote_position)
            n -= n % CQ_STORE_UNIT_SIZE
            seg.append_bytes(memoryview(units)[done : done + n])
            done += n
            current += n
            phys, size, _tags = UNIT.unpack_from(units, done - CQ_STORE_UNIT_SIZE)
            self.max_physical_offset = phys + size
        return True

    def put_pre_blank(self, queue_offset: int) -> PutStatus:
        """Write a pre-blank at `queue_offset`: the dispatcher's unit for a record that
        holds a queue offset but no message (mqstore's filler). Idempotent like `put`."""
        q = self.queue
        expect = queue_offset * 20
        if len(q) == 0:
            seg = q.get_last(expect)
            assert seg is not None
            seg.append_bytes(PRE_BLANK_BYTES * ((expect - seg.start_offset) // 20 + 1))
            self.min_logic_offset = expect + 20
            return PutStatus.OK
        current = q.max_wrote_offset()
        if expect < current:
            return PutStatus.DUPLICATE
        if expect - current > MAX_GAP_FILES * self.file_size_bytes:
            return PutStatus.REFUSED_GAP
        self._fill(current, expect + 20)
        return PutStatus.OK if expect == current else PutStatus.GAP_FILLED

    def _fill(self, current: int, expect: int) -> None:
        q = self.queue
        while current < expect:
            seg = q.get_last(current)
            assert seg is not None
            room = seg.size_bytes - seg.wrote_position
            n = min(room, expect - current) // 20
            seg.append_bytes(PRE_BLANK_BYTES * n)
            current += n * 20

    def flush(self, least_pages: int) -> int:
        """Flush one file's dirty units; bytes advanced (0: nothing). Raises StoreIOError."""
        return self.queue.flush(least_pages)

    def flush_all(self) -> int:
        return self.queue.flush_all()

    def delete_expired(self, log_min_offset: int) -> int:
        """Cleaner: drop files whose last unit is below `log_min_offset`, then
        `correct_min_offset`. Returns files deleted."""
        n = self.queue.delete_expired_by_offset(log_min_offset, CQ_STORE_UNIT_SIZE)
        self.correct_min_offset(log_min_offset)
        return n

    # --- reading ----------------------------------------------------------------------

    def min_offset(self) -> int:
        """The first queue offset a reader may ask for."""
        return self.min_logic_offset // 20

    def max_offset(self) -> int:
        """One past the last queue offset written (pre-blanks count)."""
        return self.queue.max_offset() // 20

    def _unit_at(self, logical: int) -> CqUnit | None:
        seg = self.queue.find(logical)
        if seg is None:
            return None
        with seg.select(logical - seg.start_offset, 20) as sl:
            if sl.status is not ReadStatus.OK:
                return None
            return CqUnit._make(UNIT.unpack_from(sl.view, 0))

    def get(self, queue_offset: int) -> CqUnit | None:
        """The unit at `queue_offset`; None below min, at/after max, or unavailable."""
        lo = queue_offset * 20
        if queue_offset < 0 or lo < self.min_logic_offset or lo + 20 > self.queue.max_offset():
            return None
        return self._unit_at(lo)

    def units(
        self, from_queue_offset: int, max_count: int, *, per_read: int = 1 << 62
    ) -> Iterator[tuple[int, CqUnit]]:
        """(queue offset, unit) from `from_queue_offset` up to the end, at most
        `max_count` of them, pre-blanks included. Units are read `per_read` at a time
        (default: the rest of each file), one held slice each, released before its units
        are yielded: a reader that may stop early (a pull) asks for a few, so that it
        unpacks no more than it uses."""
        for qo, seg, pos, n in self._reads(from_queue_offset, max_count, per_read):
            with seg.select(pos, n * 20) as sl:
                if sl.status is not ReadStatus.OK:
                    return
                out = [CqUnit._make(t) for t in UNIT.iter_unpack(sl.view)]
            yield from enumerate(out, qo)

    def unit_runs(
        self, from_queue_offset: int, max_count: int
    ) -> Generator[tuple[int, memoryview], None, None]:
        """`units` as raw runs: (the first unit's queue offset, a read-only view of the
        file's 20-byte units), one run per file. The file's slice is held until the next
        run is asked for (or the iterator is closed): read the view, never keep it."""
        for qo, seg, pos, n in self._reads(from_queue_offset, max_count, 1 << 62):
            with seg.select(pos, n * 20) as sl:
                if sl.status is not ReadStatus.OK:
                    return
                yield qo, sl.view

    def _reads(
        self, from_queue_offset: int, max_count: int, per_read: int
    ) -> Iterator[tuple[int, Segment, int, int]]:
        """Where `units` reads: (first queue offset, file, position, units), at most
        `per_read` units each, never across a file's end."""
        qo = max(from_queue_offset, self.min_offset())
        left = max_count
        while left > 0:
            lo = qo * 20
            seg = self.queue.find(lo)
            if seg is None:
                return
            pos = lo - seg.start_offset
            read = seg.read_position
            if pos >= read:
                return
            n = min(left, (read - pos) // 20, per_read)
            if n <= 0:
                return
            yield qo, seg, pos, n
            qo += n
            left -= n

    def offset_for_time(self, timestamp_ms: int, store_time_of: StoreTimeOf, log_min: int) -> int:
        """RocketMQ's getOffsetInQueueByTime (spec §3.6), over the whole queue.

        Binary search on store time (read from the commit log by `store_time_of`); units
        below commit-log offset `log_min` and pre-blanks count as older. An exact match
        gives the first unit with that store time; otherwise the closer of the last
        older and the first newer unit (ties: the older). Deviation: RocketMQ first picks
        a file by its mtime, which copying a store changes; this searches every file.
        Returns min_offset() for an empty queue. O(log units) commit-log reads.
        """
        lo, hi = self.min_offset(), self.max_offset()
        if lo >= hi:
            return lo
        first_ok = lo
        times: dict[int, int] = {}

        def time_at(qo: int) -> int:
            """Store time, or -1 for a unit that counts as older than anything."""
            if qo in times:
                return times[qo]
            u = self._unit_at(qo * 20)
            t = -1
            if u is not None and u.is_valid and not u.is_pre_blank and u.physical_offset >= log_min:
                t = store_time_of(u.physical_offset, u.size)
            times[qo] = t
            return t

        a, b = lo, hi  # first unit with time >= target lies in [a, b]
        while a < b:
            mid = (a + b) // 2
            if time_at(mid) < timestamp_ms:
                a = mid + 1
            else:
                b = mid
        right = a if a < hi else None
        if right is not None and time_at(right) == timestamp_ms:
            return right
        left = a - 1 if a - 1 >= first_ok and time_at(a - 1) >= 0 else None
        if left is None:
            return right if right is not None else lo
        if right is None:
            return left
        return left if timestamp_ms - time_at(left) <= time_at(right) - timestamp_ms else right

    # --- lifecycle and checks ---------------------------------------------------------

    def close(self) -> None:
        self.queue.close()

    def destroy(self) -> None:
        self.queue.destroy()
        self.max_physical_offset = -1
        self.min_logic_offset = 0

    def check(self) -> list[Finding]:
        """The file chain, then the units: commit-log offsets never go back, and no
        valid unit lies past the end (a unit the queue would overwrite)."""
        out = self.queue.check()
        prev = -1
        for qo, u in self.units(self.min_offset(), self.max_offset() - self.min_offset()):
            if u.is_pre_blank:
                continue
            if not u.is_valid:
                out.append(
                    Finding(Severity.ERROR, f"{self.key}: invalid unit {u} at queue offset {qo}")
                )
                continue
            if u.physical_offset < prev:
                out.append(
                    Finding(
                        Severity.ERROR,
                        f"{self.key}: unit at queue offset {qo} points back to "
                        f"{u.physical_offset} after {prev}",
                        self.directory,
                    )
                )
            prev = u.physical_offset
        last = self.queue.last()
        if last is not None and last.wrote_position + 20 <= last.size_bytes:
            nxt = last.read_bytes(last.wrote_position, 20)
            if len(nxt) == 20 and any(nxt):
                out.append(
                    Finding(
                        Severity.ERROR,
                        f"{self.key}: bytes past the end of the queue are not zero",
                        last.path,
                        last.wrote_position,
                    )
                )
        if self.min_offset() > self.max_offset():
            out.append(Finding(Severity.ERROR, f"{self.key}: min {self.min_offset()} > max"))
        return out

    def __repr__(self) -> str:
        return (
            f"ConsumeQueue({self.topic!r}, {self.queue_id}, min={self.min_offset()}, "
            f"max={self.max_offset()}, max_phys={self.max_physical_offset})"
        )
