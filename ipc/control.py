"""The control block: one shared-memory segment every runtime process maps.

Created by the supervisor (`ControlBlock.create`), mapped by workers, clients and
`mqstore status` (`ControlBlock.attach`). Names are tied to the store: `mqs-<h>-<gen>-ctl`
and `mqs-<h>-<gen>-pool`, where `<h>` hashes the store's real path and `<gen>` is the
supervisor's generation, so leftovers of a crashed run are found by prefix and removed.

Header, layout version 4 (`MAGIC_VERSION`; little-endian int64 unless said). Python
outside this module reads and writes it only through the typed views of
`ipc.control_views`; each field's one writer, as the view method it calls. C runs the
same steps: the reservation and the publisher in `ipc/native/mqs_append.c`, and the
flusher's flush step (the SYNC_FLUSH round's commit, the flush, its statistics and
histograms, as `ipc.commit`'s references `sync_round_py` and `flush_and_wake_py`) in
`ipc/native/mqs_round.c`:

| off | field            | written only by                                          |
| --- | ---------------- | -------------------------------------------------------- |
| 0   | magic_version    | supervisor, once, last at `ControlBlock.create`          |
| 8   | reserved_pos     | the reservation lock holder, with `seq` in one store:    |
|     |                  | `Reservation.commit_reservation` (C `mqs_reserve`);      |
|     |                  | supervisor at boot: `Positions.seed_positions`           |
| 16  | seq              | as reserved_pos: next reservation slot sequence number   |
| 24  | published_pos    | publishers, compare-and-swap max: C `_native.publish`    |
|     |                  | (producers, commit step); `Positions.seed_positions`     |
| 32  | published_seq    | as published_pos (compare-and-swap)                      |
| 40  | committed_pos    | the commit step (`ipc.commit`: committer, or flusher on  |
|     |                  | demand): `Positions.advance_committed`; `seed_positions` |
| 48  | flushed_pos      | the flush step (flusher; supervisor at drain):           |
|     |                  | `Positions.advance_flushed`; `seed_positions`            |
| 56  | flags            | `Flags`: supervisor `mark_running`,                      |
|     |                  | `mark_refusing_writes`, `mark_stopped`; a failing worker |
|     |                  | (or the supervisor for it) `mark_read_only`; FENCED (and |
|     |                  | REFUSE_WRITES) by the fence, C `mqs_fence` (`ipc.fence`) |
| 64  | generation       | supervisor, once at create (`ControlBlock.generation`)   |
| 72  | supervisor_pid   | supervisor, once at create (`.supervisor_pid`)           |
| 80  | allocated_upto   | allocator (supervisor at boot):                          |
|     |                  | `Positions.raise_allocated`, the end of the ready files  |
| 88  | cs_pid           | the lock holder (C `mqs_reserve`): pid inside the        |
|     |                  | section, cleared before it unlocks                       |
| 96  | cs_seq_start     | the lock holder (C `mqs_reserve`): `seq` when that       |
|     |                  | section began                                            |
| 104 | segment_size     | supervisor, once at create (`.segment_size`)             |
| 112 | pool_buffers     | supervisor, once at create (0 = pool off, direct mmap)   |
| 120 | slot_count       | supervisor, once at create                               |
| 128 | qtable_capacity  | supervisor, once at create                               |
| 136 | fsync_count      | the flush step: `FlushStats.record_fsync`                |
| 144 | fsync_msgs       | the flush step: `FlushStats.record_fsync`, reservation   |
|     |                  | slots covered by its fsyncs                              |
| 152 | published_ts     | as published_pos: store time of the last published slot  |
| 160 | committed_ts     | the commit step: `Positions.stamp_committed`             |
| 168 | flushed_ts       | the flush step: `Positions.advance_flushed` (the         |
|     |                  | checkpoint's physic_msg_timestamp)                       |
| 176 | busy_count       | producers (C `mqs_put.c`), reservations that waited for  |
|     |                  | room (racy counter, statistics only)                     |
| 184 | fillers          | the commit step's publisher: `Reservation.count_filler`, |
|     |                  | slots filled for dead producers                          |
| 192 | stale_from       | the commit step's publisher: `Reservation.mark_stale`,   |
|     |                  | 1 + the lowest offset it filled for a producer that may  |
|     |                  | still live (a fenced drain); 0 none (`ipc.fence`)        |
| 200 | topics_deleted   | dispatcher: `DispatchStats.count_topic_deleted`, topics  |
|     |                  | deleted while the store runs (`workers.topic_delete`);   |
|     |                  | readers drop their cached queues of them when it moves   |
| 208 | flushed_seq      | the flush step: `Positions.advance_flushed`              |
| 216 | fsync_ns_total   | the flush step: `FlushStats.record_fsync`                |
| 224 | flush_failures   | flusher: `FlushStats.count_flush_failure`                |
| 232 | committed_seq    | the commit step: `Positions.stamp_committed`, the        |
|     |                  | `published_seq` its commit covered                       |
| 240 | disk_state       | cleaner: `DiskWord.set_disk_state`; bit 0 DISK_FULL,     |
|     |                  | bit 1 CLEAN_IMMEDIATELY, bits 16.. the disk usage in per |
|     |                  | mille (`engine.diskguard`)                               |
| 248 | fsync_hist[13]   | flusher: `Histograms.count_fsync`, fsyncs by duration,   |
|     |                  | bucket i up to 2^(i+6) µs (64 µs .. 131 ms), the last    |
|     |                  | one unbounded                                            |
| 352 | group_hist[12]   | flusher: `Histograms.count_fsync`, fsyncs by reservation |
|     |                  | slots covered, bucket i up to 2^i (1 .. 1024), the last  |
|     |                  | one unbounded                                            |
| 448 | dispatched_pos   | dispatcher: `Positions.set_dispatched` (supervisor seeds |
|     |                  | it at boot): consume queues and index hold every record  |
|     |                  | below it                                                 |
| 456 | dispatched_ts    | dispatcher: `DispatchStats.set_last_dispatched_ts`,      |
|     |                  | store time of the last record dispatched                 |
| 464 | dispatched_count | dispatcher: `DispatchStats.set_dispatched_records`,      |
|     |                  | records dispatched since boot                            |
| 472 | dispatch_lag_ms  | dispatcher: `Histograms.store_dispatch_lag`, the sum of  |
|     |                  | the lags in the dispatch-lag histogram, never reset      |
| 480 | nonce            | supervisor, once at create (`.nonce`): random, also in   |
|     |                  | `.mqstore-ipc.json`; clients refuse a block without it   |
|     |                  | (`ipc.session`; the rules: `ipc.access`)                 |
| 488 | python_batches   | dispatcher: `DispatchStats.set_python_batches`, batches  |
|     |                  | its C round declined (engine.dispatch's Python path)     |
|     |                  | since boot, continued by a restarted dispatcher          |

Native area at 2048 (layout version 4), owned by the C core (`ipc/native/mqs_layout.h`
mirrors these offsets; `ipc.reservation` and `ipc/native/mqs_futex.h` say how they are used):

| off  | field            | written only by                                          |
| ---- | ---------------- | -------------------------------------------------------- |
| 2048 | reserve_mutex    | the serialising step of reservations: a robust, process- |
|      |                  | shared pthread mutex (64 bytes), made by the supervisor  |
| 2112 | flush_seq u32    | flusher: bumped after each move of flushed_pos (futex)   |
| 2116 | flusher_wake u32 | producers and committer: bumped to wake it (futex)       |
| 2120 | flusher_sleeps   | flusher (u32): 1 while it waits on flusher_wake          |
| 2124 | lock_broken u32  | a producer that found the mutex ENOTRECOVERABLE          |
| 2128 | sync_request     | sync producers (compare-and-swap max): furthest end      |
|      |                  | anyone waits for                                         |
| 2136 | lock_timeouts    | producers: reservation-lock waits that timed out         |
| 2144 | owner_dead       | producers: repairs after a holder died in the section    |
| 2152 | gather_want      | flusher: the published_seq it gathers for before forcing |
|      |                  | (0: none); a producer wakes it only once that is reached |
| 2160 | fence_seq        | the fence, once (C `mqs_fence`, `ipc.fence.fence`): 1 +  |
|      |                  | the first seq never published (0: not fenced)            |
| 2168 | idle_wake u32    | publishers (C `mqs_publish`): bumped to wake the idle    |
|      |                  | committer and dispatcher (futex, `_native.idle_sleep`)   |
| 2172 | idle_sleeps u32  | an idle worker sets it before sleeping on idle_wake; the |
|      |                  | first publish after takes it back to 0 and wakes them    |
| 2176 | lock_since       | the reservation lock's holder: CLOCK_MONOTONIC ns it     |
|      |                  | took the lock (a put's: read just before its uncontended |
|      |                  | try), 0 once released; a waiter is refused once          |
|      |                  | one holder held it > osPageCacheBusyTimeOutMills         |
| 2184 | lock_queued      | producers: lock waits refused at their cap (the sync     |
|      |                  | flush timeout) with no holder over the busy timeout      |
| 2192 | room_timeouts    | producers: puts refused after waiting the busy timeout   |
|      |                  | for room (the next file, a pool buffer, slots)           |
| 2200 | commit_drain     | committer: `Positions.set_commit_drain`, the bytes it    |
|      |                  | commits in `commit_backlog_drain_ms` at its recent pace  |
|      |                  | (0: not measured yet, or no such bound); producers wait  |
|      |                  | at a backlog that large (C `mqs_backlog_full`)           |

Workers table at 512: 8 rows of 64 bytes (pid, heartbeat_ms, restarts, state, name 32s),
written by the worker (heartbeat) and the supervisor (pid, restarts, state). heartbeat_ms
is CLOCK_MONOTONIC ms (`heartbeat_clock_ms`), never the wall clock: a step of it (NTP,
`date -s`) would look like a silence or a beat from the future.

Dispatch lag at 1024: 18 int64, records dispatched by lag (dispatch time minus store time),
bucket i for lags under 2^i ms, the last one unbounded; written by the dispatcher only
(`Histograms.store_dispatch_lag`), never reset (a restarted dispatcher continues from the
counts it finds).

Client statistics at 4096: 256 rows of `CLIENT_FIELDS` int64, row owned by one client,
assigned at attach: pid, puts, errors, bytes, lat_max_ns, sync_puts, lat_sum_ns, puts by
status (`STATUS_FIELDS`, in `PutMessageStatus` order), put latency in `HIST_BUCKETS`
log2-µs buckets (bucket b: up to 2^b µs), then per phase (lock wait, append, flush wait)
`PHASE_BUCKETS` log2-µs buckets and the phase's sum in ns.

Reservation slots at 262144: `slot_count` rows of 40 bytes (offset q, queue_offset q,
store_ts q, size i, pid i, qslot i, state i), row `seq % slot_count`. A producer writes
its rows RESERVED under the lock and sets DONE after its copy; the publisher advances
`published_pos` over contiguous DONE rows. A state's low byte is the state
(`STATE_MASK`); `STATE_JOINED` marks a row of the same reservation as the row before
it (a batch), completed or filled together (`ipc.reservation`).

Queue table after the slots: `qtable_capacity` rows of 160 bytes (hash q, next_offset
q, queue_id i, topic_len i, topic 128s), open addressing, rows only ever added, all
writes under the reservation lock.

Idempotence table after the queue table (at the geometry's `idem_off`, `IDEM_SIZE`
bytes of `_native`; `ipc/native/mqs_uniq.h`): a 64-byte head, then `IDEM_PRODUCERS`
producer rows (the first 10 bytes of the producer's UNIQ_KEYs, last use, puts noted),
each a ring of its last `IDEM_WINDOW` puts (the key's last 6 bytes, offset, queue offset,
store time, slot seq, size, queue id, state: 1 pending, 2 stored). Written under the
reservation lock by the C put (its DONE mark after the reservation completed), and by
the supervisor from the log before the block serves (`ipc/idem.py`).

Positions are plain aligned int64 stores (Python's through `words`: one store of the
whole field, never `struct.pack_into`, which clears it first); each has one writer,
readers tolerate reading an older value, never one nobody stored. On x86-64 (TSO) a
reader that sees a slot DONE sees the bytes copied before it.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import contextlib
import errno
import mmap
import os
import struct
import time
from _blake2 import blake2b  # hashlib's own blake2b, without hashlib's OpenSSL load
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

from mqstore import _native
from mqstore.engine.findings import Finding, Severity

if TYPE_CHECKING:  # the supervisor's (`ControlBlock.create`): clients map with `Mapped`
    from multiprocessing import shared_memory

MAGIC_VERSION: Final = 0x4D51_4354_4C00_0004  # "MQCTL", layout version 4

OFF_MAGIC_VERSION: Final = 0
OFF_RESERVED: Final = 8
OFF_SEQ: Final = 16
OFF_PUBLISHED: Final = 24
OFF_PUBLISHED_SEQ: Final = 32
OFF_COMMITTED: Final = 40
OFF_FLUSHED: Final = 48
OFF_FLAGS: Final = 56
OFF_GENERATION: Final = 64
OFF_SUP_PID: Final = 72
OFF_ALLOCATED: Final = 80
OFF_CS_PID: Final = 88
OFF_CS_SEQ: Final = 96
OFF_SEGMENT_SIZE: Final = 104
OFF_POOL_BUFFERS: Final = 112
OFF_SLOT_COUNT: Final = 120
OFF_QCAP: Final = 128
OFF_FSYNC_COUNT: Final = 136
OFF_FSYNC_MSGS: Final = 144
OFF_PUBLISHED_TS: Final = 152
OFF_COMMITTED_TS: Final = 160
OFF_FLUSHED_TS: Final = 168
OFF_BUSY: Final = 176
OFF_FILLERS: Final = 184
OFF_STALE_FROM: Final = 192
OFF_TOPICS_DELETED: Final = 200
OFF_FLUSHED_SEQ: Final = 208
OFF_FSYNC_NS: Final = 216
OFF_FLUSH_FAILURES: Final = 224
OFF_COMMITTED_SEQ: Final = 232
OFF_DISK_STATE: Final = 240
# The flusher's histograms (248..447), never reset: fsync durations and the slots (messages
# or batches) each fsync covered (group commit sizes); `bucket_of` picks the bucket.
OFF_FSYNC_HIST: Final = 248
FSYNC_HIST_BUCKETS: Final = 13
FSYNC_HIST_SHIFT: Final = 6  # bucket 0: up to 2^6 µs
OFF_GROUP_HIST: Final = 352
GROUP_HIST_BUCKETS: Final = 12
# The dispatcher's fields (448..479), written only by the dispatcher (the supervisor seeds
# OFF_DISPATCHED with the recovered end at boot): where the consume queues and the index
# end, the store time of the last record dispatched, and records dispatched since boot.
OFF_DISPATCHED: Final = 448
OFF_DISPATCHED_TS: Final = 456
OFF_DISPATCHED_RECORDS: Final = 464
OFF_DISPATCH_LAG_SUM_MS: Final = 472
OFF_NONCE: Final = 480
OFF_PYTHON_BATCHES: Final = 488
OFF_DISPATCH_LAG_HIST: Final = 1024
DISPATCH_LAG_BUCKETS: Final = 18
# The native area (2048..2303), see the module docstring.
OFF_RESERVE_MUTEX: Final = 2048
OFF_FLUSH_SEQ: Final = 2112
OFF_FLUSHER_WAKE: Final = 2116
OFF_FLUSHER_SLEEPS: Final = 2120
OFF_LOCK_BROKEN: Final = 2124
OFF_SYNC_REQUEST: Final = 2128
OFF_LOCK_TIMEOUTS: Final = 2136
OFF_OWNER_DEAD: Final = 2144
OFF_GATHER_WANT: Final = 2152
OFF_FENCE_SEQ: Final = 2160
OFF_IDLE_WAKE: Final = 2168
OFF_IDLE_SLEEPS: Final = 2172
OFF_LOCK_SINCE: Final = 2176
OFF_LOCK_QUEUED: Final = 2184
OFF_ROOM_TIMEOUTS: Final = 2192
OFF_COMMIT_DRAIN: Final = 2200


def bucket_of(value: int, shift: int, buckets: int) -> int:
    """The log2 bucket of `value`: bucket i holds values up to 2^(i+shift); the last
    bucket holds everything larger."""
    if value <= 1 << shift:
        return 0
    return min((value - 1).bit_length() - shift, buckets - 1)


FLAG_RUNNING: Final = 1
FLAG_REFUSE_WRITES: Final = 2
FLAG_READ_ONLY: Final = 4
FLAG_STOPPED: Final = 8
FLAG_FENCED: Final = 16  # the generation is over (`ipc.fence`)
FLAG_NAMES: Final = {
    FLAG_RUNNING: "running",
    FLAG_REFUSE_WRITES: "refuse_writes",
    FLAG_READ_ONLY: "read_only",
    FLAG_STOPPED: "stopped",
    FLAG_FENCED: "fenced",
}

WORKERS_OFF: Final = 512
WORKER_ROW: Final = 64
MAX_WORKERS: Final = 8
_WORKER = struct.Struct("<qqqq32s")
# The row's fields by offset (stored one word each, `words`; pinned to the table above by
# tests/engine/test_layout_pins.py).
WORKER_PID_OFF: Final = 0
WORKER_HB_OFF: Final = 8
WORKER_RESTARTS_OFF: Final = 16
WORKER_STATE_OFF: Final = 24
WORKER_NAME_OFF: Final = 32

CLIENTS_OFF: Final = 4096
MAX_CLIENTS: Final = 256
# The client row's fields (indexes into the row).
CF_PID: Final = 0
CF_PUTS: Final = 1
CF_ERRORS: Final = 2
CF_BYTES: Final = 3
CF_LAT_MAX_NS: Final = 4
CF_SYNC_PUTS: Final = 5
CF_LAT_SUM_NS: Final = 6
CF_STATUS: Final = 7
STATUS_FIELDS: Final = 11  # len(PutMessageStatus), checked by the tests
CF_HIST: Final = CF_STATUS + STATUS_FIELDS
HIST_BUCKETS: Final = 32  # up to 2^31 µs (36 min), the last one unbounded
CF_PHASES: Final = CF_HIST + HIST_BUCKETS
PHASES: Final = ("lock_wait", "append", "flush_wait")
PHASE_BUCKETS: Final = 24  # up to 2^23 µs (8.4 s), the last one unbounded
PHASE_FIELDS: Final = PHASE_BUCKETS + 1  # the buckets, then the sum in ns
CLIENT_FIELDS: Final = CF_PHASES + len(PHASES) * PHASE_FIELDS
CLIENT_ROW: Final = CLIENT_FIELDS * 8
_CLIENT = struct.Struct(f"<{CLIENT_FIELDS}q")

SLOTS_OFF: Final = 262144
SLOT_ROW: Final = 40
SLOT = struct.Struct("<qqqiiii")  # offset, queue_offset, store_ts, size, pid, qslot, state
SLOT_STATE_OFF: Final = 36
STATE_FREE: Final = 0
STATE_RESERVED: Final = 1
STATE_DONE: Final = 2
STATE_ABANDONED: Final = 3  # its producer gave up mid-copy (an exception): fill it now
STATE_FILLING: Final = 4  # claimed by the filler (`_native.claim`): the put failed
STATE_MASK: Final = 0xFF  # the state; above it, bits
STATE_JOINED: Final = 0x100  # of the same reservation as the slot before it

QROW: Final = 160
QROW_HEAD = struct.Struct("<qqii")  # hash, next_offset, queue_id, topic_len
QROW_NEXT_OFF: Final = 8  # next_offset in a row (pinned as WORKER_HB_OFF is)
QTOPIC_MAX: Final = 128

I64 = struct.Struct("<q")
I32 = struct.Struct("<i")
PAIR = struct.Struct("<qq")


def heartbeat_clock_ms() -> int:
    """The clock of the workers table's heartbeats, in ms: CLOCK_MONOTONIC, which is
    one clock for every process of the host and never steps. Not the wall clock (a step
    back makes every beat one from the future, a step forward a silence that gets
    workers killed), nor CLOCK_BOOTTIME: a suspended machine runs no worker and no
    judge, so its sleep is nobody's silence (`workers.heartbeat`)."""
    return time.monotonic_ns() // 1_000_000


