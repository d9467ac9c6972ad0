"""The commit log: RocketMQ records appended to a chain of segments (spec §1.7, §3.3, §8.7).

`CommitLog` owns a `SegmentQueue` and is its only appender. It encodes a `Message`
(`engine.record`), assigns the physical offset, the per-(topic, queue) queue offset and
the store timestamp (from an injectable clock), and copies the record into the last
segment: into its mapping, or into its write buffer when one is attached.

Rules carried over from RocketMQ 4.9.8:

* A record goes into a segment only if at least 8 bytes would remain after it. If not,
  the segment is ended with a BLANK record (`SegmentQueue.roll`) and the record is
  appended at the start of the next segment (`END_OF_FILE` internally; the caller sees
  the final outcome). A record that cannot fit even an empty segment is
  `MESSAGE_SIZE_EXCEEDED`.
* Queue offsets: NOT and COMMIT transaction types take the next offset of their
  (topic, queue); PREPARED and ROLLBACK write 0 and take none. The BLANK takes none.
* A batch is all or nothing: every message is encoded first (one bad message fails the
  whole batch with its status, nothing is written), the batch goes into one segment
  (never spans two), shares one store timestamp, and members of the same (topic, queue)
  get consecutive offsets.

Outcomes a caller should expect are `AppendStatus` values; I/O failures raise
`engine.fileio.StoreIOError`.

**The fast path.** `engine.record.encode` is the reference encoder: it validates
everything and costs tens of microseconds (host parsing, property checks). The
appender keeps a cache of encoded tails (`engine.tailcache.TailCache`, keyed by topic,
properties, born host and store host, with a memo of the last message's shape): the
first message with a given key goes through `encode`; if it is valid with IPv4 hosts,
its parts are cached, and later messages with the same key are written straight into
the segment by the C encoder the producers' put path uses
(`mqstore._native.write_record`, one call: CRC, header with the three appender fields
in place, body, tail).
Anything the cache does not vouch for (new key, non-`bytes` body, body over the limit,
negative queue id, a numeric field out of range) falls back to `encode`, so statuses
and bytes are exactly the reference encoder's (a test compares both). One caveat: a
numeric field out of range is only noticed when writing, after a roll may have
happened; the log stays valid (a BLANK and a fresh segment), the message is refused.

**Reading.** `read(offset)` decodes one record. `scan(from_offset)` and
`scan_chunks(from_offset)` are the validating walks of `engine.logwalk`; recovery uses
them. `iter_records()` decodes as it goes. Reads see bytes below each segment's read
position only.

Not thread-safe: one appender thread; readers in the same thread.
"""

from __future__ import annotations

import enum
import os
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, NamedTuple, Unpack

from mqstore import _native
from mqstore.engine import record
from mqstore.engine.findings import Finding
from mqstore.engine.logwalk import (
    ChunkScan,
    QueueKey,
    RecordScan,
    TailRecovery,
    _takes_offset,
    check_records,
)
from mqstore.engine.record import (
    END_FILE_MIN_BLANK_LENGTH,
    EncodedRecord,
    EncodeStatus,
    Message,
    RecordError,
    encode,
)
from mqstore.engine.record_decode import DecodedRecord, decode
from mqstore.engine.recordcodes import make_msg_id
from mqstore.engine.segment import ClockMs, ReadStatus, Segment, now_ms
from mqstore.engine.segment_queue import QueueOptions, SegmentAllocationError, SegmentQueue
from mqstore.engine.tailcache import Tail, TailCache, store_host_of

_TX_MASK: Final = 0xC
_TX_COMMIT: Final = 0x8
_TX_PREPARED: Final = 0x4
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_I16: Final = struct.Struct(">h")
_CHUNK_RECORDS: Final = 8192  # records per scanner call in ChunkScan: bounded columns
_write_record: Final = _native.write_record  # the put path's C encoder
_time_ns: Final = time.time_ns
_tuple_new: Final = tuple.__new__


class AppendStatus(enum.Enum):
    """RocketMQ's AppendMessageStatus, plus the encoder's and the allocator's outcomes."""

    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"  # segment ended with a BLANK; retried in the next one
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"  # does not fit an empty segment
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"  # writes refused (`refuse_writes`)


