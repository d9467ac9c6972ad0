"""Typed views over the control block's header, one per owner: the only way Python code
outside `ipc.control` reads or writes a header field.

The header's layout, with the view method that writes each field, is the table in
`ipc.control`'s docstring. A view's read properties are for anyone. Its write methods
each belong to one step, named in their docstrings and in `WRITERS`, which
`tests/runtime/test_control.py` checks against every call in the tree: "one writer per
field" is an API, not a convention. C writes some of the same fields
(`ipc/native/mqs_layout.h`: the reservation, the publisher); the native area at 2048 is
touched through `_native`'s helpers only.

Every read is one aligned int64 load and every write one aligned store (through
`ipc.control.words`: `struct.pack_into` clears the field first, and another process saw
that 0), as a reader that tolerates an older value needs (the module docstring of
`ipc.control`). The flags word, which several processes change at once, changes only
by one atomic read-modify-write (`Flags`); the counters' `+=` are not atomic: each has
one writer at a time, or is a statistic that may lose a count. A view holds the
block's buffer, not a copy: build one where the block is mapped (a worker's `__init__`,
or per call: it costs one object) and drop it with the block.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from mqstore import _native
from mqstore.ipc import control as c

_I64_UNPACK: Final = c.I64.unpack_from
_LAG_HIST_PACK: Final = struct.Struct(f"<{c.DISPATCH_LAG_BUCKETS}q").pack


class _Field:
    """A read-only int64 header field of a view: `view.name` loads it."""

    __slots__ = ("off",)

    def __init__(self, off: int) -> None:
        self.off = off

    def __get__(self, view: _View, owner: type | None = None) -> int:
        return int(_I64_UNPACK(view._buf, self.off)[0])


def _fields(*offs: int) -> tuple[_Field, ...]:
    return tuple(_Field(off) for off in offs)


class _View:
    __slots__ = ("_buf", "_words")
    _buf: bytearray | memoryview
    _words: memoryview

    def __init__(self, cb: c.ControlBlock | bytearray | memoryview) -> None:
        if isinstance(cb, c.ControlBlock):
            self._buf, self._words = cb.buf, cb.words
        else:  # a block mapped for one call (`ipc.fence`), or a test's buffer
            self._buf, self._words = cb, c.words(cb)

    def _set(self, off: int, value: int) -> None:
        # One store of the whole word: not struct's pack_into, which clears it first
        # and lets another process read a 0 (`ipc.control.words`).
        self._words[off >> 3] = value

    def _add(self, off: int, delta: int) -> None:
        # A load, then a store: for the counters only, each written by one step at a
        # time (the flusher's or the supervisor's drain flush, after the flusher has
        # stopped; the publisher under the commit lock; the dispatcher), never for a
        # word several processes change at once (`Flags._change`).
        self._words[off >> 3] += delta

    def _counts(self, off: int, buckets: int) -> list[int]:
        return [int(v) for v in struct.unpack_from(f"<{buckets}q", self._buf, off)]


# The flusher's sync round reads these once or twice a round, back to back under load:
# plain functions over the buffer, the same single loads as the views' fields without a
# descriptor call each (`workers.flusher`; 2.4 -> 1.0 µs of Python a round).


def flushed_pos(buf: memoryview) -> int:
    """`Positions.flushed`."""
    return int(_I64_UNPACK(buf, c.OFF_FLUSHED)[0])


def flushed_and_published_seq(buf: memoryview) -> tuple[int, int]:
    """(`Positions.flushed_seq`, `Positions.published_seq`)."""
    return int(_I64_UNPACK(buf, c.OFF_FLUSHED_SEQ)[0]), int(
        _I64_UNPACK(buf, c.OFF_PUBLISHED_SEQ)[0]
    )


def fsync_totals(buf: memoryview) -> tuple[int, int]:
    """(`FlushStats.fsync_slots`, `FlushStats.fsync_ns`): messages and ns of every force."""
    return int(_I64_UNPACK(buf, c.OFF_FSYNC_MSGS)[0]), int(_I64_UNPACK(buf, c.OFF_FSYNC_NS)[0])


class Positions(_View):
    """Where the log stands: reserved >= published >= committed >= flushed, and the
    dispatcher's position, with the store time and slot sequence each one reached."""

    # Each position with the slot sequence and store time it reached.
    reserved, seq = _Field(c.OFF_RESERVED), _Field(c.OFF_SEQ)
    published, published_seq, published_ts = _fields(
        c.OFF_PUBLISHED, c.OFF_PUBLISHED_SEQ, c.OFF_PUBLISHED_TS
    )
    committed, committed_seq, committed_ts = _fields(
        c.OFF_COMMITTED, c.OFF_COMMITTED_SEQ, c.OFF_COMMITTED_TS
    )
    flushed, flushed_seq, flushed_ts = _fields(c.OFF_FLUSHED, c.OFF_FLUSHED_SEQ, c.OFF_FLUSHED_TS)
    dispatched, allocated = _Field(c.OFF_DISPATCHED), _Field(c.OFF_ALLOCATED)
    commit_drain = _Field(c.OFF_COMMIT_DRAIN)

    def reserved_and_seq(self) -> tuple[int, int]:
        """`reserved_pos` and `seq` in one load: the commit point writes them in one."""
        reserved, seq = c.PAIR.unpack_from(self._buf, c.OFF_RESERVED)
        return int(reserved), int(seq)

    def readable_end(self, sync_flush: bool) -> int:
        """Where readers and the dispatcher stop: flushed under SYNC_FLUSH (nothing a
        crash can take back is consumed); under ASYNC_FLUSH what is in the files:
        committed with the pool on, published (complete records written straight into
        the mapping) with it off."""
        if sync_flush:
            return self.flushed
        pool_off = _I64_UNPACK(self._buf, c.OFF_POOL_BUFFERS)[0] == 0
        return self.published if pool_off else self.committed

    def seed_positions(self, end: int) -> None:
        """The supervisor at boot, before any worker or producer: every position at the
        recovered end."""
        for off in (
            c.OFF_RESERVED, c.OFF_PUBLISHED, c.OFF_COMMITTED, c.OFF_FLUSHED, c.OFF_DISPATCHED,
        ):  # fmt: skip
            self._set(off, end)

    def advance_committed(self, pos: int) -> None:
        """The commit step only (`ipc.commit.LogFiles.commit`, under the commit lock):
        everything below `pos` is in the files."""
        self._set(c.OFF_COMMITTED, pos)

    def set_commit_drain(self, nbytes: int) -> None:
        """The committer only (`ipc.commit_pace.CommitPace`): the bytes it commits in
        `commit_backlog_drain_ms` at its recent pace, 0 for no such bound. A put waits
        at a commit backlog that large (C `mqs_backlog_full`)."""
        self._set(c.OFF_COMMIT_DRAIN, nbytes)

    def stamp_committed(self, ts: int, seq: int) -> None:
        """The commit step only, after its last `advance_committed`: the store time and
        `published_seq` its commit covered."""
        self._set(c.OFF_COMMITTED_TS, ts)
        self._set(c.OFF_COMMITTED_SEQ, seq)

    def advance_flushed(self, pos: int, ts: int, seq: int) -> None:
        """The flush step only (`ipc.commit.LogFiles.flush_py`, the reference of the C
        step the flusher and the supervisor's drain run): the slot sequence and store
        time first, the position last, so a reader that sees the position sees what it
        covers."""
        self._set(c.OFF_FLUSHED_SEQ, seq)
        self._set(c.OFF_FLUSHED_TS, ts)
        self._set(c.OFF_FLUSHED, pos)

    def set_dispatched(self, pos: int) -> None:
        """The dispatcher only: the consume queues and the index hold every record
        below `pos` (written after the round's units reached every queue)."""
        self._set(c.OFF_DISPATCHED, pos)

    def raise_allocated(self, upto: int) -> None:
        """The allocator only (`workers.allocator.ensure_segments`, which the supervisor
        also runs at boot): the segment files below `upto` exist. Never lowered."""
        if upto > self.allocated:
            self._set(c.OFF_ALLOCATED, upto)

    def skip_to(self, pos: int) -> None:
        """A profiling harness standing in for the general path, the publisher and the
        committer at a segment's end (`bench/profile_put_native.py` only): reserved,
        published and committed at `pos`."""
        for off in (c.OFF_RESERVED, c.OFF_PUBLISHED, c.OFF_COMMITTED):
            self._set(off, pos)


