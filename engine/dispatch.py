"""Dispatch: commit log -> consume queues and index (RocketMQ's ReputMessageService,
spec §8.16, with `CommitLogDispatcherBuildConsumeQueue` and `...BuildIndex`).

`Dispatcher.dispatch(from_offset, limit)` walks the message records of the commit log
from `from_offset` and stops before any record that does not end at or below `limit`.
The caller chooses the limit: the committed offset under ASYNC_FLUSH, the flushed
offset under SYNC_FLUSH, so nothing a crash can take back is ever dispatched. It returns
how far it got (`DispatchResult.next_offset`); a process loop calls it again from there.

The walk is the record scanner's (`engine.scan.scan_records`, C): one call per segment
range gives the records as columns, and `dispatch_scan` applies the rules below to the
whole batch. A queue's units of the batch go in with one `ConsumeQueue.put_units` call
(one slice write per run of units in a file); the index keys come from the scan's
`key_hash` column and go in by runs of records (`IndexService.build_index_batch`, the
slot arithmetic in C). Batching changes no byte on disk: each queue and the index still
receive their entries in log order. Recovery's re-dispatch (`engine.redispatch`) drives
the same batches over its own walk.

The batches of a running store do not go through those steps one by one: a batch of
messages (NOT or COMMIT types, queue ids >= 0) and fillers without keys, whose queues the
store holds or the Python path has written (`_cursors`: good, live topics with a file),
whose units continue each queue (the next queue offset, past its commit-log end) and
whose first record the index does not hold yet, is scanned and written by the C round
(`_native.plain_round`, engine/native/mqs_dispatch_round.c), the same bytes in log order.
A file roll splits the batch into C calls: the round takes the records up to the first
whose queue's last file is full, or through the one whose keys fill the index's last
file, and says which; the Dispatcher makes that next file as the Python path does
(`SegmentQueue.get_last`: the file made ahead by the flush thread, renamed in;
`IndexService.file_for_keys`, with the keys that did not fit) and calls it again from
there (`_plain_batch`, `_roll`).

What the round declines, before writing a byte, goes through the path above
(`python_batches` counts those batches). Two cases make something the round cannot: a
new queue (its directory and first file, maybe past offset 0, and the cursor hand-over,
`_learn_cursors`) and the store's first index file. The others are rare
cases kept on the Python path, which has the per-status rules for them: a PREPARED /
ROLLBACK part (no unit; no keys for ROLLBACK), a refused record (a bad topic name, a
negative queue id: a `refused` entry), a record of a deleted topic, a filler with keys,
and units that do not continue their queue or records the index holds already (a
re-dispatch: ALREADY_BUILT / DUPLICATE / gap statuses; recovery calls `dispatch_scan`
itself). In the perf checks (`dispatch_lag.py`, put_shapes.py, small queue and index
files, killed producers, delayed messages) the only Python batches left are the first
of each new queue; file rolls and fillers were the rest before the round took them.
`Dispatcher(plain_c=False)` keeps every batch on the Python path: the reference that
tests/native/test_dispatch_round_diff.py compares the C round with.

A roll that fails (the next consume-queue or index file cannot be made: ENOSPC, EIO)
raises StoreIOError out of `dispatch`, and the two paths leave different files by
design; what they share is the rule that the queues and the index then both end before
the same record (records without keys aside), whatever way the store goes on. The
Python path writes a batch queue by queue, then its keys: it cuts the units back to
the first record of the batch that its queue or the index lacks (`_cut_back`). The C
round writes record by record: a queue roll that fails is handed to the Python path
(which fails the same way and cuts back what it wrote); an index roll that fails cuts
only the unit of the record whose keys did not fit (the records before it went in
whole). Either path drops that record's keys from the full index file
(`drop_split_keys`): left there, the record would count as indexed and its other keys
would never be put. So a record is never held by its queue and lacked by the index: a
normal start (after a store stopped while the dispatcher waited for space) re-dispatches
from the queues' end only, and would leave it unfindable by key. From there the
dispatcher waits for space and dispatches again from the round's start (units it finds
come back ALREADY_BUILT, the index skips what it holds), or, after an EIO (read-only),
the next start's recovery re-dispatches what the queues or the index lack; every way,
both paths end with the bytes a run without the fault writes
(tests/native/test_dispatch_round_faults.py). A dispatcher killed between a record's
first keys and the roll (no exception, nothing dropped) leaves the split record for its
successor, which drops it at its start (`drop_split_keys` from where it resumes) and
dispatches it again whole.

For every record:

* BLANK (end of segment): hop to the next segment (the walk does it);
* a filler (`engine.filler.is_filler`, what the publisher writes over a dead producer's
  reservation): no index entries; if it holds a queue offset, that offset gets a
  pre-blank unit, so the queue stays dense, its max offset is right after recovery, and
  readers skip it without decoding it;
* a record whose topic breaks RocketMQ's name rule (`engine.names`; the client never
  writes one, an older store or another writer might) or whose queue id is negative:
  no consume-queue unit and no directory, only an entry in `DispatchResult.refused`;
* NOT / COMMIT transaction types: a consume-queue unit at the record's queue offset
  (checked against the queue's own end: duplicates are ignored, gaps are filled with
  pre-blanks and counted, as `ConsumeQueue.put` says); PREPARED / ROLLBACK: none;
* every type but ROLLBACK: index entries (`topic#UNIQ_KEY`, `topic#key` per KEYS token),
  when an `IndexService` is given.
* a record of a topic deleted by `mqstore topic DIR delete`, below the end offset the
  deletion recorded (`engine.deleted_topics`): nothing, so a deleted topic's queues never
  come back from the records that stay in the log.

After each unit written the checkpoint's `logics_msg_timestamp` becomes the record's
store time (in memory; whoever flushes consume queues persists it, spec §5).

Re-dispatching what is already there is harmless (RocketMQ's rule: a queue ignores units
whose commit-log end is not past its own; the index ignores offsets before its end), which
is what abnormal recovery relies on.

Called by the dispatcher process (its own read-only view of the log) and by recovery.
Not thread-safe.
"""