class AppendResult(NamedTuple):
    """What an append did. For PUT_OK: where the record went (`wrote_offset`, its
    `wrote_bytes`), its queue offset (0 for PREPARED/ROLLBACK) and store timestamp.
    Otherwise `reason` says why nothing was written."""

    status: AppendStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    queue_offset: int = 0
    store_timestamp: int = 0
    reason: str = ""
    store_addr: bytes = b""
    store_port: int = 0

    @property
    def ok(self) -> bool:
        return self.status is AppendStatus.PUT_OK

    @property
    def msg_id(self) -> str:
        """RocketMQ's message id (store host + physical offset); "" unless PUT_OK."""
        if self.status is not AppendStatus.PUT_OK:
            return ""
        return make_msg_id(self.store_addr, self.store_port, self.wrote_offset)


_PUT_OK: Final = AppendStatus.PUT_OK
_POS_QUEUEOFFSET: Final = record.POS_QUEUEOFFSET

_ENCODE_TO_APPEND: Final = {
    EncodeStatus.MESSAGE_ILLEGAL: AppendStatus.MESSAGE_ILLEGAL,
    EncodeStatus.PROPERTIES_SIZE_EXCEEDED: AppendStatus.PROPERTIES_SIZE_EXCEEDED,
}


class LookupStatus(enum.Enum):
    FOUND = "FOUND"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # below the log's first segment
    OFFSET_OVERFLOW = "OFFSET_OVERFLOW"  # at or past the readable end
    NOT_A_RECORD = "NOT_A_RECORD"  # a BLANK, zeros or a corrupt record there


class LookupResult(NamedTuple):
    status: LookupStatus
    record: DecodedRecord | None = None
    reason: str = ""


class _Prepared(NamedTuple):
    data: bytes
    store_ts_pos: int
    qkey: QueueKey
    takes_offset: bool
    store_addr: bytes
    store_port: int


