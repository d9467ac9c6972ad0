"""The reservation protocol: how many producer processes append to one log.

Every step in one place, whichever side implements it (C: `ipc/native/mqs_append.c` and
`mqs_put.c`, every put in one call; Python: the publisher's fills in `ipc.commit`).
The fields live in the control block (`ipc.control`).

| field (control block)   | written by                | under                         |
| ----------------------- | ------------------------- | ----------------------------- |
| reserve_mutex           | producers (C), supervisor | robust process-shared mutex   |
| cs_pid, cs_seq (intent) | the lock holder            | the mutex                     |
| reserved_pos, seq       | the lock holder            | the mutex (the commit point)  |
| slot row seq % N        | holder: RESERVED; owner:   | RESERVED under the mutex,     |
|                         | DONE / ABANDONED;          | DONE / ABANDONED after it;    |
|                         | committer: filled -> DONE  | fills under the commit lock   |
| queue row next_offset   | the lock holder            | the mutex                     |
| published_pos, _ts      | any publisher: raised to a | compare-and-swap max, before  |
|                         | DONE slot's end            | published_seq passes the slot |
| published_seq           | any publisher              | compare-and-swap, one slot    |

A slot's states (row `seq % slot_count`):

    FREE --reserve--> RESERVED --complete--> DONE --publish (any)--> (reused)
                         |  \\--abandon--> ABANDONED --claim--> FILLING --fill--> DONE
                         \\--owner dead (liveness byte free), or fenced--claim--> FILLING

A reservation of several slots (a batch; a roll's BLANK and the records
after it) marks every slot after its first JOINED (`STATE_JOINED`, a bit beside the
state): it is completed, claimed and filled as one, so a batch is read whole or not
at all, whenever its producer dies or sleeps.

* **reserve** (C `mqs_reserve`, called from `mqs_put.c`): take the mutex (C
  `mqs_lock_held`): OS_PAGECACHE_BUSY once one holder has held it, and the put has
  waited, longer than `os_page_cache_busy_timeout_ms` (RocketMQ's isOSPageCacheBusy;
  a holder that is stopped, not dead, makes others busy, never hang), while holders
  that each hold it briefly are waited out up to `sync_flush_timeout_ms` in all; add
  the queue rows not known yet; write the intent (cs_seq, cs_pid), the RESERVED rows
  (first a BLANK's when the records roll to the next segment), then the commit point
  (reserved_pos and seq), then the queue rows' next offsets; clear the intent; unlock.
  No room (the next file, a pool buffer, slots, a commit backlog at its bound): unlock,
  sleep and try again until the busy timeout.
* **commit backlog** (C `mqs_backlog_full`, inside `mqs_reserve`; twin:
  tests/native/put_reference.py's `backlog_reference`): with the pool on, readers see
  only what the committer has copied into the files, so a producer may not start a
  reservation while `reserved - committed` is `commit_backlog_max_bytes` or more and has
  been at that bound (as this producer saw it) for `commit_backlog_grace_ms`; a producer
  that once waited waits at the bound again without a new grace, until it sees the
  backlog under half the bound. The bound is checked against the reservation's start,
  so one call larger than it still goes through. Each producer keeps its own note of
  since when (nothing shared is written); a stopped committer turns the wait into
  OS_PAGECACHE_BUSY at the busy timeout, never a hang. Pool off: no bound.
* **repair** (C, inside the lock): a holder that died in the section leaves the mutex
  EOWNERDEAD. The next locker reads the intent: slots in [cs_seq, seq) are committed and
  keep their queue offsets, so each queue row moves past them; rows at or after seq were
  never committed and are reused. Then `pthread_mutex_consistent`. A second death during
  repair makes the mutex ENOTRECOVERABLE: puts return SERVICE_NOT_AVAILABLE until the
  store restarts.
* **complete** (C `mqs_copy` for each record, then `mqs_complete`, outside the lock):
  the records are encoded straight into the pool buffer or the segment's mapping; then
  the joined slots DONE from the last back, then the first by a compare-and-swap from
  RESERVED. A publisher stops at the first slot not DONE, so it sees the whole
  reservation or none of it. A failed swap (the filler claimed it) or a reservation
  the fence did not see (`ipc.fence`) is a failed put: its producer gets
  SERVICE_NOT_AVAILABLE, never PUT_OK.
* **abandon** (C `mqs_abandon`): an exception between reserve and complete (a segment
  that cannot be mapped) marks the slots ABANDONED (keeping JOINED).
* **publish** (C `mqs_publish`, lock-free; twin: tests/native/put_reference.py's
  `publish_reference`): every producer
  runs it right after its done-mark, and the committer after its fills. While the slot
  at published_seq (below seq, so of this lap) is DONE: read its end and store time,
  re-read published_seq (a changed value means another publisher moved on and the row
  may already be a later lap's: start over), raise published_pos and published_ts to
  them (a compare-and-swap max), then move published_seq one on with a
  compare-and-swap. So the producer that completes the oldest pending slot publishes it
  and every DONE slot behind it: no put waits for the committer's tick. A full fence
  after the done-mark makes two producers finishing neighbouring slots unable to both
  miss the other's store. A publisher that dies leaves published_pos at most one slot
  ahead of published_seq (that slot is DONE); the next one moves published_seq on.
* **fill** (the committer, `ipc.commit.LogFiles.publish`, under the commit lock): a
  slot ABANDONED, or RESERVED by a process that is dead (or by anyone once the
  generation is fenced and drained), that stops publishing is claimed with its joined
  slots (C `mqs_claim`: each becomes FILLING, by a compare-and-swap for the first, so
  the producer's completion and the claim cannot both win), overwritten with filler
  records of their lengths (`engine.filler`), marked DONE (`mqs_fill_done`) and
  published.

**Liveness, robust to pid reuse** (`LiveLock`, `LiveTable`; LMDB's reader-table
scheme): each producing process holds a shared open-file-description lock on the byte
at offset = its pid of `<store>/.mqstore-live.lock` for its life. The kernel drops it at
death. The publisher asks whether anyone holds that byte: a pid reused by a process that
is not a producer of this store holds none. (A pid reused by another producer of this
store keeps the dead one's slot waiting until that producer exits.)

**Crash points** (`MQSTORE_CRASHPOINT=<point>:<kill|stop>[:<nth>]`, docs/crash-points.md):
`reserve-locked` (after the commit point, queue rows not yet written back),
`copy-half` (half the body copied), `before-done` (record copied, slot still RESERVED).
"""

from __future__ import annotations

import os
from typing import Final

from mqstore import _native

LIVE_LOCK: Final = ".mqstore-live.lock"


def live_lock_path(store_dir: str) -> str:
    return os.path.join(store_dir, LIVE_LOCK)


class LiveLock:
    """This process's liveness byte, held while the object is open. A forked child must
    `forget()` its inherited copy (the lock belongs to the open file description, which
    the child shares) and take its own."""

    def __init__(self, store_dir: str) -> None:
        self.fd = os.open(live_lock_path(store_dir), os.O_RDWR | os.O_CLOEXEC)
        try:
            _native.live_hold(self.fd, os.getpid())
        except OSError:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    forget = close  # closing our descriptor leaves the parent's lock (and file) alone


class LiveTable:
    """The checker's side: whether the producer with a given pid still lives."""

    def __init__(self, store_dir: str) -> None:
        self.path = live_lock_path(store_dir)
        self.fd = -1

    def alive(self, pid: int) -> bool:
        """True while a process of this store holds the byte of `pid`. One syscall.
        Without the file no producer ever attached: nobody is alive."""
        if self.fd < 0:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
        return pid > 0 and _native.live_check(self.fd, pid)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
