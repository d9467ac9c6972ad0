"""`Producer`: the puts of a `StoreClient`, in the caller's process.

A put runs in the caller's process:

1. **One C call** (`mqstore._native.Appender.put_message`, `ipc/native/mqs_put.c`; a
   batch of dicts: `put_batch_messages`): the argument types; the topic and tags looked
   up in this client's *lanes* (`ipc.prepare`, made by `_warm` once the reference
   encoder accepted them); the KEYS property checked and appended; the queue id (given,
   or the topic's round robin) checked against the topic's queues; then `ipc/native/
   mqs_append.c`: CRC the body; take the reservation lock (a robust process-shared mutex,
   with the busy timeout as deadline); reserve space, slot, queue offset and store
   timestamp; unlock; encode the record straight into the pool buffer (pool on) or the
   segment's mapping (pool off); mark the slot DONE and publish (`ipc.reservation`).
   Under SYNC_FLUSH with wait_store, a futex wait on the control block's flushed
   position (GIL released, 20 ms ticks for signals and the deadline): PUT_OK only once
   the flusher's flushed_pos covers the record. The statistics row is counted and the
   PutResult built in C.
2. **Everything else comes back here with nothing done** (None): `_put_slow` checks the
   supervisor every 10 ms (`ipc.session`), warms the lanes and tries the C call again;
   else the general path, `_put_general`, the reference of the C put: `_prepare`
   (`ipc.prepare`), then `Appender.put` of the prepared message or, for the rare paths
   (a segment roll with a BLANK, waits for the next file, a pool buffer or slots, a new
   queue-table row, flags that refuse writes), `_reserve` under the same mutex and the C
   encoder (`Appender.write`). Born and store hosts may be IPv4 or IPv6 (sysflag 0x10 /
   0x20).

The protocol (reserve, complete, abandon, publish, fill, repair) is `ipc.reservation`.
Producers publish their own DONE slots; the committer gives a slot whose producer died
(its liveness byte is free) a filler record, so a dead producer never stalls the log.

Thread-safe: one lock per client (`_native.PutLock`, which the C call takes too)
serialises puts of its threads.
"""

from __future__ import annotations

import array
import contextlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from mqstore import _native
from mqstore.engine.record import END_FILE_MIN_BLANK_LENGTH, Message
from mqstore.ipc import control as c
from mqstore.ipc.accepts import BOOL, check_batch, check_batch_item, check_put_types, check_types
from mqstore.ipc.general_path import GeneralPath, _Busy, _Refused
from mqstore.ipc.prepare import _P_QUEUE, _P_SIZE, _P_TOPIC, PutFields, _Prep
from mqstore.ipc.results import PutMessageStatus, PutResult, error_for, raise_if_failed
from mqstore.ipc.session import _FORKS, _STALE_CHECK_NS, _STALE_CHECK_S

_tuple_new: Final = tuple.__new__
_perf_ns: Final = time.perf_counter_ns
_FALLBACK: Final = _native.FALLBACK
_STATS_EVERY: Final = 256
_STATUS_INDEX: Final = {st: i for i, st in enumerate(PutMessageStatus)}

OK: Final = PutMessageStatus.PUT_OK
_PUT_LABEL: Final = "put() argument {!r}"
_BATCH_FIELDS: Final = frozenset(("topic", "body", "tags", "keys", "properties", "queue_id"))
_monotonic: Final = time.monotonic