class CommitLog:
    """Append, read and scan RocketMQ records over a SegmentQueue. See the module doc."""

    def __init__(
        self,
        queue: SegmentQueue,
        *,
        clock_ms: ClockMs = now_ms,
        max_message_size: int = record.DEFAULT_MAX_MESSAGE_SIZE,
        queue_offsets: Mapping[QueueKey, int] | None = None,
    ) -> None:
        """Wrap a loaded queue. `queue_offsets` is the next offset per (topic, queue)
        (recovery rebuilds it from the consume queues, or `rebuild_queue_offsets()`)."""
        self.queue = queue
        self._clock_ms = clock_ms
        self.max_message_size = max_message_size
        self._offsets: dict[QueueKey, int] = dict(queue_offsets or {})
        self._tails = TailCache()
        self._last: Segment | None = queue.last()
        self._wall_clock = clock_ms is now_ms  # the hot path inlines the default clock
        # Non-empty while writes are refused (RocketMQ's !isWriteable(), e.g. DISK_FULL).
        self.refused_reason = ""

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        segment_size_bytes: int,
        *,
        max_message_size: int = record.DEFAULT_MAX_MESSAGE_SIZE,
        **options: Unpack[QueueOptions],
    ) -> CommitLog:
        """Load the segments of `directory` (the store's `commitlog/`) into a
        `SegmentQueue` built with `options`, and wrap them.

        Positions start full, as RocketMQ's load; run `recover_tail()` (or the store's
        recovery) before appending. Raises SegmentSizeError, StoreIOError.
        """
        queue = SegmentQueue(directory, segment_size_bytes, **options).loaded()
        clock_ms = options.get("clock_ms", now_ms)
        return cls(queue, clock_ms=clock_ms, max_message_size=max_message_size)

    # --- queue offsets ----------------------------------------------------------------

    @property
    def queue_offsets(self) -> dict[QueueKey, int]:
        """A copy of the next queue offset per (topic, queue id)."""
        return dict(self._offsets)

    def set_queue_offset(self, topic: str, queue_id: int, next_offset: int) -> None:
        self._offsets[(topic, queue_id)] = next_offset

    def rebuild_queue_offsets(self) -> None:
        """Rebuild the table from the records themselves: O(log size). For tools and
        tests; the store rebuilds it from the consume queues (spec §3.3)."""
        table: dict[QueueKey, int] = {}
        for rec in self.scan(self.queue.min_offset() if len(self.queue) else 0, check_crc=False):
            h = rec.header
            if _takes_offset(h.sys_flag):
                key = (h.topic, h.queue_id)
                table[key] = max(table.get(key, 0), h.queue_offset + 1)
        self._offsets = table

    # --- appending --------------------------------------------------------------------

    def refuse_writes(self, reason: str) -> None:
        """Refuse every append with SERVICE_NOT_AVAILABLE and `reason` until
        `allow_writes()` (the disk guard's DISK_FULL). Nothing is written meanwhile."""
        if not reason:
            raise ValueError("a refusal needs a reason")
        self.refused_reason = reason
        self._last = None  # the fast path then asks `_segment_for`, which refuses

    def allow_writes(self) -> None:
        self.refused_reason = ""

    def _refused(self) -> AppendResult:
        return AppendResult(AppendStatus.SERVICE_NOT_AVAILABLE, reason=self.refused_reason)

    def append(self, msg: Message) -> AppendResult:
        """Encode and append one message; return where it went or why it did not.

        Appender only. Cost on the fast path (see module doc): one CRC of the body, one
        pack, two copies. Raises StoreIOError (allocation of a new segment).
        """
        body = msg.body
        try:
            ent = self._tails.find(msg)
            if (
                ent is None
                or type(body) is not bytes
                or len(body) > self.max_message_size
                or msg.queue_id < 0
            ):
                return self._append_slow(msg)
        except TypeError:  # unhashable or odd-typed fields: the encoder says what is wrong
            return self._append_slow(msg)
        topic_b, props_b, fixed_bytes, born_addr, born_port, store_addr, store_port = ent
        blen = len(body)
        total = fixed_bytes + blen
        seg = self._last
        # A cached segment that was destroyed meanwhile has an empty, read-only target:
        # the write below fails and the slow path finds the real last segment.
        if seg is None or seg.wrote_position + total + END_FILE_MIN_BLANK_LENGTH > seg.size_bytes:
            got = self._segment_for(total)
            if type(got) is AppendResult:
                return got
            seg = got  # type: ignore[assignment]
            assert seg is not None
        pos = seg.wrote_position
        target = seg.target
        sys_flag = msg.sys_flag
        now = _time_ns() // 1_000_000 if self._wall_clock else self._clock_ms()
        phys = seg.start_offset + pos
        tx = sys_flag & _TX_MASK
        takes = tx == 0 or tx == _TX_COMMIT
        queue_id = msg.queue_id
        qkey = (msg.topic, queue_id)
        qo = self._offsets.get(qkey, 0) if takes else 0
        try:
            _write_record(
                target, pos,
                (total, queue_id, msg.flag, sys_flag, msg.born_timestamp, body, topic_b,
                 props_b, takes, msg.reconsume_times, msg.prepared_transaction_offset,
                 born_addr, born_port, store_addr, store_port),
                qo, phys, now,
            )  # fmt: skip
        except (ValueError, TypeError):
            return self._append_slow(msg)
        seg.wrote_position = pos + total
        seg.store_timestamp = now
        if takes:
            self._offsets[qkey] = qo + 1
        # tuple.__new__ directly: NamedTuple's generated __new__ costs ~1 us here.
        return _tuple_new(AppendResult, (_PUT_OK, phys, total, qo, now, "", store_addr, store_port))

    def _append_slow(self, msg: Message) -> AppendResult:
        prep = self._prepare(msg)
        if type(prep) is AppendResult:
            return prep
        assert isinstance(prep, _Prepared)
        return self._append_prepared([prep])[0]

    def append_encoded(self, rec: EncodedRecord, topic: str, queue_id: int) -> AppendResult:
        """Append a record encoded elsewhere (`engine.record.encode`, status OK).

        The transaction type is read from the record's SYSFLAG. Appender only.
        """
        if self.refused_reason:
            return self._refused()
        if rec.status is not EncodeStatus.OK:
            return AppendResult(_ENCODE_TO_APPEND[rec.status], reason=rec.reason)
        sys_flag = _I32.unpack_from(rec.data, record.POS_SYSFLAG)[0]
        addr, port = store_host_of(rec.data, rec.store_ts_pos)
        prep = _Prepared(
            rec.data, rec.store_ts_pos, (topic, queue_id), _takes_offset(sys_flag), addr, port
        )
        return self._append_prepared([prep])[0]

    def append_batch(self, msgs: Sequence[Message]) -> list[AppendResult]:
        """Append messages as one all-or-nothing batch in one segment (see module doc).

        On a bad message every result carries its status and a reason naming it.
        Appender only. Raises StoreIOError.
        """
        if self.refused_reason:
            return [self._refused() for _ in msgs]
        fast = self._append_batch_fast(msgs)
        if fast is not None:
            return fast
        preps: list[_Prepared] = []
        for i, msg in enumerate(msgs):
            prep = self._prepare(msg)
            if type(prep) is AppendResult:
                reason = f"message {i} of the batch: {prep.reason}"
                return [AppendResult(prep.status, reason=reason) for _ in msgs]
            assert isinstance(prep, _Prepared)
            preps.append(prep)
        if not preps:
            return []
        return self._append_prepared(preps)

    def _cached_tail(self, msg: Message) -> Tail | None:
        """The fast path's parts for `msg` (memo, then cache), or None when the reference
        encoder must judge it (the body, queue id and sizes are checked too)."""
        body = msg.body
        if type(body) is not bytes or len(body) > self.max_message_size:
            return None
        queue_id = msg.queue_id
        if type(queue_id) is not int or queue_id < 0:
            return None
        try:
            return self._tails.find(msg)
        except TypeError:
            return None

    def _append_batch_fast(self, msgs: Sequence[Message]) -> list[AppendResult] | None:
        """The batch packed straight into the segment, as `append` packs one message;
        None (nothing written, no offset taken) when any member needs the reference
        encoder, which then decides the batch's status."""
        if not msgs:
            return None
        ents: list[Tail] = []
        total = 0
        for msg in msgs:
            ent = self._cached_tail(msg)
            if ent is None:
                return None
            ents.append(ent)
            total += ent.fixed_bytes + len(msg.body)
        got = self._segment_for(total)
        if type(got) is AppendResult:
            return [got for _ in msgs]
        seg = got
        assert isinstance(seg, Segment)
        target = seg.target
        pos = seg.wrote_position
        start = seg.start_offset
        now = _time_ns() // 1_000_000 if self._wall_clock else self._clock_ms()
        offsets = self._offsets
        before: dict[QueueKey, int | None] = {}
        out: list[AppendResult] = []
        append = out.append
        try:
            for msg, ent in zip(msgs, ents, strict=True):
                topic_b, props_b, fixed_bytes, born_addr, born_port, store_addr, store_port = ent
                body = msg.body
                blen = len(body)
                size = fixed_bytes + blen
                sys_flag = msg.sys_flag
                tx = sys_flag & _TX_MASK
                takes = tx == 0 or tx == _TX_COMMIT
                queue_id = msg.queue_id
                qkey = (msg.topic, queue_id)
                qo = 0
                if takes:
                    if qkey not in before:
                        before[qkey] = offsets.get(qkey)
                    qo = offsets.get(qkey, 0)
                    offsets[qkey] = qo + 1
                phys = start + pos
                # The fields as `append` writes them, on purpose: a helper shared by the
                # two fast paths costs both 0.1 us/msg (~9%, CPU time, A/B in one process).
                _write_record(
                    target, pos,
                    (size, queue_id, msg.flag, sys_flag, msg.born_timestamp, body, topic_b,
                     props_b, takes, msg.reconsume_times, msg.prepared_transaction_offset,
                     born_addr, born_port, store_addr, store_port),
                    qo, phys, now,
                )  # fmt: skip
                append(
                    _tuple_new(
                        AppendResult, (_PUT_OK, phys, size, qo, now, "", store_addr, store_port)
                    )
                )
                pos += size
        except (ValueError, TypeError):
            # A numeric field out of range: undo the offsets taken; the bytes written past
            # wrote_position are invisible and get overwritten. The slow path judges.
            for qkey, old in before.items():
                if old is None:
                    offsets.pop(qkey, None)
                else:
                    offsets[qkey] = old
            return None
        seg.wrote_position = pos
        seg.store_timestamp = now
        return out

    def _prepare(self, msg: Message) -> _Prepared | AppendResult:
        """Encode one message (through the tail cache when it can)."""
        body = msg.body
        try:
            ent = self._tails.keyed(msg)
        except TypeError:
            ent = None
        if (
            ent is not None
            and type(body) is bytes
            and len(body) <= self.max_message_size
            and isinstance(msg.queue_id, int)
            and msg.queue_id >= 0
        ):
            size = ent.fixed_bytes + len(body)
            tx = msg.sys_flag & _TX_MASK
            out = bytearray(size)  # appender fields zero, as encode() leaves them
            try:
                _write_record(
                    out, 0,
                    (size, msg.queue_id, msg.flag, msg.sys_flag, msg.born_timestamp, body,
                     ent.topic, ent.properties, tx == 0 or tx == _TX_COMMIT,
                     msg.reconsume_times, msg.prepared_transaction_offset, ent.born_addr,
                     ent.born_port, ent.store_addr, ent.store_port),
                    0, 0, 0,
                )  # fmt: skip
            except (ValueError, TypeError):
                pass
            else:
                return _tuple_new(
                    _Prepared,
                    (
                        bytes(out),
                        56,
                        (msg.topic, msg.queue_id),
                        tx == 0 or tx == _TX_COMMIT,
                        ent.store_addr,
                        ent.store_port,
                    ),
                )
        rec = encode(msg, max_message_size=self.max_message_size)
        if rec.status is not EncodeStatus.OK:
            return AppendResult(_ENCODE_TO_APPEND[rec.status], reason=rec.reason)
        data = rec.data
        addr, port = store_host_of(data, rec.store_ts_pos)
        self._tails.learn_hosts(msg, data, rec.store_ts_pos, addr, port)
        return _Prepared(
            data, rec.store_ts_pos, (msg.topic, msg.queue_id), _takes_offset(msg.sys_flag),
            addr, port,
        )  # fmt: skip

    def _append_prepared(self, preps: list[_Prepared]) -> list[AppendResult]:
        total = 0
        for p in preps:
            total += len(p.data)
        got = self._segment_for(total)
        if type(got) is AppendResult:
            return [got for _ in preps]
        seg = got
        assert isinstance(seg, Segment)
        target = seg.target
        pos = seg.wrote_position
        now = self._clock_ms()
        offsets = self._offsets
        out: list[AppendResult] = []
        start = seg.start_offset
        append = out.append
        pack_qo_po = record.QO_PO.pack_into
        pack_ts = _I64.pack_into
        for data, ts_pos, qkey, takes, addr, port in preps:
            qo = offsets.get(qkey, 0) if takes else 0
            phys = start + pos
            n = len(data)
            target[pos : pos + n] = data
            pack_qo_po(target, pos + _POS_QUEUEOFFSET, qo, phys)
            pack_ts(target, pos + ts_pos, now)
            if takes:
                offsets[qkey] = qo + 1
            append(_tuple_new(AppendResult, (_PUT_OK, phys, n, qo, now, "", addr, port)))
            pos += n
        seg.wrote_position = pos
        seg.store_timestamp = now
        return out

    def _segment_for(self, total: int) -> Segment | AppendResult:
        """The segment the next `total` bytes go into, rolling with a BLANK if needed;
        SERVICE_NOT_AVAILABLE while writes are refused."""
        if self.refused_reason:
            return self._refused()
        size = self.queue.segment_size_bytes
        if total + END_FILE_MIN_BLANK_LENGTH > size:
            return AppendResult(
                AppendStatus.MESSAGE_SIZE_EXCEEDED,
                reason=f"{total} bytes (+8 for the BLANK) do not fit a {size}-byte segment",
            )
        try:
            seg = self.queue.get_last(self.queue.max_wrote_offset())
            assert seg is not None
            if seg.wrote_position + total + END_FILE_MIN_BLANK_LENGTH > seg.size_bytes:
                seg = self.queue.roll()  # END_OF_FILE: BLANK, then the next segment
        except SegmentAllocationError as e:
            self._last = self.queue.last()
            return AppendResult(AppendStatus.CREATE_MAPPED_FILE_FAILED, reason=str(e))
        self._last = seg
        return seg

    # --- reading ----------------------------------------------------------------------

    def min_offset(self) -> int:
        return self.queue.min_offset()

    def max_offset(self) -> int:
        """One past the last readable byte (committed, with a write buffer)."""
        return self.queue.max_offset()

    def read(self, physical_offset: int) -> LookupResult:
        """Decode the record at `physical_offset`. Any reader. O(record)."""
        queue = self.queue
        if len(queue) == 0 or physical_offset >= queue.max_offset():
            return LookupResult(LookupStatus.OFFSET_OVERFLOW, reason="at or past the end")
        seg = queue.find(physical_offset)
        if seg is None or physical_offset < queue.min_offset():
            return LookupResult(LookupStatus.OFFSET_TOO_SMALL, reason="before the first segment")
        with seg.select(physical_offset - seg.start_offset) as sl:
            if sl.status is not ReadStatus.OK:
                return LookupResult(LookupStatus.OFFSET_OVERFLOW, reason=sl.status.value)
            try:
                return LookupResult(LookupStatus.FOUND, decode(sl.view, 0))
            except RecordError as e:
                return LookupResult(LookupStatus.NOT_A_RECORD, reason=e.reason)

    def read_bytes(self, physical_offset: int, size: int) -> bytes:
        """Up to `size` readable bytes from one segment (b"" if none)."""
        seg = self.queue.find(physical_offset)
        if seg is None:
            return b""
        return seg.read_bytes(physical_offset - seg.start_offset, size)

    def store_time_of(self, physical_offset: int) -> int | None:
        """The store time (ms) of the message record at `physical_offset`, read from its
        fixed header (`record.peek_store_timestamp`: no CRC, no body); None when no
        readable segment holds a message record there. O(1)."""
        return record.peek_store_timestamp(self.read_bytes(physical_offset, 80))

    def scan(
        self,
        from_offset: int | None = None,
        *,
        check_crc: bool = True,
        read_body: bool = True,
        to_offset: int | None = None,
    ) -> RecordScan:
        """A validating walk from `from_offset` (default: the first segment's start).

        Recovery calls it with check_crc=True (RocketMQ's checkCRCOnRecover);
        dispatch with check_crc=False, read_body=False. Stops at `to_offset` if given.
        """
        start = from_offset if from_offset is not None else max(self.queue.min_offset(), 0)
        return RecordScan(
            self.queue,
            start,
            check_crc=check_crc,
            read_body=read_body,
            to_offset=to_offset if to_offset is not None else 1 << 62,
        )

    def scan_chunks(
        self,
        from_offset: int | None = None,
        *,
        check_crc: bool = True,
        to_offset: int | None = None,
    ) -> ChunkScan:
        """`scan`'s walk as columns (`engine.scan`): the same records, stop and end.
        O(bytes) for the CRC, in C without the GIL; O(records / 8192) Python."""
        start = from_offset if from_offset is not None else max(self.queue.min_offset(), 0)
        end = to_offset if to_offset is not None else 1 << 62
        return ChunkScan(self.queue, start, check_crc=check_crc, to_offset=end)

    def iter_records(
        self, from_offset: int | None = None, *, to_offset: int | None = None
    ) -> Iterator[DecodedRecord]:
        """Decode every message record from `from_offset`, hopping BLANKs; stops where a
        scan without CRC check stops (CRC faults show as `crc_ok=False`)."""
        yield from self.scan(from_offset, check_crc=False, to_offset=to_offset).decoded()

    # --- recovery helper ----------------------------------------------------------------

    def recover_tail(self, from_offset: int | None = None) -> TailRecovery:
        """Scan (CRC on) from `from_offset` and cut the log where valid data ends.

        The simple recovery of a single process: the store's recovery (checkpoint,
        consume queues) builds on `scan()` and `SegmentQueue.truncate_dirty()` itself.
        Also rebuilds the queue-offset table from the log. O(bytes scanned).
        """
        sc = self.scan(from_offset)
        for _ in sc:
            pass
        cut = self.queue.truncate_dirty(sc.end_offset)
        self.queue.committed_where = sc.end_offset
        self.queue.flushed_where = sc.end_offset
        self._last = self.queue.last()
        self.rebuild_queue_offsets()
        return TailRecovery(
            sc.end_offset, sc.stop, sc.reason, sc.records, cut.segments_deleted, cut.bytes_zeroed
        )

    # --- commit / flush pass-through ---------------------------------------------------

    def commit(self, least_pages: int) -> int:
        """SegmentQueue.commit: bytes advanced, 0 = no progress."""
        return self.queue.commit(least_pages)

    def flush(self, least_pages: int) -> int:
        """SegmentQueue.flush: bytes advanced, 0 = no progress. Raises StoreIOError."""
        return self.queue.flush(least_pages)

    def close(self) -> None:
        """Unmap and close every segment, keeping the files."""
        self.queue.close()
        self._last = None

    # --- self-check -------------------------------------------------------------------

    def check(
        self, *, deep: bool = False, deleted_topics: Mapping[str, int] | None = None
    ) -> list[Finding]:
        """The queue's check, then every record (CRC on): stored physical offsets, queue
        offsets rising by one per (topic, queue), the table ahead of them, and where
        valid data ends against the readable end. `deleted_topics`: {topic: end offset}
        (`engine.deleted_topics`): a deleted topic's records below it are in no queue, and
        its name's queues start again from 0 at it. O(log size)."""
        out = self.queue.check(deep=deep)
        out.extend(check_records(self.queue, self._offsets, deleted_topics))
        return out