class Reservation(_View):
    """The reservation step's fields besides the positions (`ipc.reservation`): the
    intent record of the producer inside the section, and its counters."""

    slot_count = _Field(c.OFF_SLOT_COUNT)  # the slot ring's rows, written once at create
    holder_pid = _Field(c.OFF_CS_PID)
    holder_seq = _Field(c.OFF_CS_SEQ)
    busy_waits = _Field(c.OFF_BUSY)
    lock_timeouts = _Field(c.OFF_LOCK_TIMEOUTS)  # waits refused: one holder held it too long
    lock_queued = _Field(c.OFF_LOCK_QUEUED)  # waits refused at their cap, no holder too long
    room_timeouts = _Field(c.OFF_ROOM_TIMEOUTS)  # refused after waiting for file/buffer/slots
    fillers = _Field(c.OFF_FILLERS)
    _stale = _Field(c.OFF_STALE_FROM)

    @property
    def stale_from(self) -> int:
        """The lowest log offset a fenced drain filled for a producer that may still
        live and write there (pool off: through its mapping), or -1 (`ipc.fence`)."""
        return self._stale - 1

    def commit_reservation(self, end: int, seq: int) -> None:
        """The lock holder only (C `mqs_reserve`; the sync-round profile stands in for
        it): the commit point, `reserved_pos` and `seq` in one store."""
        self._buf[c.OFF_RESERVED : c.OFF_RESERVED + 16] = c.PAIR.pack(end, seq)

    def mark_stale(self, offset: int) -> None:
        """The commit step's publisher only (`ipc.commit.LogFiles.publish` with `force`):
        it filled the reservation at `offset` though its producer may live."""
        if self.stale_from < 0 or offset < self.stale_from:
            self._set(c.OFF_STALE_FROM, offset + 1)

    def count_filler(self) -> None:
        """The commit step's publisher only (`ipc.commit.LogFiles.publish`): a slot
        filled for a producer that is gone."""
        self._add(c.OFF_FILLERS, 1)