def words(buf: memoryview | bytearray, fmt: Literal["q", "i"] = "q") -> memoryview:
    """`buf` as native int64 (or, with fmt "i", int32) words: `words(buf)[off >> 3] = v`
    is one aligned store of the whole field (x86-64 only, as the rest of the block:
    native order is the layout's little-endian). The block's shared fields are stored
    this way, never with `struct.pack_into`: CPython's packer clears the field before
    it writes it (the memset at the top of `_struct.c`'s `s_pack_internal`), so a
    process reading at that moment loads a 0 nobody stored: a position that went back
    to 0 (the supervisor's `damage()` saw "flushed 132632318, committed 0"), a flags
    word without READ_ONLY or FENCED, a heartbeat from 1970. Release the view before
    the mapping closes."""
    view = memoryview(buf)
    if fmt == "q":
        return view[: len(view) // 8 * 8].cast("q")
    return view[: len(view) // 4 * 4].cast("i")


WORKER_STATE_NAMES: Final = {0: "-", 1: "starting", 2: "running", 3: "exited", 4: "halted"}


def store_hash(store_dir: str | os.PathLike[str]) -> str:
    """Ten hex digits of the store's real path: the stem of every runtime name."""
    import hashlib  # here: OpenSSL's load (~2 ms CPU) is not for a producer's import

    real = os.path.realpath(os.fspath(store_dir))
    return hashlib.sha1(real.encode("utf-8", "surrogateescape")).hexdigest()[:10]


def shm_names(
    store_dir: str | os.PathLike[str], generation: int, token: str = ""
) -> tuple[str, str]:
    """The segments' names: the store's stem, the boot's generation and a random token
    (the supervisor's `secrets.token_hex`), so that nobody can guess or squat them."""
    stem = f"mqs-{store_hash(store_dir)}-{generation}" + (f"-{token}" if token else "")
    return f"{stem}-ctl", f"{stem}-pool"


def leftover_shm(store_dir: str | os.PathLike[str]) -> list[str]:
    """Names in /dev/shm that belong to this store (any generation)."""
    prefix = f"mqs-{store_hash(store_dir)}-"
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except FileNotFoundError:
        return []


def remove_leftovers(store_dir: str | os.PathLike[str]) -> list[str]:
    """Unlink every shared-memory segment of this store; supervisor only, before create."""
    removed = []
    for name in leftover_shm(store_dir):
        try:
            os.unlink(os.path.join("/dev/shm", name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _untrack(shm: shared_memory.SharedMemory) -> None:
    # Python 3.11: the resource tracker would unlink the segment when this process
    # exits. Nobody but the supervisor unlinks, and it does so explicitly.
    from multiprocessing import resource_tracker

    with contextlib.suppress(Exception):  # the tracker may not be running
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]


class Mapped:
    """An existing segment mapped read-write, as `shared_memory.SharedMemory(name)` maps
    it, but never registered with the resource tracker. Python 3.11 registers every
    attach; undoing it (`_untrack`) races when threads, or processes sharing a tracker,
    attach the same name at once (register, register, unregister, unregister: the
    tracker prints a KeyError traceback), and costs a tracker process per client.
    Nobody but the supervisor unlinks."""

    def __init__(self, name: str) -> None:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            self._mmap = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.name = name
        self.size = len(self._mmap)  # as SharedMemory.size (the geometry checks)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        self.buf.release()
        self._mmap.close()


def _pool_error(pool_name: str, size: int) -> str:
    return (
        f"cannot create the write pool {pool_name} ({size} bytes); /dev/shm is often "
        "64 MiB in containers: lower transient_store_pool_size or segment_size_bytes, or "
        "turn the pool off"
    )


_WARM_CHUNK: Final = 1 << 20


def _warm_pool(fd: int, size: int) -> None:
    """Write zeros over the whole pool once, as RocketMQ's TransientStorePool allocates
    its buffers at start: every page then exists and is up to date, so a producer's
    first lap takes no page allocation and its first touch of a page maps the pages
    around it too (the kernel's fault-around maps only up-to-date pages; fallocate's
    are not). A /dev/shm too small fails here (ENOSPC), not with a SIGBUS in a put."""
    zeros = bytes(_WARM_CHUNK)
    view = memoryview(zeros)
    off = 0
    while off < size:
        n = os.pwrite(fd, view[: min(_WARM_CHUNK, size - off)], off)
        if n <= 0:
            raise OSError(errno.ENOSPC, "short write")
        off += n


class Geometry(NamedTuple):
    """The control block's sizes. A `NamedTuple`: a dataclass's decoration is compiled
    at every producer's import (bench/results/client_start.md)."""

    segment_size: int
    pool_buffers: int
    slot_count: int = 8192
    qtable_capacity: int = 16384

    @property
    def qtable_off(self) -> int:
        return SLOTS_OFF + self.slot_count * SLOT_ROW

    @property
    def idem_off(self) -> int:
        return self.qtable_off + self.qtable_capacity * QROW

    @property
    def size(self) -> int:
        return self.idem_off + _native.IDEM_SIZE


def has_magic(buf: memoryview) -> bool:
    """Whether `buf` begins like a complete control block of this layout version."""
    return len(buf) >= SLOTS_OFF and I64.unpack_from(buf, OFF_MAGIC_VERSION)[0] == MAGIC_VERSION


def block_users(buf: memoryview) -> list[int]:
    """The pids a block names as its users: its supervisor, then its workers' rows (any
    of them may be dead or reused: `ipc.fence` checks each one's mappings)."""
    pids = [int(I64.unpack_from(buf, OFF_SUP_PID)[0])]
    for i in range(MAX_WORKERS):
        pids.append(int(_WORKER.unpack_from(buf, WORKERS_OFF + i * WORKER_ROW)[0]))
    return [p for p in pids if p > 0]


def geometry_error(geo: Geometry, ctl_size: int, pool_size: int | None) -> str:
    """Why a control block of `ctl_size` bytes (and a pool of `pool_size`, None: no
    pool) cannot have the geometry its header says, or "": every mapping checks it
    before using a word of it (same-user writes into the block are out of the trust
    model, but must give an error, not a signal or a wrong offset)."""
    if geo.segment_size <= 0 or geo.segment_size % 4096 or geo.segment_size > 1 << 40:
        return f"segment_size {geo.segment_size} is not a segment size"
    if not 0 < geo.slot_count <= 1 << 24 or not 0 < geo.qtable_capacity <= 1 << 24:
        return f"slot_count {geo.slot_count} or qtable_capacity {geo.qtable_capacity} out of range"
    if geo.size > ctl_size:
        return f"the block is {ctl_size} bytes, its geometry needs {geo.size}"
    if (pool_size is None) != (geo.pool_buffers == 0) or geo.pool_buffers < 0:
        return f"pool_buffers {geo.pool_buffers} does not match the pool mapped"
    if pool_size is not None and pool_size < geo.pool_buffers * geo.segment_size:
        return f"the pool is {pool_size} bytes, not {geo.pool_buffers} segments"
    return ""


class ControlBlock:
    """A mapped control block (and the pool, when on). See the module docstring."""

    def __init__(
        self,
        ctl: shared_memory.SharedMemory | Mapped,
        pool: shared_memory.SharedMemory | Mapped | None,
        *,
        owner: bool,
    ) -> None:
        self._ctl = ctl
        self._pool = pool
        self.owner = owner
        self._closed = False
        assert ctl.buf is not None
        self.buf: memoryview = ctl.buf
        self.words = words(self.buf)  # every int64 store into the block (`words`)
        self._i32 = words(self.buf, "i")  # the slots' int32 states
        self.pool_buf: memoryview | None = pool.buf if pool is not None else None
        if I64.unpack_from(self.buf, OFF_MAGIC_VERSION)[0] != MAGIC_VERSION:
            raise ValueError(f"{ctl.name}: not an mqstore control block (layout version 4)")
        self.segment_size = self.get(OFF_SEGMENT_SIZE)
        self.pool_buffers = self.get(OFF_POOL_BUFFERS)
        self.slot_count = self.get(OFF_SLOT_COUNT)
        self.qtable_capacity = self.get(OFF_QCAP)
        bad = geometry_error(
            Geometry(self.segment_size, self.pool_buffers, self.slot_count, self.qtable_capacity),
            ctl.size,
            pool.size if pool is not None else None,
        )
        if bad:
            raise ValueError(f"{ctl.name}: {bad}")
        self.qtable_off = SLOTS_OFF + self.slot_count * SLOT_ROW
        self.generation = self.get(OFF_GENERATION)
        self.supervisor_pid = self.get(OFF_SUP_PID)
        self.nonce = self.get(OFF_NONCE)
        self.ctl_name = ctl.name
        self.pool_name = pool.name if pool is not None else ""

    # --- lifecycle --------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        store_dir: str | os.PathLike[str],
        generation: int,
        geo: Geometry,
        *,
        token: str = "",
        nonce: int = 0,
        share_group: bool = False,
    ) -> ControlBlock:
        """Supervisor only: create the control block and the pool (zeroed by the OS),
        owner-only (0600), or 0660 and the store directory's group with `share_group`.
        Never over an existing name (O_EXCL): a squatted name fails here."""
        from multiprocessing import shared_memory  # (multiprocessing: not for clients)

        ctl_name, pool_name = shm_names(store_dir, generation, token)
        try:
            ctl = shared_memory.SharedMemory(ctl_name, create=True, size=geo.size)
        except OSError as e:
            raise OSError(
                e.errno, f"cannot create shared memory {ctl_name} ({geo.size} bytes): {e}"
            ) from e
        _untrack(ctl)
        pool = None
        if geo.pool_buffers > 0:
            size = geo.pool_buffers * geo.segment_size
            try:
                pool = shared_memory.SharedMemory(pool_name, create=True, size=size)
            except OSError as e:
                ctl.close()
                ctl.unlink()
                raise OSError(e.errno, f"{_pool_error(pool_name, size)}: {e}") from e
            try:
                _warm_pool(pool._fd, size)  # type: ignore[attr-defined]
            except OSError as e:
                pool.close()
                pool.unlink()
                ctl.close()
                ctl.unlink()
                raise OSError(e.errno, f"{_pool_error(pool_name, size)}: {e}") from e
            _untrack(pool)
        if share_group:
            gid = os.stat(store_dir).st_gid
            for seg in (ctl, pool):
                if seg is not None:
                    os.chown(os.path.join("/dev/shm", seg.name.lstrip("/")), -1, gid)
                    os.chmod(os.path.join("/dev/shm", seg.name.lstrip("/")), 0o660)
        b = ctl.buf
        assert b is not None
        for off, v in (
            (OFF_SEGMENT_SIZE, geo.segment_size),
            (OFF_POOL_BUFFERS, geo.pool_buffers),
            (OFF_SLOT_COUNT, geo.slot_count),
            (OFF_QCAP, geo.qtable_capacity),
            (OFF_GENERATION, generation),
            (OFF_SUP_PID, os.getpid()),
            (OFF_NONCE, nonce),
        ):
            I64.pack_into(b, off, v)
        _native.init_control(b)
        I64.pack_into(b, OFF_MAGIC_VERSION, MAGIC_VERSION)  # last: a block with it is complete
        return cls(ctl, pool, owner=True)

    @classmethod
    def attach(cls, ctl_name: str, pool_name: str) -> ControlBlock:
        """Map an existing control block (and pool). Raises FileNotFoundError."""
        ctl = Mapped(ctl_name)
        pool = None
        if pool_name:
            try:
                pool = Mapped(pool_name)
            except BaseException:
                ctl.close()
                raise
        return cls(ctl, pool, owner=False)

    def close(self) -> None:
        """Unmap (and, for the owner, unlink). Idempotent."""
        if self._closed:
            return
        self.words.release()
        self._i32.release()
        self.buf.release()
        if self.pool_buf is not None:
            self.pool_buf.release()
        self._ctl.close()
        if self._pool is not None:
            self._pool.close()
        if self.owner:
            for shm in (self._ctl, self._pool):
                if shm is not None:
                    # Not shm.unlink(): it would tell the resource tracker, which no
                    # longer tracks the name (see _untrack) and would complain.
                    with contextlib.suppress(FileNotFoundError):
                        _posixshmem.shm_unlink("/" + shm.name)
        self._closed = True

    # --- fields -------------------------------------------------------------------------

    def get(self, off: int) -> int:
        """A raw header field: for this module and tests; everything else reads through
        `ipc.control_views`."""
        return int(I64.unpack_from(self.buf, off)[0])

    def set(self, off: int, value: int) -> None:
        """A raw header store: for tests that inject a state; the store's own writers
        go through `ipc.control_views`."""
        self.words[off >> 3] = value

    def pool_view(self, segment_index: int) -> memoryview:
        """The pool buffer of a segment (segment i uses buffer i % pool_buffers)."""
        assert self.pool_buf is not None
        k = segment_index % self.pool_buffers
        s = self.segment_size
        return self.pool_buf[k * s : (k + 1) * s]

    # --- slots ----------------------------------------------------------------------------

    def slot(self, seq: int) -> tuple[int, int, int, int, int, int, int]:
        off = SLOTS_OFF + (seq % self.slot_count) * SLOT_ROW
        return SLOT.unpack_from(self.buf, off)

    def slot_state(self, seq: int) -> int:
        off = SLOTS_OFF + (seq % self.slot_count) * SLOT_ROW + SLOT_STATE_OFF
        return int(I32.unpack_from(self.buf, off)[0])

    def set_slot_state(self, seq: int, state: int) -> None:
        off = SLOTS_OFF + (seq % self.slot_count) * SLOT_ROW + SLOT_STATE_OFF
        self._i32[off >> 2] = state

    # --- queue table ------------------------------------------------------------------

    def qrow_off(self, qslot: int) -> int:
        return self.qtable_off + qslot * QROW

    def qrow(self, qslot: int) -> tuple[str, int, int]:
        """(topic, queue_id, next_offset) of a queue-table row."""
        _h, nxt, qid, tlen = QROW_HEAD.unpack_from(self.buf, self.qrow_off(qslot))
        off = self.qrow_off(qslot) + QROW_HEAD.size
        topic = bytes(self.buf[off : off + tlen]).decode("utf-8", "surrogateescape")
        return topic, int(qid), int(nxt)

    def find_or_add_queue(self, topic_b: bytes, queue_id: int) -> int:
        """The row of (topic, queue id), adding it if absent; -1 when the table is full.

        Caller holds the reservation lock (or is the supervisor at boot). O(1) expected.
        """
        key = topic_b + I32.pack(queue_id)
        h = int.from_bytes(blake2b(key, digest_size=8).digest(), "little") >> 1
        cap = self.qtable_capacity
        buf = self.buf
        for i in range(cap):
            slot = (h + i) % cap
            off = self.qtable_off + slot * QROW
            rh, _nxt, qid, tlen = QROW_HEAD.unpack_from(buf, off)
            if tlen == 0:
                t0 = off + QROW_HEAD.size
                buf[t0 : t0 + len(topic_b)] = topic_b
                QROW_HEAD.pack_into(buf, off, h, 0, queue_id, len(topic_b))
                return slot
            if rh == h and qid == queue_id and tlen == len(topic_b):
                t0 = off + QROW_HEAD.size
                if bytes(buf[t0 : t0 + tlen]) == topic_b:
                    return slot
        return -1

    def reset_topic_rows(self, topic_b: bytes) -> int:
        """Set the next queue offset of every row of `topic_b` back to 0 (a deleted
        topic's later puts start a new queue): the rows stay where they are, so clients
        that cached them stay right. Caller holds the reservation lock. Returns the rows."""
        n = 0
        for slot in range(self.qtable_capacity):
            off = self.qtable_off + slot * QROW
            _h, _nxt, _qid, tlen = QROW_HEAD.unpack_from(self.buf, off)
            t0 = off + QROW_HEAD.size
            if tlen == len(topic_b) and bytes(self.buf[t0 : t0 + tlen]) == topic_b:
                self.words[(off + QROW_NEXT_OFF) >> 3] = 0  # one store (`words`)
                n += 1
        return n

    def queue_rows(self) -> list[tuple[str, int, int]]:
        out = []
        for slot in range(self.qtable_capacity):
            off = self.qtable_off + slot * QROW
            if I32.unpack_from(self.buf, off + 20)[0]:
                out.append(self.qrow(slot))
        return out

    # --- workers ----------------------------------------------------------------------

    def worker_off(self, index: int) -> int:
        return WORKERS_OFF + index * WORKER_ROW

    def set_worker(self, index: int, name: str, pid: int, restarts: int, state: int) -> None:
        """The supervisor: a row's pid, restarts, state and name, its heartbeat to 0
        (each field one store, `words`; the name is the supervisor's alone)."""
        off, w = self.worker_off(index), self.words
        w[(off + WORKER_PID_OFF) >> 3], w[(off + WORKER_HB_OFF) >> 3] = pid, 0
        w[(off + WORKER_RESTARTS_OFF) >> 3] = restarts
        w[(off + WORKER_STATE_OFF) >> 3] = state
        name_b = name.encode()[:32].ljust(32, b"\0")
        self.buf[off + WORKER_NAME_OFF : off + WORKER_ROW] = name_b

    def set_worker_state(self, index: int, state: int) -> None:
        self.words[(self.worker_off(index) + WORKER_STATE_OFF) >> 3] = state

    def beat(self, index: int) -> None:
        """Worker `index`'s heartbeat, now on `heartbeat_clock_ms` (the worker; the
        supervisor when it spawns one)."""
        self.words[(self.worker_off(index) + WORKER_HB_OFF) >> 3] = heartbeat_clock_ms()

    def worker(self, index: int) -> tuple[str, int, int, int, int]:
        """(name, pid, heartbeat_ms, restarts, state)."""
        pid, hb, restarts, state, name = _WORKER.unpack_from(self.buf, self.worker_off(index))
        return name.rstrip(b"\0").decode(), int(pid), int(hb), int(restarts), int(state)

    # --- self-check -------------------------------------------------------------------

    def damage(self) -> str:
        """Why this block cannot be trusted any more, or "": a geometry word that differs
        from what it was when mapped, or positions out of order or negative (read from
        the last writer to the first, so moving positions never look out of order).
        Same-user writes into the block are out of the trust model; the supervisor
        makes the store read-only on them rather than act on them. O(1)."""
        for name, off, was in (
            ("segment_size", OFF_SEGMENT_SIZE, self.segment_size),
            ("pool_buffers", OFF_POOL_BUFFERS, self.pool_buffers),
            ("slot_count", OFF_SLOT_COUNT, self.slot_count),
            ("qtable_capacity", OFF_QCAP, self.qtable_capacity),
        ):
            now = self.get(off)
            if now != was:
                return f"{name} is {now}, it was {was}"
        flushed, committed = self.get(OFF_FLUSHED), self.get(OFF_COMMITTED)
        published, reserved = self.get(OFF_PUBLISHED), self.get(OFF_RESERVED)
        if not 0 <= flushed <= committed <= published <= reserved:
            return (
                f"positions out of order: flushed {flushed}, committed {committed}, "
                f"published {published}, reserved {reserved}"
            )
        return ""

    def check(self) -> list[Finding]:
        """Position and ring invariants (a snapshot: positions move while it reads, so
        it reads them from the last writer to the first). O(1)."""
        out: list[Finding] = []
        flushed = self.get(OFF_FLUSHED)
        committed = self.get(OFF_COMMITTED)
        published = self.get(OFF_PUBLISHED)
        pseq = self.get(OFF_PUBLISHED_SEQ)
        reserved, seq = PAIR.unpack_from(self.buf, OFF_RESERVED)
        where = self.ctl_name
        if not flushed <= committed <= published <= reserved:
            out.append(
                Finding(
                    Severity.ERROR,
                    f"positions out of order: flushed {flushed}, committed {committed}, "
                    f"published {published}, reserved {reserved}",
                    where,
                )
            )
        if not 0 <= seq - pseq <= self.slot_count:
            out.append(
                Finding(Severity.ERROR, f"slot ring: seq {seq}, published seq {pseq}", where)
            )
        if self.get(OFF_ALLOCATED) < reserved:
            out.append(Finding(Severity.ERROR, "reserved past the allocated files", where))
        if self.pool_buffers and (
            reserved // self.segment_size - committed // self.segment_size >= self.pool_buffers
        ):
            out.append(Finding(Severity.ERROR, "more segments in flight than pool buffers", where))
        return out

    # --- clients ----------------------------------------------------------------------

    def client_off(self, index: int) -> int:
        return CLIENTS_OFF + index * CLIENT_ROW

    def client_row(self, index: int) -> tuple[int, ...]:
        return tuple(int(v) for v in _CLIENT.unpack_from(self.buf, self.client_off(index)))

    def clear_client(self, index: int) -> None:
        off = self.client_off(index)
        self.buf[off : off + CLIENT_ROW] = bytes(CLIENT_ROW)

    def write_client(self, index: int, values: Sequence[int]) -> None:
        off = self.client_off(index)  # a copy, not pack_into's clear-then-write (`words`)
        self.buf[off : off + CLIENT_ROW] = _CLIENT.pack(*values)