from __future__ import annotations

import enum
import mmap
import os
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import add
from typing import Final

from mqstore import _native
from mqstore.engine import deleted_topics
from mqstore.engine.checkpoint import CheckpointFields
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import ConsumeQueue, PutStatus, QueueKey, Unit
from mqstore.engine.consumequeue_files import CQ_STORE_UNIT_SIZE, UNIT, Group
from mqstore.engine.consumequeue_files import group_units_c as group_units
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.fileio import StoreIOError, is_no_space
from mqstore.engine.indexfile import IndexFile, KeyBatch
from mqstore.engine.indexservice import IndexService
from mqstore.engine.names import topic_problem
from mqstore.engine.reader import Geometry
from mqstore.engine.record import (
    TRANSACTION_MASK,
    CheckStatus,
    RecordHeader,
    check_record,
    takes_queue_offset,
)
from mqstore.engine.recordcodes import DELAY_LEVEL_MS, decode_utf8
from mqstore.engine.scan import (
    BIT_FILLER,
    RecordScan,
    ScanStop,
    delay_table,
    scan_records,
    scan_summary,
)
from mqstore.engine.segment import ReadStatus
from mqstore.engine.segment_queue import SegmentQueue

_TX_MASK: Final = TRANSACTION_MASK
_TX_COMMIT: Final = 0x8
_TX_ROLLBACK: Final = 0xC
_plain_round: Final = _native.plain_round
_OK_ONLY: Final = (PutStatus.OK,)


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What a record tells its consume queue and the index (RocketMQ's DispatchRequest)."""

    topic: str
    queue_id: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    keys: str | None
    uniq_key: str | None
    sys_flag: int
    prepared_transaction_offset: int

    @classmethod
    def from_header(cls, offset: int, h: RecordHeader) -> DispatchRequest:
        """From a checked record at log `offset` (the position, not the stored field)."""
        return cls(
            h.topic,
            h.queue_id,
            offset,
            h.size,
            h.tags_code,
            h.store_timestamp,
            h.queue_offset,
            h.keys,
            h.uniq_key,
            h.sys_flag,
            h.prepared_transaction_offset,
        )


class DispatchStop(enum.Enum):
    """Why `dispatch` stopped; `next_offset` is where the next call starts."""

    LIMIT = "LIMIT"  # reached the limit, or the next record ends past it
    END_OF_DATA = "END_OF_DATA"  # zeros: nothing more written yet
    WAIT_NEXT_SEGMENT = "WAIT_NEXT_SEGMENT"  # a BLANK ends the last segment known
    MAX_RECORDS = "MAX_RECORDS"  # `max_records` reached
    CORRUPT = "CORRUPT"  # an invalid record (reason says why); recovery's business
    OFFSET_NOT_FOUND = "OFFSET_NOT_FOUND"  # from_offset is in no segment


@dataclass(slots=True)
class DispatchResult:
    from_offset: int
    next_offset: int
    stop: DispatchStop
    reason: str = ""
    records: int = 0  # message records walked (skipped ones included)
    units_written: int = 0
    skipped: int = 0  # fillers (a pre-blank unit each) and records of deleted topics
    index_keys: int = 0
    last_store_timestamp: int = 0
    put_statuses: Counter[PutStatus] = field(default_factory=Counter)
    refused: list[tuple[QueueKey, int, int]] = field(default_factory=list)  # key, qo, phys
    # queues a unit came to past their end: pre-blanks filled the gap (recovery re-dispatches
    # such a queue from its end, `engine.recovery`)
    gaps_filled: set[QueueKey] = field(default_factory=set)
    seconds: float = 0.0


class Dispatcher:
    """Builds consume queues and the index from the commit log. See the module doc."""

    def __init__(
        self,
        log: CommitLog,
        queues: ConsumeQueueStore,
        index: IndexService | None = None,
        *,
        checkpoint: CheckpointFields | None = None,
        delay_ms: tuple[int, ...] = DELAY_LEVEL_MS,
        plain_c: bool = True,
    ) -> None:
        self.log = log
        # The store's delay table (`message_delay_level`): a schedule-topic record's
        # tags code is its delivery time by it (ScheduleMessageService).
        self.delay_ms = delay_ms
        self.queues = queues
        self.index = index
        self.checkpoint = checkpoint
        # Topics deleted while the store was stopped: their records below the end offset
        # stay out of the queues and the index (engine.deleted_topics).
        self.deleted = deleted_topics.load(queues.store_dir)
        # Dispatch lag per record, when a caller wants it (the dispatcher process's
        # metrics): bucket i counts records dispatched within 2^i ms of their store time.
        self.lag_hist: list[int] | None = None
        self.lag_sum_ms = 0
        # Recovery sets `defer_on_no_space`: a record whose consume-queue file cannot be
        # created on a full disk, and every record after it, is left to the dispatcher
        # process (it resumes from the queues' end once there is room), so that a full
        # disk never stops a store from booting. `deferred` says why ("" if nothing was).
        self.defer_on_no_space = False
        self.deferred = ""
        # The next queue offset of each queue as the deferred records say: the queues
        # lag the log, and the producers' offset table must not (recovery merges it).
        self.deferred_next: dict[QueueKey, int] = {}
        self._at = 0  # the log offset being written, for `deferred`
        # The queues given units since the owner last took this set (the dispatcher
        # process checks them for a next file to make ahead, `workers.cq_flusher`).
        self.touched: set[ConsumeQueue] = set()
        self._topic_cache: dict[bytes, str] = {}
        self._topic_problems: dict[str, bool] = {}
        # The plain round in C (`_native.plain_round`, engine/native/mqs_dispatch_round.c):
        # a batch of plain messages whose queues all have a cursor here goes through one C
        # call that writes the bytes `dispatch_scan` would; any other batch is declined
        # before a byte is written and goes through `dispatch_scan`, which then hands
        # over the cursors of the queues it wrote (`_learn_cursors`). `plain_c=False`
        # keeps every batch in Python: the reference the differential test compares with.
        self.plain_c = plain_c
        self.plain_rounds = 0  # calls of the C round that wrote (a roll splits a batch)
        self.python_batches = 0  # batches (or their rest) the C round declined
        self._cursors: dict[tuple[bytes, int], ConsumeQueue] = {}
        self._index_target: tuple[IndexFile, tuple[mmap.mmap, int, int]] | None = None
        self._delays = None if delay_ms is DELAY_LEVEL_MS else delay_table(delay_ms)

    @classmethod
    def open(
        cls,
        store_dir: str | os.PathLike[str],
        geometry: Geometry,
        *,
        checkpoint: CheckpointFields | None = None,
        index_enabled: bool = True,
        max_msgs_num_batch: int = 64,
        on_index_roll: Callable[[int], None] | None = None,
        defer_index_roll_flush: bool = False,
        delay_ms: tuple[int, ...] = DELAY_LEVEL_MS,
    ) -> Dispatcher:
        """The dispatcher process's set-up: a read-only view of the commit log (it follows
        the appenders through `SegmentQueue.refresh`), the consume queues opened for
        writing and recovered (positions found: the last 3 files of each), the index
        loaded. Start dispatching from `resume_offset()`. `close()` closes them all.
        `defer_index_roll_flush`: see `IndexService` (the dispatcher process flushes a
        full index file in its flush thread, not on the roll).
        Raises SegmentSizeError, IndexGeometryError, StoreIOError."""
        d = os.fspath(store_dir)
        q = SegmentQueue(os.path.join(d, "commitlog"), geometry.segment_size_bytes, read_only=True)
        q.load()
        log = CommitLog(q)
        queues = ConsumeQueueStore(d, geometry.cq_file_size_bytes).load()
        queues.recover()
        index = None
        if index_enabled:
            index = IndexService(
                d,
                geometry.hash_slot_num,
                geometry.index_num,
                max_msgs_num_batch=max_msgs_num_batch,
                on_roll=on_index_roll,
                defer_roll_flush=defer_index_roll_flush,
            )
            index.load()
        return cls(log, queues, index, checkpoint=checkpoint, delay_ms=delay_ms)

    def resume_offset(self, published: int | None = None) -> int:
        """Where dispatching resumes (RocketMQ's reputFromOffset at start): the queues'
        max physical offset, at least the log's first offset. Re-dispatching a few
        records (transactions, fillers) from there is harmless.

        `published`: the position a dispatcher that ran before in this boot last
        published (`Positions.dispatched`, written after a round's units reached every queue).
        A round writes its units queue by queue, so a kill between two queues leaves one
        queue ahead of the others; resuming from the furthest queue would fill the
        others' units of that round with pre-blanks (RocketMQ dispatches one record at a
        time and has no such window). Resuming at or below `published` does the round
        again: units already written are ALREADY_BUILT and the index skips what it holds.
        """
        furthest = max(self.queues.max_physical_offset(), self.log.min_offset(), 0)
        if published is None:
            return furthest
        return max(min(furthest, published), self.log.min_offset(), 0)

    def forget_topic(self, topic: str, end_offset: int) -> None:
        """`topic` was deleted while the store runs (`workers.topic_delete`), its records
        below `end_offset` out of the queues and the index: drop its queues (their
        directory is gone) and skip those records from now on; its records at or past
        `end_offset` make a new topic from queue offset 0."""
        self.deleted[topic] = max(end_offset, self.deleted.get(topic, -1))
        self._cursors.clear()
        self.touched = {cq for cq in self.touched if cq.key[0] != topic}
        self.queues.forget(topic)

    def close(self) -> None:
        """Close the log view, the queues and the index (not the checkpoint)."""
        self.log.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()

    def dispatch(
        self, from_offset: int, limit: int, *, max_records: int | None = None
    ) -> DispatchResult:
        """Dispatch records from `from_offset` while they end at or below `limit`.

        A read-only log (another process appends) is refreshed once when the walk runs
        off its last known segment. Raises StoreIOError (consume-queue or index files).
        O(records + bytes of their properties).
        """
        t0 = time.perf_counter()
        res = self._walk(from_offset, limit, max_records)
        if res.stop in (DispatchStop.WAIT_NEXT_SEGMENT, DispatchStop.OFFSET_NOT_FOUND) and (
            self.log.queue.read_only and self.log.queue.refresh()
        ):
            more = self._walk(res.next_offset, limit, max_records)
            more.from_offset = res.from_offset
            more.records += res.records
            more.units_written += res.units_written
            more.skipped += res.skipped
            more.index_keys += res.index_keys
            more.put_statuses.update(res.put_statuses)
            more.refused[:0] = res.refused
            more.last_store_timestamp = more.last_store_timestamp or res.last_store_timestamp
            res = more
        res.seconds = time.perf_counter() - t0
        return res

    def _walk(self, from_offset: int, limit: int, max_records: int | None) -> DispatchResult:
        """Scan segment by segment (`engine.scan.scan_records`) and dispatch each batch."""
        res = DispatchResult(from_offset, from_offset, DispatchStop.END_OF_DATA)
        if from_offset >= limit:
            res.stop = DispatchStop.LIMIT
            return res
        queue = self.log.queue
        seg = queue.find(from_offset)
        if seg is None:
            at_end = from_offset == queue.max_offset() or (len(queue) == 0 and from_offset == 0)
            res.stop = DispatchStop.END_OF_DATA if at_end else DispatchStop.OFFSET_NOT_FOUND
            return res
        left = -1 if max_records is None else max_records
        pos = from_offset - seg.start_offset
        while True:
            base, read = seg.start_offset, seg.read_position
            with seg.select(0, read) as sl:
                if sl.status is not ReadStatus.OK:
                    res.stop, res.reason = DispatchStop.CORRUPT, f"segment {sl.status}"
                    return res
                end = min(read, limit - base)
                count, stop, stop_pos = self._plain_batch(sl.view, base, pos, end, left, res)
                if stop is None:  # declined (from stop_pos on): the Python path takes it
                    more = left - count if left > 0 else left
                    sc = scan_records(sl.view, stop_pos, end, check_crc=False,
                                      max_records=more, delay_ms=self.delay_ms)  # fmt: skip
                    self.dispatch_scan(sl.view, base, sc, res)
                    self.python_batches += sc.count > 0
                    count, stop, stop_pos = count + sc.count, sc.stop, sc.stop_pos
                res.next_offset = base + stop_pos
                left -= count if left > 0 else 0
                if stop is ScanStop.CORRUPT:
                    res.stop, res.reason = _why_stopped(sl.view, stop_pos, read)
                    return res
            if left == 0:
                res.stop = DispatchStop.MAX_RECORDS
                return res
            if res.next_offset >= limit:
                res.stop = DispatchStop.LIMIT
                return res
            nxt = queue.find(base + seg.size_bytes)
            if stop is ScanStop.BLANK and nxt is None:
                res.stop = DispatchStop.WAIT_NEXT_SEGMENT
                return res
            if nxt is None or (stop is ScanStop.LIMIT and stop_pos < seg.size_bytes):
                return res  # END_OF_DATA: the readable end of the last segment
            seg, pos = nxt, 0

    def _plain_batch(
        self, buf: memoryview, base: int, pos: int, end: int, left: int, res: DispatchResult
    ) -> tuple[int, ScanStop | None, int]:
        """The batch at buf[pos:end] through the C plain round, as far as it takes it:
        (count, stop, stop_pos), with `res`, the lag histogram and the checkpoint updated
        as `dispatch_scan` updates them. A stop of None: the round declined the records
        from stop_pos on (count taken before them), nothing of them written. Between
        calls it makes the next file the round asks for (`_roll`)."""
        total = 0
        if self.plain_c and not self._cursors:
            self._learn_known_queues()
        while self.plain_c and not self.deferred and self._cursors:
            target = self._index_mapping()
            lag = self.lag_hist
            buckets = 0 if lag is None else len(lag)
            now_ms = time.time_ns() // 1_000_000 if buckets else 0
            got = _plain_round(buf, base, pos, end, left, self._delays, self._cursors, target,
                               now_ms, buckets, self.touched)  # fmt: skip
            if got is None:
                break
            self.plain_rounds += 1
            count, stop, stop_pos, keys, last_ts, lag_sum, lag_counts, more, fillers = got
            if count:
                res.records += count
                res.units_written += count - fillers
                res.skipped += fillers  # (each a pre-blank unit, status OK)
                res.put_statuses[PutStatus.OK] += count
                res.index_keys += keys
                if last_ts >= 0:  # a message's unit, not only pre-blanks
                    res.last_store_timestamp = last_ts
                    if self.checkpoint is not None:
                        self.checkpoint.logics_msg_timestamp = last_ts
                if lag is not None:
                    self.lag_sum_ms += lag_sum
                    for b, n in enumerate(lag_counts):
                        if n:
                            lag[b] += n
            total += count
            pos = stop_pos
            if left > 0:
                left -= count
            if more is not None and not self._roll(more, buf, base):
                break
            if stop >= 0:
                return total, ScanStop(stop), stop_pos
        return total, None, pos

    def _index_mapping(self) -> tuple[mmap.mmap, int, int] | tuple[()] | None:
        """The index's last file as the C round takes it; None: no index; (): no file
        yet (the first key makes it, as in `build_index_batch`: `_roll`)."""
        index = self.index
        if index is None:
            return None
        if not index.files:
            return ()
        last = index.files[-1]
        known = self._index_target
        if known is None or known[0] is not last:
            known = self._index_target = (last, (last.mm, last.hash_slot_num, last.index_num))
        return known[1]

    def _roll(
        self, more: ConsumeQueue | tuple[bytes, int, int] | bool, buf: memoryview, base: int
    ) -> bool:
        """What the C round asked for before its next call, as the Python path does it:
        the next file of a queue whose last file is full (`SegmentQueue.get_last`: a
        prepared file renamed in, or a new one), the next index file with the keys of
        the last record taken that did not fit in the full one, or (True) the first
        index file. False: the queue's file
        could not be made; the Python path takes the rest (and says why, or defers).
        Raises StoreIOError (the index roll), after dropping that record's keys from the
        full file and its unit from its queue (the module doc: the queues and the index
        then both end before it; `buf`, from log offset `base`, holds it)."""
        if isinstance(more, ConsumeQueue):
            q = more.queue
            last = q.last()
            assert last is not None
            try:
                q.get_last(last.start_offset + last.wrote_position)
            except StoreIOError:
                return False
            return True
        assert self.index is not None
        if more is True:
            self.index.file_for_keys()
            return True
        assert isinstance(more, tuple)
        hashes, phys, ts = more
        pending = array("i")
        pending.frombytes(hashes)
        one = KeyBatch(array("i", [0, len(pending)]), pending, array("q", [0]),
                       array("q", [ts]), phys, 0, 1)  # fmt: skip
        k = 0
        try:
            while k < len(pending):
                k = self.index.file_for_keys().put_hashes(one, k)
        except StoreIOError:
            self._cursors.clear()
            self.drop_split_keys(phys)
            h = check_record(buf, phys - base, check_crc=False, read_body=False)
            cq = self.queues.get(h.topic, h.queue_id)  # a plain message's: it has one
            if cq is not None and cq.max_offset() > h.queue_offset:
                cq.cut_at(h.queue_offset)
            raise
        return True

    def drop_split_keys(self, first: int) -> None:
        """An index roll failed (the next file could not be made) while the record at the
        full last file's end, at or past log offset `first`, had keys left to put: drop
        the keys of that record the full file took (`IndexFile.truncate`), so that the
        index holds whole records only. Otherwise the record, at the file's end, would
        count as indexed (`build_index_batch` and recovery's `Holdings` skip it) and the
        keys that did not fit would never be put: lost to `query`. Dispatched again
        (the dispatcher waits for space and starts over from the round's start; a
        restart's recovery re-dispatches what the index lacks), it goes in whole, the
        bytes a run without the fault writes. A record whose keys all fit is dropped
        too (harmless: it is dispatched again as well); one before `first` is never
        touched (it was indexed whole before this batch: nothing dispatches it again).

        The dispatcher process also calls it at its start with where it resumes: a
        dispatcher killed between a record's first keys and the roll (no exception, so
        nothing dropped) left the same split record, and it dispatches it again. Killed
        just after the roll made the next file, before a key went in, it left that file
        empty, its header saying the split record is indexed: the file goes (it holds
        nothing; the roll makes one again). Raises StoreIOError (that unlink)."""
        index = self.index
        if index is None or not index.files:
            return
        files = index.files
        if (
            len(files) > 1
            and files[-1].index_count <= 1
            and files[-2].is_write_full()
            and files[-2].end_phy_offset >= first
        ):
            files.pop().destroy()
        last = files[-1]
        end = last.end_phy_offset
        if not (last.is_write_full() and end >= first):
            return
        # The header goes back to the last record kept, its store time in ms read from
        # the log (`IndexFile.truncate`). A file left holding nothing (all its keys the
        # record's: a record with more keys than a file) goes, and the record's keys
        # before it too: its header would say the record is indexed.
        while files and files[-1].truncate(end, self.log.store_time_of):
            if files[-1].index_count > 1:
                break
            gone = files.pop()
            if gone in index.rolled:
                index.rolled.remove(gone)
            gone.destroy()

    def _learn_known_queues(self) -> None:
        """A cursor for each queue the store holds (opened and recovered with the
        dispatcher, or kept after `forget_topic`), by `_learn_cursors`' rules, so that
        the first batches after a start go through the C round too."""
        cursors = self._cursors
        for cq in self.queues:
            topic, q = cq.key
            if not self._may_take(topic, q):
                continue
            try:
                cursors[(topic.encode("utf-8"), q)] = cq
            except UnicodeEncodeError:  # not the bytes of any record: no cursor
                continue

    def _may_take(self, topic: str, queue_id: int) -> bool:
        """Whether the C round may write queue (`topic`, `queue_id`): a good topic, not
        deleted, a queue id >= 0 (the rule of both ways a cursor is learnt)."""
        return queue_id >= 0 and topic not in self.deleted and not self._bad_topic(topic)

    def _learn_cursors(self, buf: memoryview, sc: RecordScan) -> None:
        """A cursor for each queue of the batch that the C round may write (`_may_take`)
        and that exists."""
        cursors = self._cursors
        tp, tl = sc.topic_pos, sc.topic_len
        rows = zip(tp, tl, sc.queue_id, strict=True)
        for raw, q in {(bytes(buf[p : p + n]), q) for p, n, q in rows}:
            if (raw, q) in cursors or q < 0:
                continue
            name = self._topic_name(raw)
            if not self._may_take(name, q):
                continue
            cq = self.queues.get(name, q)
            if cq is not None:
                cursors[(raw, q)] = cq

    def dispatch_scan(
        self, buf: memoryview, base: int, sc: RecordScan, res: DispatchResult
    ) -> None:
        """Dispatch the records of a scan of `buf` (a segment's bytes from log offset
        `base`) into `res` (recovery drives its own validating walk and may call this).
        Raises StoreIOError (with `defer_on_no_space`, not for a full disk: see
        `deferred`)."""
        if not sc.count:
            return
        res.records += sc.count
        flags = self._summarise(sc)
        if not self.deferred:
            try:
                self._dispatch_columns(buf, base, sc, res, flags)
                if self.plain_c:
                    self._learn_cursors(buf, sc)
                return
            except StoreIOError as e:
                self._cursors.clear()
                self._cut_back(buf, base, sc)
                if not (self.defer_on_no_space and is_no_space(e)):
                    raise
                self.deferred = f"dispatch from {self._at} left to the dispatcher: {e}"
        topics = self._topics(buf, sc)
        for i in range(sc.count):
            if takes_queue_offset(sc.sys_flag[i]) and sc.queue_id[i] >= 0:
                key = (topics[i], sc.queue_id[i])
                nxt = sc.queue_offset[i] + 1
                self.deferred_next[key] = max(self.deferred_next.get(key, 0), nxt)

    def _cut_back(self, buf: memoryview, base: int, sc: RecordScan) -> None:
        """Drop the units a failed batch wrote at or past the record being written
        (`_at`). A batch writes queue by queue, not in log order, but recovery restarts
        dispatch at the queues' highest unit (RocketMQ's rule), so the units must stay a
        prefix of the log: a queue whose file could not be made (a full disk) would
        otherwise lose the records that other queues' units already passed. `_at` first
        moves back to the batch's first record that its queue lacks: the queue that
        failed may come after another in the batch whose units it did not reach; then to
        its first record with keys that the index lacks (the keys go in after the
        units): a normal recovery re-dispatches from the queues' end only, so a record
        the queues hold and the index lacks (a store stopped while the dispatcher waited
        for space) would never get its keys."""
        first: dict[QueueKey, int] = {}
        topics = self._topics(buf, sc)
        ends: dict[QueueKey, int] = {}
        for i in range(sc.count):
            if base + sc.pos[i] >= self._at:
                break
            if takes_queue_offset(sc.sys_flag[i]) and sc.queue_id[i] >= 0:
                key = (topics[i], sc.queue_id[i])
                if key not in ends:
                    cq = self.queues.get(*key)
                    ends[key] = -1 if cq is None else cq.max_physical_offset
                if base + sc.pos[i] + sc.size[i] > ends[key]:
                    self._at = base + sc.pos[i]
                    break
        self._at = min(self._at, self._first_unindexed(base, sc))
        for i in range(sc.count):
            if base + sc.pos[i] >= self._at and sc.queue_id[i] >= 0:
                first.setdefault((topics[i], sc.queue_id[i]), sc.queue_offset[i])
        for key, qo in first.items():
            cq = self.queues.get(*key)
            if cq is not None and cq.max_offset() > qo:
                cq.cut_at(qo)

    def _first_unindexed(self, base: int, sc: RecordScan) -> int:
        """The log offset of the batch's first record with keys that the index does not
        hold (past the newest file's end, or at it with no keys there: `Holdings`' rule);
        past the log when there is none (or no index). O(records), on a failure only."""
        index = self.index
        if index is None:
            return 1 << 62
        end, has_end = -1, False
        if index.files:
            last = index.files[-1]
            end, has_end = last.end_phy_offset, last.end_timestamp > 0
        kf, pos = sc.key_first, sc.pos
        for i in range(sc.count):
            off = base + pos[i]
            if kf[i + 1] > kf[i] and (off > end or (off == end and not has_end)):
                return off
        return 1 << 62

    def _topics(self, buf: memoryview, sc: RecordScan) -> list[str]:
        """Each record's topic (decoded as check_record does; cached by its bytes)."""
        cache = self._topic_cache
        tp = sc.topic_pos
        raws = list(map(bytes, map(buf.__getitem__, map(slice, tp, map(add, tp, sc.topic_len)))))
        out: list[str | None] = list(map(cache.get, raws))
        if None in out:
            for raw in set(raws) - cache.keys():
                self._topic_name(raw)
            out = list(map(cache.get, raws))
        return out  # type: ignore[return-value]  # every raw is in the cache now

    def _summarise(self, sc: RecordScan) -> int:
        """One pass over the batch in C (`engine.scan.scan_summary`): per record, dispatch
        time minus store time into the lag histogram (when kept); returns the SUMMARY_*
        flags `_plain` reads."""
        lag = self.lag_hist
        buckets = 0 if lag is None else len(lag)
        now_ms = time.time_ns() // 1_000_000 if buckets else 0
        s = scan_summary(sc, now_ms, buckets)
        if lag is not None:
            self.lag_sum_ms += s.lag_sum_ms
            for b, n in enumerate(s.lag_counts):
                if n:
                    lag[b] += n
        return s.flags

    def _dispatch_columns(
        self,
        buf: memoryview,
        base: int,
        sc: RecordScan,
        res: DispatchResult,
        flags: int,
    ) -> None:
        """The module doc's rules over a batch: consume-queue units per queue (one
        `put_units` each), then index keys for runs of records that take them."""
        groups = group_units(
            buf, sc.topic_pos, sc.topic_len, sc.queue_id, sc.queue_offset, sc.pos,
            sc.size, sc.tags_code, base,
        )  # fmt: skip
        names = {raw: self._topic_name(raw) for raw in {g[0] for g in groups}}
        if self._plain(set(names.values()), flags):
            self._dispatch_groups(base, groups, names, sc, res)
            return
        topics = self._topics(buf, sc)
        units: dict[QueueKey, list[Unit]] = {}
        with_pre_blanks: set[QueueKey] = set()
        no_index: list[int] = []  # records with keys that must not be indexed
        bad = {t: self._bad_topic(t) for t in set(topics)}
        deleted, key_first = self.deleted, sc.key_first
        rows = zip(
            topics, sc.pos, sc.queue_id, sc.queue_offset, sc.size, sc.tags_code, sc.sys_flag,
            sc.bits, strict=True,
        )  # fmt: skip
        for i, (topic, p, q, qo, size, tags, sf, bits) in enumerate(rows):
            tx = sf & _TX_MASK
            takes = tx == 0 or tx == _TX_COMMIT
            if deleted and base + p < deleted.get(topic, -1):
                res.skipped += 1  # a record of a deleted topic
                indexed = False
            elif bits & BIT_FILLER:
                res.skipped += 1  # a pre-blank keeps the queue dense; no index keys
                if takes and q >= 0 and not bad[topic]:
                    units.setdefault((topic, q), []).append((qo, -1, 0, 0, i))
                    with_pre_blanks.add((topic, q))
                indexed = False
            else:
                if takes and (q < 0 or bad[topic]):
                    res.refused.append(((topic, q), qo, base + p))
                elif takes:
                    units.setdefault((topic, q), []).append((qo, base + p, size, tags, i))
                indexed = tx != _TX_ROLLBACK
            if not indexed and key_first[i + 1] > key_first[i]:
                no_index.append(i)
        last = self._write_units(base, units, with_pre_blanks, res)
        self._note_last_unit(last, sc.store_timestamp, res)
        if self.index is not None:
            self._build_index(base, sc, no_index, res)

    def _plain(self, distinct: set[str], flags: int) -> bool:
        """Whether every record of the batch is a message of a good, live topic that
        takes a queue unit and index keys: the common case, checked column-wide (`flags`:
        `_summarise`'s, no filler, no PREPARED / ROLLBACK part, no negative queue id)."""
        return (
            not flags
            and not any(map(self._bad_topic, distinct))
            and not (self.deleted and not distinct.isdisjoint(self.deleted))
        )

    def _dispatch_groups(
        self,
        base: int,
        groups: list[Group],
        names: dict[bytes, str],
        sc: RecordScan,
        res: DispatchResult,
    ) -> None:
        """`_dispatch_columns` for a batch `_plain` accepts, grouped per queue in C
        (`consumequeue_files.group_units`): a dense group that continues its queue is one
        `append_units`; any other goes unit by unit (`put_units`). Then every key."""
        # The statuses are counted here and go into `res` once: a Counter keyed by an
        # enum hashes in Python (two calls a group), a fixed cost of every round.
        last = -1
        ok = built = 0
        rest: dict[QueueKey, list[Unit]] = {}
        pos, find_or_create, touched = sc.pos, self.queues.find_or_create, self.touched
        try:
            for raw, q, first_qo, dense, records, packed in groups:
                recs = memoryview(records).cast("i")
                self._at = base + pos[recs[0]]
                cq = find_or_create(names[raw], q)
                touched.add(cq)
                if dense and cq.append_units(first_qo, packed):
                    ok += len(recs)
                    if recs[-1] > last:
                        last = recs[-1]
                elif _unit_end(packed, len(recs) - 1) <= cq.max_physical_offset:
                    # the queue holds them all (a re-dispatch): `put` says so of each
                    built += len(recs)
                else:
                    rest[(names[raw], q)] = [
                        (sc.queue_offset[i], base + pos[i], sc.size[i], sc.tags_code[i], i)
                        for i in recs
                    ]
        finally:  # a full disk raised: what went in before is counted, as it was
            if ok:
                res.put_statuses[PutStatus.OK] += ok
                res.units_written += ok
            if built:
                res.put_statuses[PutStatus.ALREADY_BUILT] += built
        if rest:
            last = max(last, self._write_units(base, rest, set(), res))
        self._note_last_unit(last, sc.store_timestamp, res)
        if self.index is not None:
            self._build_index(base, sc, [], res)

    def _topic_name(self, raw: bytes) -> str:
        """A topic's bytes decoded as check_record does (cached)."""
        name = self._topic_cache.get(raw)
        if name is None:
            name = self._topic_cache[raw] = decode_utf8(raw)
        return name

    def _write_units(
        self,
        base: int,
        units: dict[QueueKey, list[Unit]],
        with_pre_blanks: set[QueueKey],
        res: DispatchResult,
    ) -> int:
        """`put_units` per queue; the statuses into `res`. Returns the record of the last
        unit written (-1: none)."""
        last = -1  # the record of the last unit written, in log order
        refused: list[tuple[QueueKey, int, int]] = []
        for key, todo in units.items():
            self._at = todo[0][1] if todo[0][1] >= 0 else base
            cq = self.queues.find_or_create(*key)
            self.touched.add(cq)
            statuses = cq.put_units(todo)
            if key not in with_pre_blanks and statuses.count(PutStatus.OK) == len(todo):
                res.put_statuses[PutStatus.OK] += len(todo)  # the common case
                res.units_written += len(todo)
                last = max(last, todo[-1][4])
                continue
            for (q_off, phys, _size, _tags, i), st in zip(todo, statuses, strict=True):
                res.put_statuses[st] += 1
                if phys >= 0 and st in (PutStatus.OK, PutStatus.GAP_FILLED):
                    res.units_written += 1
                    last = max(last, i)
                elif phys >= 0 and st is PutStatus.REFUSED_GAP:
                    refused.append((key, q_off, phys))
                if st is PutStatus.GAP_FILLED:
                    res.gaps_filled.add(key)
        res.refused.extend(sorted(refused, key=lambda r: r[2]))
        return last

    def _note_last_unit(
        self, last: int, store_timestamp: memoryview | array[int], res: DispatchResult
    ) -> None:
        """The store time of the last unit written goes to `res` and the checkpoint."""
        if last >= 0:
            res.last_store_timestamp = store_timestamp[last]
            if self.checkpoint is not None:
                self.checkpoint.logics_msg_timestamp = store_timestamp[last]

    def _build_index(
        self, base: int, sc: RecordScan, no_index: list[int], res: DispatchResult
    ) -> None:
        """Index the runs of records between those that must not be."""
        assert self.index is not None
        start = 0
        for stop in [*no_index, len(sc.pos)]:
            if stop > start:
                self._at = base + sc.pos[start]
                batch = KeyBatch(sc.key_first, sc.key_hash, sc.pos, sc.store_timestamp, base,
                                 start, stop)  # fmt: skip
                try:
                    res.index_keys += self.index.build_index_batch(batch)
                except StoreIOError:
                    self.drop_split_keys(self._at)
                    raise
            start = stop + 1

    def _bad_topic(self, topic: str) -> bool:
        """Whether a topic breaks RocketMQ's name rule (cached)."""
        bad = self._topic_problems.get(topic)
        if bad is None:
            bad = self._topic_problems[topic] = topic_problem(topic) is not None
        return bad


def _unit_end(packed: bytes, k: int) -> int:
    """The commit-log end of unit k of packed units (`group_units`')."""
    phys, size, _tags = UNIT.unpack_from(packed, k * CQ_STORE_UNIT_SIZE)
    return int(phys + size)


def _why_stopped(buf: memoryview, pos: int, read: int) -> tuple[DispatchStop, str]:
    """A scan bounded by the limit stopped CORRUPT at `pos`: a whole record that ends
    past the limit (LIMIT: not all of it is there to dispatch yet), zeros (END_OF_DATA),
    or damage (CORRUPT, check_record's reason)."""
    h = check_record(buf, pos, check_crc=False, read_body=False, limit=read)
    if h.status is CheckStatus.OK:
        return DispatchStop.LIMIT, ""
    head = bytes(buf[pos : pos + 8])
    if head == bytes(len(head)):
        return DispatchStop.END_OF_DATA, ""
    return DispatchStop.CORRUPT, h.reason