class Flags(_View):
    """The store's state bits (`FLAG_NAMES`); C reads them in every put.

    Several processes change the word at once: the supervisor, any worker marking
    READ_ONLY, the fence's C `fetch_or` of FENCED | REFUSE_WRITES (`ipc/native/
    mqs_append.c`). Each change is one atomic read-modify-write (`_native.fetch_or`,
    `fetch_and_not`): a load then a store here lost a bit set in between, and a store
    without READ_ONLY or FENCED goes on acknowledging writes it must refuse."""

    word = _Field(c.OFF_FLAGS)

    def names(self) -> list[str]:
        word = self.word
        return [n for bit, n in c.FLAG_NAMES.items() if word & bit]

    def _change(self, flag: int, on: bool) -> None:
        if on:
            _native.fetch_or(self._buf, c.OFF_FLAGS, flag)
        else:
            _native.fetch_and_not(self._buf, c.OFF_FLAGS, flag)

    def mark_running(self) -> None:
        """The supervisor only, once boot is done (and the profiling harnesses that
        stand in for it)."""
        self._change(c.FLAG_RUNNING, True)

    def mark_refusing_writes(self) -> None:
        """The supervisor only, when its drain begins."""
        self._change(c.FLAG_REFUSE_WRITES, True)

    def mark_read_only(self) -> None:
        """After a failed write or fsync: any worker failing closed
        (`workers.service.fail_closed`), the flusher, the supervisor. Never cleared
        while the store runs."""
        self._change(c.FLAG_READ_ONLY, True)

    def mark_stopped(self) -> None:
        """The supervisor only, at the end of its drain (or over a crashed run's block,
        `ipc.fence.retire_leftovers`): STOPPED, then RUNNING off."""
        self._change(c.FLAG_STOPPED, True)
        self._change(c.FLAG_RUNNING, False)


class DiskWord(_View):
    """The cleaner's word about the disk (`engine.diskguard.encode_state`): bit 0
    DISK_FULL, bit 1 CLEAN_IMMEDIATELY, bits 16.. the usage in per mille."""

    word = _Field(c.OFF_DISK_STATE)

    def set_disk_state(self, word: int) -> None:
        """The cleaner only, after each disk check."""
        self._set(c.OFF_DISK_STATE, word)


class FlushStats(_View):
    """The flush step's counters, never reset."""

    fsyncs = _Field(c.OFF_FSYNC_COUNT)
    fsync_slots = _Field(c.OFF_FSYNC_MSGS)
    fsync_ns = _Field(c.OFF_FSYNC_NS)
    failures = _Field(c.OFF_FLUSH_FAILURES)

    def record_fsync(self, ns: int, slots: int) -> None:
        """The flush step only (`ipc.commit.LogFiles.flush_py`, the C step's reference),
        before it moves the flushed position: one force, its duration and the
        reservation slots it covered."""
        self._add(c.OFF_FSYNC_NS, ns)
        self._add(c.OFF_FSYNC_COUNT, 1)
        self._add(c.OFF_FSYNC_MSGS, slots)

    def count_flush_failure(self) -> None:
        """The flusher only, when a flush failed (after it marked the store read-only)."""
        self._add(c.OFF_FLUSH_FAILURES, 1)


