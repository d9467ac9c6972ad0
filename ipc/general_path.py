"""`GeneralPath`: the reservation of a put the C call could not make, and its targets.

The C put (`ipc/native/mqs_append.c`) reserves and writes the common case in one call.
What it leaves (a segment roll with a BLANK, a wait for the next file, a pool buffer or
slots, a new queue-table row, flags that refuse writes) is reserved here, under the same
robust process-shared mutex and with the same steps in the same order (`_reserve`), and
written by the C encoder (`Appender.write`, `_copy`) into the pool buffer or the mapped
segment (`_target`). A reservation this process will not finish is abandoned to the
publisher's filler (`_abandon`). The protocol is `ipc.reservation`.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Any, Final

from mqstore import _native
from mqstore.engine import fileio
from mqstore.engine.diskguard import DISK_FULL_BIT, decode_state
from mqstore.engine.record import END_FILE_MIN_BLANK_LENGTH
from mqstore.engine.segment import segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.control_views import DiskWord, Flags, Positions, Reservation
from mqstore.ipc.prepare import _P_QUEUE, _P_SIZE, _P_TAKES, _P_TOPIC, Preparer, _Prep
from mqstore.ipc.results import PutMessageStatus

_SLOT_PACK: Final = c.SLOT.pack_into
_I64_PACK: Final = c.I64.pack_into
_I64_UNPACK: Final = c.I64.unpack_from
_time_ns: Final = time.time_ns


class _Busy(Exception):
    def __init__(self, status: PutMessageStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Refused(Exception):
    pass


class GeneralPath(Preparer):
    """The C appender of this attach and what it writes into; the general path's
    reservation and copy."""

    def _on_attach(self, info: dict[str, Any]) -> None:
        super()._on_attach(info)
        cb = self._cb
        self._busy_ns = int(self._busy_timeout_s * 1e9)
        self._app = _native.Appender(cb.buf, cb.pool_buf, self._pid)
        self._cur: tuple[int, mmap.mmap | None] = (-2, None)  # the newest mapped segment
        self._pviews: list[memoryview] = []
        if self._pool_n:
            assert cb.pool_buf is not None
            s = self._seg_size
            self._pviews = [cb.pool_buf[k * s : (k + 1) * s] for k in range(self._pool_n)]
        self._maps: dict[int, tuple[int, mmap.mmap]] = {}

    def _on_detach(self) -> None:
        for v in self._pviews:
            v.release()
        self._pviews = []
        for fd, mm in self._maps.values():
            mm.close()
            fileio.close(fd)
        self._maps.clear()
        self._cur = (-2, None)
        self._app.close()

    def _forget_parent(self) -> None:
        self._pviews = []
        self._maps = {}
        self._cur = (-2, None)

    # --- targets ----------------------------------------------------------------------

    def _target(self, index: int) -> memoryview | mmap.mmap:
        if self._pool_n:
            return self._pviews[index % self._pool_n]
        got = self._maps.get(index)
        if got is None:
            path = os.path.join(
                self.store_dir, "commitlog", segment_file_name(index * self._seg_size)
            )
            fd = fileio.open_file(path, create=False)
            mm = fileio.mmap_file(fd, self._seg_size, writable=True, path=path)
            got = (fd, mm)
            self._maps[index] = got
            if index > self._cur[0]:
                self._cur = (index, mm)  # the C put writes here while it is the last
                self._app.set_target(mm, index)
            for old in [i for i in self._maps if i < index - 1]:
                ofd, omm = self._maps.pop(old)
                omm.close()
                fileio.close(ofd)
        return got[1]

    # --- reservation: the general path (rolls, waits, new queue rows) ---------------------

    def _fenced_reason(self) -> str:
        """Why a put of a fenced generation failed (`ipc.fence`)."""
        return (
            f"the store was stopped or restarted while this put was in progress (generation "
            f"{self._cb.generation} is over); it was not stored: put it again"
        )

    def _lock_failed(self, code: int) -> _Busy:
        """The status for a C put that did not finish: the reservation lock it could not
        take, or its generation fenced (`ipc.fence`)."""
        if code == _native.FENCED:
            return _Busy(PutMessageStatus.SERVICE_NOT_AVAILABLE, self._fenced_reason())
        if code == _native.LOCK_TIMEOUT:
            return _Busy(
                PutMessageStatus.OS_PAGECACHE_BUSY,
                "the reservation lock was not free within osPageCacheBusyTimeOutMills "
                f"({self._busy_timeout_s * 1000:.0f} ms): another producer holds it",
            )
        return _Busy(
            PutMessageStatus.SERVICE_NOT_AVAILABLE,
            "the reservation lock is unrecoverable (a producer died while repairing it); "
            "restart the store",
        )

    def _reserve(self, preps: list[_Prep]) -> tuple[int, int, int, int, list[int]]:
        """Reserve space for `preps` (one segment) when the C call could not: a roll, a
        wait, a new queue row. Returns (first seq, start offset, blank size before it (0:
        none), store timestamp, queue offsets). Raises _Busy, _Refused. Caller holds the
        thread lock. Same steps, order and mutex as `ipc/native/mqs_append.c: mqs_reserve`."""
        total = 0
        for p in preps:
            total += p[_P_SIZE]
        buf = self._buf
        seg_size = self._seg_size
        deadline = 0.0
        pause = 0.00005
        app = self._app
        pid = self._pid
        positions, resv = Positions(buf), Reservation(buf)
        store_flags, disk_state = Flags(buf), DiskWord(buf)
        while True:
            code = app.lock(self._busy_ns)
            if code:
                raise self._lock_failed(code)
            try:
                flags = store_flags.word
                if flags & (c.FLAG_REFUSE_WRITES | c.FLAG_READ_ONLY | c.FLAG_STOPPED) or not (
                    flags & c.FLAG_RUNNING
                ):
                    raise _Refused(
                        "the store is read-only after a failed fsync"
                        if flags & c.FLAG_READ_ONLY
                        else "the store is stopping or not running; writes are refused"
                    )
                disk = disk_state.word
                if disk & DISK_FULL_BIT:
                    ratio = decode_state(disk)[2]
                    raise _Refused(
                        f"the disk is full ({ratio:.1%} used); writes resume by themselves "
                        "once the cleaner has freed space"
                    )
                reserved, seq = positions.reserved_and_seq()
                if reserved < 0 or seq < 0:  # a scribbled block: never reserve there
                    raise _Refused("the control block's positions are out of range")
                index = reserved // seg_size
                pos = reserved - index * seg_size
                if pos + total + END_FILE_MIN_BLANK_LENGTH > seg_size:
                    blank = seg_size - pos
                    index += 1
                    start = index * seg_size
                    nslots = len(preps) + 1
                else:
                    blank = 0
                    start = reserved
                    nslots = len(preps)
                end = start + total
                why = ""
                if end > positions.allocated:
                    why = "file"
                elif self._pool_n and positions.committed < (index - self._pool_n + 1) * seg_size:
                    why = "pool"
                elif seq + nslots - positions.published_seq > self._slot_count:
                    why = "slots"
                if not why:
                    # The intent record (cs_seq, then cs_pid), as mqs_reserve writes it.
                    resv.write_intent(seq, pid)
                    now = _time_ns() // 1_000_000
                    first = seq
                    slot_off = c.SLOTS_OFF
                    slot_row = c.SLOT_ROW
                    count = self._slot_count
                    if blank:
                        _SLOT_PACK(
                            buf, slot_off + (seq % count) * slot_row,
                            reserved, 0, now, blank, pid, -1, c.STATE_RESERVED,
                        )  # fmt: skip
                        seq += 1
                    qoffs: list[int] = []
                    qupd: dict[int, int] = {}
                    at = start
                    qslots = self._qslots
                    qtable_off = self._qtable_off
                    for i, p in enumerate(preps):
                        key = (p[_P_TOPIC], p[_P_QUEUE])
                        qs = qslots.get(key)
                        if qs is None:
                            qs = self._cb.find_or_add_queue(p[_P_TOPIC], p[_P_QUEUE])
                            if qs < 0:
                                resv.clear_intent()
                                raise _Busy(
                                    PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    "the queue table of the control block is full",
                                )
                            qslots[key] = qs
                        if p[_P_TAKES]:
                            qo = qupd.get(qs)
                            if qo is None:
                                qo = _I64_UNPACK(buf, qtable_off + qs * c.QROW + 8)[0]
                            qupd[qs] = qo + 1
                        else:
                            qo = 0
                        qoffs.append(qo)
                        joined = c.STATE_JOINED if i or blank else 0  # one reservation
                        _SLOT_PACK(
                            buf, slot_off + (seq % count) * slot_row, at, qo, now, p[_P_SIZE],
                            pid, qs if p[_P_TAKES] else -2, c.STATE_RESERVED | joined,
                        )  # fmt: skip
                        seq += 1
                        at += p[_P_SIZE]
                    resv.commit_reservation(end, seq)  # the commit point
                    for qs, nxt in qupd.items():
                        _I64_PACK(buf, qtable_off + qs * c.QROW + 8, nxt)
                    resv.clear_intent()
                    return first, start, blank, now, qoffs
            finally:
                app.unlock()
            # Not enough room: the pool buffer, the next file or the slot ring is busy.
            now_s = time.monotonic()
            if deadline == 0.0:
                if why == "pool" and self._fast_fail:
                    raise _Busy(PutMessageStatus.OS_PAGECACHE_BUSY, "no free write-pool buffer")
                deadline = now_s + self._busy_timeout_s
                resv.count_busy_wait()
            elif now_s >= deadline:
                if why == "file":
                    raise _Busy(
                        PutMessageStatus.CREATE_MAPPED_FILE_FAILED,
                        "the allocator did not have the next segment file ready in "
                        f"{self._busy_timeout_s * 1000:.0f} ms",
                    )
                raise _Busy(
                    PutMessageStatus.OS_PAGECACHE_BUSY,
                    f"no free {'write-pool buffer' if why == 'pool' else 'reservation slot'} "
                    f"within {self._busy_timeout_s * 1000:.0f} ms",
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.002)

    def _abandon(self, first: int, count: int) -> None:
        """Hand reservations this process will not finish to the publisher's filler."""
        for seq in range(first, first + count):
            state = self._cb.slot_state(seq)
            if state & c.STATE_MASK == c.STATE_RESERVED:
                self._cb.set_slot_state(seq, c.STATE_ABANDONED | (state & c.STATE_JOINED))

    def _copy(
        self, preps: list[_Prep], first: int, start: int, blank: int, now: int, qoffs: list[int]
    ) -> None:
        """The general path's copy: the C encoder writes each record (and the BLANK
        that ends the previous segment), then the reservation is completed, all or
        nothing (`Appender.complete`). Raises _Busy when its generation was fenced
        meanwhile (the filler had it: nothing of it is read)."""
        seg_size = self._seg_size
        seq = first
        index = start // seg_size
        write = self._app.write
        if blank:
            write(self._target(index - 1), seg_size - blank, seq, None, 0, 0, blank)
            seq += 1
        target = self._target(index)
        pos = start - index * seg_size
        for i, p in enumerate(preps):
            write(target, pos, seq, p, qoffs[i], start, now)
            seq += 1
            pos += p[_P_SIZE]
            start += p[_P_SIZE]
        if self._app.complete(first, seq - first) == _native.FENCED:
            raise _Busy(PutMessageStatus.SERVICE_NOT_AVAILABLE, self._fenced_reason())

    # --- the common case: one C call ------------------------------------------------------

    def _target_now(self) -> tuple[mmap.mmap | None, int]:
        """What the C put writes into: (None, -1) with the pool on (it holds the pool),
        else the newest mapped segment and its index (another index: FALLBACK)."""
        if self._pool_n:
            return None, -1
        index, mm = self._cur
        return mm, index

    def _put_one(self, qslot: int, p: _Prep) -> tuple[int, int, int, int, int] | int:
        """`Appender.put`: (seq, start, store timestamp, queue offset, lock wait ns) or a
        code (FALLBACK, LOCK_TIMEOUT, LOCK_BROKEN)."""
        target, index = self._target_now()
        return self._app.put(target, index, qslot, p, self._busy_ns)

    def _put_many(
        self, qslots: list[int], preps: list[_Prep]
    ) -> tuple[int, int, int, list[int], int] | int:
        """`Appender.put_batch`, as `_put_one` for a batch."""
        target, index = self._target_now()
        return self._app.put_batch(target, index, qslots, preps, self._busy_ns)