class Producer(GeneralPath):
    """The puts of one client: the C appender set up at each attach, the general path
    (reservation, copy), the flush wait and the statistics row."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        timeout_s: float,
        topic_queue_nums: Mapping[str, int] | None,
        raise_on_status: bool,
    ) -> None:
        super().__init__(store_dir, timeout_s, topic_queue_nums)
        self.raise_on_status = raise_on_status

    # --- the session's hooks ------------------------------------------------------------

    def _on_attach(self, info: dict[str, Any]) -> None:
        super()._on_attach(info)
        self._sync_timeout_ns = int(self.sync_timeout_s * 1e9)
        self._stats = array.array("q", bytes(8 * c.CLIENT_FIELDS))  # counted in C
        self._stats[c.CF_PID] = self._pid
        self._since_stats = 0
        self._configure_native()

    def _configure_native(self) -> None:
        """Hand the C put (`Appender.put_message`) what it needs: the lock, the lanes, the
        statistics row, the result type and the outcomes of a sync wait."""
        timed_out = PutMessageStatus.FLUSH_DISK_TIMEOUT
        failed = PutMessageStatus.FLUSH_DISK_FAILED
        self._app.configure(
            lock=self._tlock,
            lanes=self._lanes,
            stats=self._stats,
            stats_off=self._cb.client_off(self._client_index),
            result_type=PutResult,
            outcomes=(
                (OK, _STATUS_INDEX[OK], ""),
                (timed_out, _STATUS_INDEX[timed_out], self._flush_reason(1)),
                (failed, _STATUS_INDEX[failed], self._flush_reason(2)),
            ),
            msg_id_prefix=self._msg_id_prefix,
            sync=self._sync,
            sync_timeout_ns=self._sync_timeout_ns,
            busy_ns=self._busy_ns,
            max_body=self._max_body,
            store_addr=self._store_addr,
            store_port=self._store_port,
        )
        self._app.checked(_STALE_CHECK_NS)

    def _on_detach(self) -> None:
        with contextlib.suppress(ValueError, TypeError):
            self._publish_stats()
        super()._on_detach()

    def _before_check(self) -> None:
        self._publish_stats()  # the C put counts into the row between two checks

    def _after_check(self) -> None:
        self._refresh_lanes()
        self._app.checked(_STALE_CHECK_NS)

    # --- flush wait -------------------------------------------------------------------

    def wait_flushed(self, end: int, timeout_s: float) -> int:
        """Wait until the flusher's flushed position covers `end`, at most `timeout_s`
        (a futex wait, GIL released): 0 covered, 1 not yet, 2 fsync failed (read-only),
        3 the generation ended without flushing it (`ipc.fence`).
        AttributeError or ValueError while the client re-attaches."""
        return self._app.wait_flushed(end, int(timeout_s * 1e9))

    def _wait_flushed(self, end: int) -> tuple[PutMessageStatus, str]:
        """Until the flusher's flushed_pos covers `end` (a futex wait on the control
        block, `ipc/native/mqs_futex.c`), the sync flush timeout, or a failed fsync."""
        code = self._app.wait_flushed(end, self._sync_timeout_ns)
        if code == 0:
            return OK, ""
        if code == 1:
            return PutMessageStatus.FLUSH_DISK_TIMEOUT, self._flush_reason(1)
        if code == 3:
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, self._fenced_reason()
        return PutMessageStatus.FLUSH_DISK_FAILED, self._flush_reason(2)

    def _flush_reason(self, code: int) -> str:
        """The reason of a sync wait that ended with `code` 1 (timed out) or 2 (failed)."""
        if code == 1:
            return f"not flushed within syncFlushTimeout ({self.sync_timeout_s * 1000:.0f} ms)"
        return "fsync failed: the store is read-only"

    # --- statistics ---------------------------------------------------------------------

    def _record(
        self,
        t0: int,
        n: int,
        nbytes: int,
        status: PutMessageStatus,
        sync: bool,
        phases: tuple[int, int, int, int] | None = None,
    ) -> None:
        """Count one put call of `n` messages into this client's row (published every
        `_STATS_EVERY` calls). `phases`: (lock wait ns, lock taken at, copied at, done at)
        of a call that reserved; the flush wait is counted for sync calls only."""
        if phases is None:
            self._app.count(
                self._stats, n, nbytes, _STATUS_INDEX[status], status is OK, sync,
                _perf_ns() - t0, -1, 0, 0,
            )  # fmt: skip
        else:
            lock_ns, t_locked, t_copied, t_done = phases
            self._app.count(
                self._stats, n, nbytes, _STATUS_INDEX[status], status is OK, sync,
                t_done - t0, lock_ns, t_copied - t_locked, t_done - t_copied,
            )  # fmt: skip
        self._since_stats += 1
        if self._since_stats >= _STATS_EVERY:
            self._publish_stats()

    def _publish_stats(self) -> None:
        self._since_stats = 0
        self._cb.write_client(self._client_index, self._stats)

    # --- the public puts ----------------------------------------------------------------

    def put(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        wait_store: bool = True,
    ) -> PutResult:
        """Append one message. Returns PUT_OK with where it went, or why not.

        Under SYNC_FLUSH with `wait_store` it returns once the record is on disk
        (group commit); with `wait_store=False` or ASYNC_FLUSH it returns once the record
        is in the pool or page cache. Never raises for expected outcomes, unless attached
        with `raise_on_status` (then any status but PUT_OK raises its `PutError`); raises
        TypeError for an argument of the wrong type, naming it (`ipc.accepts`).
        """
        got = self._app.put_message(topic, body, tags, keys, properties, queue_id, wait_store)
        if type(got) is PutResult and got[0] is OK:
            return got
        if got is not None:
            return self._settle(_perf_ns(), got)
        return self._put_slow(PutFields(topic, body, tags, keys, properties, queue_id), wait_store)

    def _settle(self, t0: int, got: PutResult | int) -> PutResult:
        """What a C put that did something answers: its result (raised with
        `raise_on_status` unless PUT_OK), or the status of the reservation lock it could
        not take (code < 0)."""
        if type(got) is PutResult:
            if got[0] is not OK and self.raise_on_status:
                raise error_for(got)
            return got
        busy = self._lock_failed(got)  # type: ignore[arg-type]
        self._record(t0, 1, 0, busy.status, False)
        return self._failed(PutResult(busy.status, busy.reason))

    def _put_slow(self, fields: PutFields, wait_store: bool) -> PutResult:
        """A put the C call left to Python, nothing done (the client's checks are due,
        another thread puts, a first put of a topic or tags value, a type or value to
        refuse, a roll or a wait): check, warm the lanes, try the C put again, else the
        general path."""
        t0 = _perf_ns()
        check_put_types(_PUT_LABEL, *fields)
        if type(wait_store) is not bool:
            check_types("put", wait_store=(wait_store, BOOL))
        with self._tlock:
            if (
                self._fork_gen != _FORKS[0]
                or self._closed
                or not self._attached  # a failed re-attach: try again, never touch _buf
                or _monotonic() - self._last_stale_check >= _STALE_CHECK_S
            ):
                why = self._ensure_live()
                if why:
                    return self._failed(PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, why))
            self._warm(fields.topic, fields.tags)
            got = self._app.put_message(*fields, wait_store, True)
            if got is not None:
                return self._settle(t0, got)
            return self._put_general(t0, fields, wait_store)

    def _put_general(self, t0: int, fields: PutFields, wait_store: bool) -> PutResult:
        """The put in Python (the reference of the C put): `_prepare`, then the C
        reservation of one prepared message or `_reserve` and `_copy`. Caller holds the
        thread lock and checked the types."""
        prep = self._prepare(fields)
        if type(prep) is PutResult:
            self._record(t0, 1, 0, prep.status, False)
            return self._failed(prep)
        p: _Prep = prep  # type: ignore[assignment]
        size = p[_P_SIZE]
        qs = self._qslots.get((p[_P_TOPIC], p[_P_QUEUE]))
        t_wait = _perf_ns()
        got = _FALLBACK if qs is None else self._put_one(qs, p)
        if type(got) is tuple:
            _seq, start, now, qo, lock_ns = got
            t_locked = t_wait + lock_ns
        elif got != _FALLBACK:
            busy = self._lock_failed(got)  # type: ignore[arg-type]
            self._record(t0, 1, 0, busy.status, False)
            return self._failed(PutResult(busy.status, busy.reason))
        else:
            preps = [p]
            try:
                first, start, blank, now, qoffs = self._reserve(preps)
            except _Busy as e:
                self._record(t0, 1, 0, e.status, False)
                return self._failed(PutResult(e.status, e.reason))
            except _Refused as e:
                self._record(t0, 1, 0, PutMessageStatus.SERVICE_NOT_AVAILABLE, False)
                return self._failed(PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, str(e)))
            t_locked = _perf_ns()
            lock_ns = t_locked - t_wait  # the whole reservation: lock and any waits
            try:
                self._copy(preps, first, start, blank, now, qoffs)
            except _Busy as e:  # fenced: the filler has it
                self._record(t0, 1, 0, e.status, False)
                return self._failed(PutResult(e.status, e.reason))
            except BaseException:
                self._abandon(first, 1 + (1 if blank else 0))
                raise
            qo = qoffs[0]
        t_copied = _perf_ns()
        status, reason = OK, ""
        sync = self._sync and wait_store
        if sync:
            status, reason = self._wait_flushed(start + size)
            t_done = _perf_ns()
        else:
            t_done = t_copied
        self._record(t0, 1, size, status, sync, (lock_ns, t_locked, t_copied, t_done))
        result: PutResult = _tuple_new(
            PutResult,
            (status, reason, f"{self._msg_id_prefix}{start:016X}", start, size, p[1], qo, now),
        )
        if status is not OK and self.raise_on_status:
            raise error_for(result)
        return result

    def _failed(self, result: PutResult) -> PutResult:
        """A put that wrote nothing: raise its `PutError` when `raise_on_status`."""
        if self.raise_on_status:
            raise error_for(result)
        return result

    def put_batch(
        self, messages: Iterable[Mapping[str, Any] | Message], *, wait_store: bool = True
    ) -> list[PutResult]:
        """Append messages all or nothing, in one segment, under one reservation.

        Each item is a dict of `put`'s keyword arguments (plus `topic` and `body`) or an
        `engine.record.Message` (its topic, body, properties, queue id, flag, sys flag).
        A bad message fails the whole batch with its status; nothing is written. A
        message or field of the wrong type raises TypeError naming it (`ipc.accepts`).
        """
        results = self._app.put_batch_messages(messages, wait_store)
        if type(results) is not list:
            results = self._put_batch(results, messages, wait_store)
        return raise_if_failed(results) if self.raise_on_status else results

    def _put_batch(
        self,
        code: int | None,
        messages: Iterable[Mapping[str, Any] | Message],
        wait_store: bool,
    ) -> list[PutResult]:
        """A batch the C call (`Appender.put_batch_messages`) did not put: as `_put_slow`
        for one message, then the general path in Python, its reference."""
        t0 = _perf_ns()
        msgs: list[Any] = check_batch(messages)
        if code is not None:
            busy = self._lock_failed(code)
            self._record(t0, len(msgs), 0, busy.status, False)
            return [PutResult(busy.status, busy.reason) for _ in msgs]
        for i, m in enumerate(msgs):
            check_batch_item(i, m)
        check_types("put_batch", wait_store=(wait_store, BOOL))
        with self._tlock:
            why = self._ensure_live()
            if why:
                return [PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, why) for _ in msgs]
            if not msgs:
                return []
            for m in msgs:
                if type(m) is dict:
                    self._warm(m.get("topic"), m.get("tags"))
            got = self._app.put_batch_messages(msgs, wait_store, True)
            if type(got) is list:
                return got
            if got is not None:
                busy = self._lock_failed(got)
                self._record(t0, len(msgs), 0, busy.status, False)
                return [PutResult(busy.status, busy.reason) for _ in msgs]
            if len(msgs) > self._slot_count // 2:
                bad = PutResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    f"batch of {len(msgs)} messages; at most {self._slot_count // 2} per batch",
                )
                return [bad for _ in msgs]
            preps: list[_Prep] = []
            prep: _Prep | PutResult
            for i, m in enumerate(msgs):
                if isinstance(m, Message):
                    fields = self._message_fields(m)
                    if isinstance(fields, PutResult):
                        prep = fields
                    else:
                        born, sys_flag = fields
                        prep = self._prepare(
                            PutFields(m.topic, m.body, None, None, m.properties, m.queue_id),
                            m.flag, sys_flag, m.reconsume_times, m.prepared_transaction_offset,
                            born, m.born_timestamp,
                        )  # fmt: skip
                else:
                    try:
                        get = m.get
                        prep = self._prepare(
                            PutFields(
                                m["topic"], m["body"], get("tags"), get("keys"),
                                get("properties"), get("queue_id"),
                            )
                        )  # fmt: skip
                        if len(m) > 2 and not _BATCH_FIELDS.issuperset(m):
                            unknown = sorted(set(m) - _BATCH_FIELDS)
                            prep = PutResult(
                                PutMessageStatus.MESSAGE_ILLEGAL, f"unknown fields {unknown}"
                            )
                    except KeyError as e:
                        prep = PutResult(PutMessageStatus.MESSAGE_ILLEGAL, f"missing field {e}")
                if type(prep) is PutResult:
                    self._record(t0, len(msgs), 0, prep.status, False)
                    bad = PutResult(prep.status, f"message {i} of the batch: {prep.reason}")
                    return [bad for _ in msgs]
                preps.append(prep)  # type: ignore[arg-type]
            total = sum(p[_P_SIZE] for p in preps)
            if total + END_FILE_MIN_BLANK_LENGTH > self._seg_size:
                bad = PutResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    f"batch of {total} bytes does not fit a {self._seg_size}-byte segment",
                )
                self._record(t0, len(msgs), 0, bad.status, False)
                return [bad for _ in msgs]
            t_wait = _perf_ns()
            qget = self._qslots.get
            qslots = [qget((p[_P_TOPIC], p[_P_QUEUE]), -1) for p in preps]
            got = _FALLBACK if -1 in qslots else self._put_many(qslots, preps)
            if type(got) is tuple:
                _first, start, now, qoffs, lock_ns = got
                t_locked = t_wait + lock_ns
            elif got != _FALLBACK:
                busy = self._lock_failed(got)  # type: ignore[arg-type]
                self._record(t0, len(msgs), 0, busy.status, False)
                return [PutResult(busy.status, busy.reason) for _ in msgs]
            else:
                try:
                    first, start, blank, now, qoffs = self._reserve(preps)
                except _Busy as e:
                    self._record(t0, len(msgs), 0, e.status, False)
                    return [PutResult(e.status, e.reason) for _ in msgs]
                except _Refused as e:
                    self._record(t0, len(msgs), 0, PutMessageStatus.SERVICE_NOT_AVAILABLE, False)
                    return [PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, str(e)) for _ in msgs]
                t_locked = _perf_ns()
                try:
                    self._copy(preps, first, start, blank, now, qoffs)
                except _Busy as e:  # fenced: the filler has it
                    self._record(t0, len(msgs), 0, e.status, False)
                    return [PutResult(e.status, e.reason) for _ in msgs]
                except BaseException:
                    self._abandon(first, len(preps) + (1 if blank else 0))
                    raise
            t_copied = _perf_ns()
            status, reason = OK, ""
            sync = self._sync and wait_store
            if sync:
                status, reason = self._wait_flushed(start + total)
            t_done = _perf_ns() if sync else t_copied
            self._record(
                t0, len(msgs), total, status, sync, (t_locked - t_wait, t_locked, t_copied, t_done)
            )
            out = []
            at = start
            prefix = self._msg_id_prefix
            for p, qo in zip(preps, qoffs, strict=True):
                size = p[_P_SIZE]
                out.append(
                    _tuple_new(
                        PutResult,
                        (status, reason, f"{prefix}{at:016X}", at, size, p[_P_QUEUE], qo, now),
                    )
                )
                at += size
            return out