class Histograms(_View):
    """The log2 histograms, never reset; the last bucket of each holds everything
    larger."""

    dispatch_lag_sum_ms = _Field(c.OFF_DISPATCH_LAG_SUM_MS)

    def fsync_us(self) -> list[int]:
        """fsyncs by duration (bucket 0: up to 2^FSYNC_HIST_SHIFT µs)."""
        return self._counts(c.OFF_FSYNC_HIST, c.FSYNC_HIST_BUCKETS)

    def group_commits(self) -> list[int]:
        """fsyncs by reservation slots covered (bucket 0: 1)."""
        return self._counts(c.OFF_GROUP_HIST, c.GROUP_HIST_BUCKETS)

    def dispatch_lag_ms(self) -> list[int]:
        """Records dispatched by dispatch time minus store time (bucket i: under 2^i ms)."""
        return self._counts(c.OFF_DISPATCH_LAG_HIST, c.DISPATCH_LAG_BUCKETS)

    def count_fsync(self, us: int, slots: int) -> None:
        """The flush step only (`ipc.commit.LogFiles.flush_and_wake_py`, the reference of
        the C step, `_native.sync_round` and `flush_step`), after a flush that forced:
        its duration and slots covered."""
        b = c.bucket_of(us, c.FSYNC_HIST_SHIFT, c.FSYNC_HIST_BUCKETS)
        self._add(c.OFF_FSYNC_HIST + 8 * b, 1)
        b = c.bucket_of(slots, 0, c.GROUP_HIST_BUCKETS)
        self._add(c.OFF_GROUP_HIST + 8 * b, 1)

    def store_dispatch_lag(self, counts: Sequence[int], sum_ms: int) -> None:
        """The dispatcher only, after a round: its whole lag histogram (it keeps the
        counts, continued from these at its start) and their sum in ms."""
        at = c.OFF_DISPATCH_LAG_HIST  # one copy a round, not pack_into (`ipc.control.words`)
        self._buf[at : at + 8 * c.DISPATCH_LAG_BUCKETS] = _LAG_HIST_PACK(*counts)
        self._set(c.OFF_DISPATCH_LAG_SUM_MS, sum_ms)


class DispatchStats(_View):
    """The dispatcher's statistics (its position is `Positions.dispatched`)."""

    last_ts = _Field(c.OFF_DISPATCHED_TS)
    records = _Field(c.OFF_DISPATCHED_RECORDS)

    def set_last_dispatched_ts(self, ts: int) -> None:
        """The dispatcher only: the store time of the last record it dispatched."""
        self._set(c.OFF_DISPATCHED_TS, ts)

    def set_dispatched_records(self, n: int) -> None:
        """The dispatcher only, after the round's lags: records dispatched since boot."""
        self._set(c.OFF_DISPATCHED_RECORDS, n)

    python_batches = _Field(c.OFF_PYTHON_BATCHES)

    def set_python_batches(self, n: int) -> None:
        """The dispatcher only, after a round: batches its C round declined since boot
        (the Python path's: a new queue's first, rare record types, re-dispatches)."""
        self._set(c.OFF_PYTHON_BATCHES, n)

    topics_deleted = _Field(c.OFF_TOPICS_DELETED)

    def count_topic_deleted(self) -> None:
        """The dispatcher only (`workers.topic_delete`), once a topic deleted while the
        store runs is wholly gone: readers drop their cached queues when it moves."""
        self._add(c.OFF_TOPICS_DELETED, 1)


# Each write method and the files that may call it (tests aside): checked by
# tests/runtime/test_control.py over every call in the tree.
WRITERS: Final[dict[str, tuple[str, ...]]] = {
    "seed_positions": ("workers/supervisor.py",),
    "advance_committed": ("ipc/commit.py",),
    "stamp_committed": ("ipc/commit.py",),
    "set_commit_drain": ("ipc/commit_pace.py",),
    "advance_flushed": ("ipc/commit.py",),
    "set_dispatched": ("workers/dispatcher.py",),
    "count_topic_deleted": ("workers/topic_delete.py",),
    "raise_allocated": (
        "workers/allocator.py",
        "bench/profile_put_native.py",
        "bench/flush_step_ir.py",
    ),
    "skip_to": ("bench/profile_put_native.py",),
    "commit_reservation": ("bench/profile_sync.py", "bench/flush_step_ir.py"),
    "count_filler": ("ipc/commit.py",),
    "mark_stale": ("ipc/commit.py",),
    "mark_running": (
        "workers/supervisor.py",
        "bench/profile_put_native.py",
        "bench/profile_sync.py",
        "bench/flush_step_ir.py",
    ),
    "mark_refusing_writes": ("workers/supervisor.py",),
    "mark_read_only": ("workers/service.py", "workers/flusher.py", "workers/supervisor.py"),
    "mark_stopped": ("workers/supervisor.py", "ipc/fence.py"),
    "set_disk_state": ("workers/cleaner.py",),
    "record_fsync": ("ipc/commit.py",),
    "count_flush_failure": ("workers/flusher.py",),
    "count_fsync": ("ipc/commit.py",),
    "store_dispatch_lag": ("workers/dispatcher.py",),
    "set_last_dispatched_ts": ("workers/dispatcher.py",),
    "set_dispatched_records": ("workers/dispatcher.py",),
    "set_python_batches": ("workers/dispatcher.py",),
}
