"""The reservation protocol: how many producer processes append to one log.

Every step in one place, whichever side implements it (C: `ipc/native/mqs_append.c`, the
common case of a put in one call; Python: the rare paths in `ipc.client` and the
publisher in `ipc.commit`). The fields live in the control block (`ipc.control`).

| field (control block)   | written by                | under                         |
| ----------------------- | ------------------------- | ----------------------------- |
| reserve_mutex           | producers (C), supervisor | robust process-shared mutex   |
| cs_pid, cs_seq (intent) | the lock holder            | the mutex                     |
| reserved_pos, seq       | the lock holder            | the mutex (the commit point)  |
| slot row seq % N        | holder: RESERVED; owner:   | RESERVED under the mutex,     |
|                         | DONE / ABANDONED;          | DONE / ABANDONED after it;    |
|                         | publisher: filled -> DONE  | fills under the commit lock   |
| queue row next_offset   | the lock holder            | the mutex                     |
| published_pos, _seq     | the publisher              | the commit lock               |

A slot's states (row `seq % slot_count`):

    FREE --reserve--> RESERVED --complete--> DONE --publish--> (reused)
                         |  \\--abandon--> ABANDONED --fill--> DONE
                         \\--owner dead (liveness byte free)--fill--> DONE

* **reserve** (C `mqs_reserve`, or `StoreClient._reserve` for rolls and waits): take the
  mutex with a deadline of `os_page_cache_busy_timeout_ms` (a holder that is stopped,
  not dead, makes others return OS_PAGECACHE_BUSY, never hang); write the intent
  (cs_seq, cs_pid), the RESERVED rows, then the commit point (reserved_pos and seq),
  then the queue rows' next offsets; clear the intent; unlock.
* **repair** (C, inside the lock): a holder that died in the section leaves the mutex
  EOWNERDEAD. The next locker reads the intent: slots in [cs_seq, seq) are committed and
  keep their queue offsets, so each queue row moves past them; rows at or after seq were
  never committed and are reused. Then `pthread_mutex_consistent`. A second death during
  repair makes the mutex ENOTRECOVERABLE: puts return SERVICE_NOT_AVAILABLE until the
  store restarts.
* **complete** (C `mqs_copy` + `mqs_mark_done`, outside the lock): the record is
  encoded straight into the pool buffer or the segment's mapping, then its slot DONE
  (a release store: the bytes are visible first).
* **abandon** (`StoreClient._abandon`): an exception between reserve and complete
  marks the slot ABANDONED.
* **publish** (`ipc.commit.LogFiles.publish`, under the commit lock): advance
  published_pos over contiguous DONE slots.
* **fill** (the publisher): a slot ABANDONED, or RESERVED by a process that is dead, is
  overwritten with a filler record of its length (`engine.filler`) and counts as DONE.

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
