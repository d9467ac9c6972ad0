"""Types of the C extension `mqstore._native` (sources in ipc/native/ and engine/native/,
built by setup.py)."""

from collections.abc import Callable, Sequence
from typing import Any

from typing_extensions import Buffer

def crc32(data: Buffer, value: int = 0, /) -> int:
    """`zlib.crc32`, folded with PCLMULQDQ where the CPU has it."""

def crc32_slice8(data: Buffer, /) -> int:
    """The portable slicing-by-8 CRC alone (tests compare it with zlib)."""

def record_step(buf: Buffer, pos: int, limit: int, want: int, /) -> int:
    """`engine.scan.record_step_py` in C: the first record boundary at or past `want`
    following TOTALSIZEs from `pos`, or the last one reached before a size that is not
    positive or runs past `limit`. ValueError unless 0 <= pos <= limit <= len(buf)."""

def encode(
    topic: bytes,
    body: Buffer,
    properties: bytes,
    *,
    queue_id: int = 0,
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_addr: bytes = ...,
    born_port: int = ...,
    store_addr: bytes = ...,
    store_port: int = ...,
    reconsume_times: int = 0,
    prepared_offset: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    store_timestamp: int = 0,
) -> bytes:
    """One V1 record laid out as `engine.record.encode` does (inputs already validated)."""

# --- the put (ipc/native/mqs_put.c, mqs_fields.c, mqs_append.c) ------------------------

LOCK_TIMEOUT: int  # the reservation lock was not free within the timeout
LOCK_QUEUED: int  # lock_held: no holder held it too long, but the wait hit its cap
LOCK_BROKEN: int  # the reservation mutex is ENOTRECOVERABLE
FENCED: int  # the put's generation is over (ipc.fence): not stored
LAYOUT: dict[str, int]  # the control-block offsets C uses (ipc.control must agree)

# (size, queue_id, flag, sys_flag, born_ts, body, topic, properties, takes_offset,
#  reconsume_times, prepared_offset, born_addr, born_port, store_addr, store_port):
# a validated message for `write_record` (engine.commitlog)
Prep = tuple[int, int, int, int, int, bytes, bytes, bytes, bool, int, int, bytes, int, bytes, int]

IDEM_PRODUCERS: int  # producer rows of the idempotence table
IDEM_WINDOW: int  # puts remembered per producer
IDEM_SIZE: int  # the table's bytes, after the queue table

class UniqIds:
    """One client's RocketMQ message ids (MessageClientIDSetter): IPv4, pid, a random hash,
    ms since the local month began, a counter; pid, hash and the clock given: a test's."""

    def __init__(
        self,
        ip: bytes,
        pid: int | None = None,
        hash: int | None = None,
        clock_ms: int | None = None,
    ) -> None: ...
    def next(self) -> str:
        """A new UNIQ_KEY: 32 upper-case hex digits."""

    def set_clock(self, ms: int | None, /) -> None:
        """The time ids are made at (None: the real clock)."""

    @property
    def producer_id(self) -> str:
        """The ids' first 10 bytes as 20 hex digits."""

def idem_note(
    ctl: Buffer,
    uniq_key: str,
    offset: int,
    size: int,
    queue_id: int,
    queue_offset: int,
    store_ts: int,
    /,
) -> None:
    """Note a stored put in the control block's idempotence table (the supervisor)."""

def idem_find(ctl: Buffer, uniq_key: str, /) -> tuple[int, int, int, int, int, int] | None:
    """(state 1 pending / 2 stored, offset, size, queue id, queue offset, store time)."""

def backlog_full(
    since: int, backlog: int, bound: int, grace_ns: int, drain: int, now: int, /
) -> tuple[bool, int]:
    """(wait, since): the put's commit-backlog rule (C mqs_backlog_full) for one producer
    whose state is `since`; `drain` the committer's published drain bytes (0: none);
    `now` CLOCK_MONOTONIC ns (read only when backlog >= bound)."""

def crash_point(point: str, /) -> None:
    """SIGKILL or SIGSTOP this process if MQSTORE_CRASHPOINT arms `point` and this is its
    nth hit (docs/crash-points.md); else nothing. ValueError: no point of that name."""

class Appender:
    """One producer's put path over a control block (and its pool, or None)."""

    def __init__(self, ctl: Buffer, pool: Buffer | None, pid: int) -> None: ...
    def configure(
        self,
        *,
        lock: PutLock,
        lanes: dict[str, list[Any]],
        new_lane: Callable[[str], list[Any]],
        find_row: Callable[[bytes, int], int],
        map_segment: Callable[[int], Buffer] | None,
        message_type: type[Any],
        message_fields: Callable[[int, Any], tuple[bytes, int, int, int, int, int, int] | str],
        stats: Buffer,
        stats_off: int,
        result_type: type[tuple[Any, ...]],
        statuses: tuple[Any, ...],
        flush_reasons: tuple[str, str],
        msg_id_prefix: str,
        sync: bool,
        sync_timeout_ns: int,
        busy_ns: int,
        fast_fail: bool,
        max_body: int,
        store_addr: bytes,
        store_port: int,
        max_delay_level: int = 18,
        backlog_bytes: int = 0,
        backlog_grace_ns: int = 0,
    ) -> None:
        """What put_message needs from the client (ipc.producer): its lock, lanes (topic ->
        [topic bytes, queues, round-robin modulus, counter, queue rows]) and their maker,
        the queue-row finder, the segment mapper (pool off), a Message's other fields,
        statistics row, result type and statuses, and the store's settings.
        `backlog_bytes` (commit_backlog_max_bytes; pool on only, 0: none) and
        `backlog_grace_ns` (commit_backlog_grace_ms): the flow control of `backlog_full`;
        ValueError when negative."""

    def put_message(
        self,
        topic: object,
        body: object,
        tags: object,
        keys: object,
        properties: object,
        queue_id: object,
        wait_store: object,
        held: bool = False,
        delay_level: object = None,
        /,
    ) -> Any:
        """The whole put: a PutResult (refusals included); None when nothing was done
        and the client acts first (its supervisor check, its lock, a type to refuse or
        make plain)."""

    def put_batch_messages(
        self, messages: object, wait_store: object, held: bool = False,
        redelivered: bool = False, /,
    ) -> Any:  # fmt: skip
        """put_message for a list of put's dicts and Messages: a list of PutResult, or None.
        `redelivered`: stored messages put again (send_back, the scheduler): their
        UNIQ_KEYs are neither answered from nor noted in the idempotence table."""

    def configure_compression(
        self, fn: Callable[[memoryview], bytes] | None, over: int, flag: int, /
    ) -> None:
        """Compress each body of at least `over` bytes with `fn` (None: off) when that
        makes it smaller, and mark its sysFlag with `flag` (COMPRESSED | codec bits)."""
    def checked(self, stale_after_ns: int, /) -> None:
        """The client checked its supervisor; put_message answers None after this long."""

    def use_ids(self, ids: UniqIds | None, idempotent: bool) -> None:
        """The client's ids (a put without a UNIQ_KEY gets the next; None: none) and
        whether a put whose UNIQ_KEY is stored answers the first result (mqs_uniq.h)."""

    def lock(self, timeout_ns: int, /) -> int:
        """0 once held (a dead holder's section repaired first), or a code < 0."""

    def lock_held(self, hold_ns: int, cap_ns: int, /) -> int:
        """The put's wait: LOCK_TIMEOUT once one holder held it > `hold_ns`, LOCK_QUEUED
        after `cap_ns` of waiting behind holders that each held it less."""
    def unlock(self) -> None: ...
    def wait_flushed(self, end: int, timeout_ns: int, /) -> int:
        """0 flushed up to `end`, 1 timed out, 2 the store is read-only, 3 the generation
        ended without flushing it (fenced)."""

    def complete(self, first: int, n: int, /) -> int:
        """A reservation of n slots from `first`, all written: DONE all
        or nothing and published (0), or FENCED."""

    def close(self) -> None: ...

def write_record(
    target: Buffer,
    pos: int,
    prep: Prep,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    /,
) -> None:
    """One record at `target[pos:]` (engine.commitlog's appender). ValueError / TypeError
    for a field out of range or a target that cannot hold it."""

class PutLock:
    """A client's thread lock (threading.Lock's acquire, release and with), which the C
    put also takes without calling into Python."""

    def acquire(self) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc: object) -> None: ...

def publish(ctl: Buffer, /) -> int:
    """Advance published_pos over contiguous DONE slots (lock-free); slots advanced."""

def init_control(ctl: Buffer, /) -> None:
    """Supervisor, once: the robust, process-shared reservation mutex."""

def flushed_wake_all(ctl: Buffer, /) -> None:
    """After setting READ_ONLY, at drain: wake every sync waiter."""

def flushed_wake(ctl: Buffer, from_pos: int, /) -> None:
    """Flusher, after moving flushed_pos from `from_pos`: wake the sync waiters it
    covered (the bits of `wake_mask(from_pos, flushed_pos)`)."""

def wake_mask(from_pos: int, to_pos: int, /) -> int:
    """The futex bits of waiters for ends in (from_pos, to_pos] (ipc.commit.wake_mask)."""

def wait_bits(end: int, /) -> int:
    """The futex bit a waiter for `end` sleeps with (ipc.commit.wait_bits)."""

def sync_round(
    ctl: Buffer,
    pool: Buffer | None,
    seg_index: int,
    seg_fds: tuple[int, ...],
    lock_fd: int,
    offset_fd: int,
    want_seq: int,
    gather_ns: int,
    io_hook: Callable[[int, int], int] | None = None,
    /,
) -> tuple[int, int, int, int, int, int, int, int, int]:
    """The flusher's SYNC_FLUSH round without the GIL (ipc/native/mqs_round.h) over the
    files `seg_fds` of segments seg_index, seg_index + 1, ... (at most 8; -1: no file
    yet): (code 0 forced / 1 nothing to force / 2 ran past the files given, call again /
    3 failed, the failed call 1 flock 2 pwrite 3 fdatasync 4 flushed_offset's pwrite
    5 published past reserved, its errno, t_gathered, t_committed, t_forced, t_waked,
    fsync_ns, the failed call's descriptor). `io_hook(op, fd) -> errno` (the tests' seam,
    `engine.fileio.native_seam`): asked before each I/O call (op 1 flock, 2 pwrite,
    3 fdatasync), with the GIL; non-zero fails that call with the errno."""

def flush_step(
    ctl: Buffer,
    seg_index: int,
    seg_fds: tuple[int, ...],
    offset_fd: int,
    least_pages: int,
    io_hook: Callable[[int, int], int] | None = None,
    /,
) -> tuple[int, int, int, int, int, int, int]:
    """The flusher's timed flush without the GIL (ipc/native/mqs_round.h's mqs_flush,
    `ipc.commit.LogFiles.flush_and_wake_py`'s C): force [flushed, committed) under the
    least-pages rule, the statistics, flushed_pos, flushed_offset, the wake. (code, op,
    errno, t_forced, t_waked, fsync_ns, the failed call's descriptor), codes and
    `io_hook` as `sync_round`'s."""

def flusher_wake(ctl: Buffer, /) -> None:
    """Wake the flusher if it sleeps."""

def sync_request(ctl: Buffer, /) -> int:
    """The furthest end a sync producer waits for."""

def flusher_sleep(ctl: Buffer, timeout_ns: int, /) -> bool:
    """Flusher: sleep until a sync request is pending (True) or the timeout passes."""

def idle_sleep(ctl: Buffer, pos: int, timeout_ns: int, /) -> bool:
    """An idle worker: sleep until published_pos passes pos (True) or the timeout passes."""

def idle_wake(ctl: Buffer, /) -> None:
    """End the idle workers' sleeps (every publish that moves published_pos does it)."""

def wait_flushed_past(ctl: Buffer, pos: int, timeout_ns: int, /) -> bool:
    """Sleep until flushed_pos passes pos (True) or the timeout passes; asks no flush."""

def flusher_gather(ctl: Buffer, want_seq: int, timeout_ns: int, /) -> bool:
    """Flusher: sleep until published_seq reaches want_seq (True) or the timeout passes;
    only the producer whose publish completes it wakes the flusher."""

def reserve_fence(ctl: Buffer, timeout_ns: int, /) -> int:
    """Take and release the reservation lock (0), or a code < 0."""

def fence(ctl: Buffer, /) -> int:
    """End the block's generation (FENCED, writes refused); the fence's seq."""

def fence_seq(ctl: Buffer, /) -> int:
    """The fence's seq, or -1 while the block is not fenced."""

def claim(ctl: Buffer, seq: int, /) -> int:
    """The filler's claim of the reservation at `seq` and its joined slots: slots
    claimed, 0 when its producer completed it first, -1 when `seq` is not reserved."""

def fill_done(ctl: Buffer, seq: int, n: int, /) -> None:
    """The filler's `n` claimed slots from `seq` DONE, the first one last."""

def fetch_or(buf: Buffer, offset: int, bits: int, /) -> int:
    """Set `bits` in the int64 word at `offset` (8-byte aligned) of `buf` in one atomic
    read-modify-write; the word before (the reference: `tests/native/bits_reference.py`)."""

def fetch_and_not(buf: Buffer, offset: int, bits: int, /) -> int:
    """Clear `bits` in the int64 word at `offset` of `buf` atomically; the word before."""

def live_hold(fd: int, pid: int, /) -> None:
    """Hold the liveness byte of `pid` through `fd` (OFD read lock)."""

def live_check(fd: int, pid: int, /) -> bool:
    """Whether a live producer holds the byte of `pid`."""

# --- the record scanner (engine/native/mqs_scan.c) ---------------------------------------

def scan_records(
    buf: Buffer,
    pos: int,
    limit: int,
    *,
    check_crc: bool = True,
    max_records: int = -1,
    delay_ms: Buffer | None = None,
) -> tuple[int, int, int, int, tuple[bytes, ...], bytes]:
    """Walk whole records in buf[pos:limit] without the GIL -> (count, stop, stop_pos,
    blank_size, columns, fixups): bytes columns in `engine.scan.COLUMNS`' order, then
    key_first and key_hash; `fixups` ('q') the records whose tags code the caller takes
    from the reference. `delay_ms` (1 to 64 native int64: the store's messageDelayLevel
    in ms; None: RocketMQ's default) times the schedule topic's tags code.
    `engine.scan.scan_records` builds the RecordScan from this.
    MemoryError when the columns do not fit; ValueError if `pos` < 0 or a bad
    `delay_ms`."""

def scan_summary(
    store_timestamp: Buffer,
    bits: Buffer,
    sys_flag: Buffer,
    queue_id: Buffer,
    now_ms: int,
    buckets: int,
    /,
) -> tuple[int, int, tuple[int, ...]]:
    """`engine.scan.scan_summary_py` in one pass without the GIL -> (flags, lag_sum_ms,
    counts). ValueError for columns of other lengths or `buckets` outside 0..64."""

# engine/native/mqs_index.c: the twin of engine.indexfile.put_hashes.
def index_put(
    buf: Buffer,
    hash_slot_num: int,
    index_num: int,
    key_first: Buffer,
    key_hash: Buffer,
    pos: Buffer,
    store_timestamp: Buffer,
    base: int,
    rec_from: int,
    rec_to: int,
    key_from: int,
    /,
) -> int:
    """Put index keys into a mapped index file until it is full; the next key not put."""

# engine/native/mqs_cq.c: the twin of engine.consumequeue.group_units.
def group_units(
    buf: Buffer,
    topic_pos: Buffer,
    topic_len: Buffer,
    queue_id: Buffer,
    queue_offset: Buffer,
    pos: Buffer,
    size: Buffer,
    tags_code: Buffer,
    base: int,
    /,
) -> list[tuple[bytes, int, int, bool, bytes, bytes]]:
    """A scanned batch's units per (topic, queue id): engine.consumequeue.group_units."""

# engine/native/mqs_dispatch_round.c: the dispatcher's plain round; engine.dispatch's
# Python path (`Dispatcher(plain_c=False)`) is the reference.
def plain_round(
    buf: Buffer,
    base: int,
    pos: int,
    limit: int,
    max_records: int,
    delay_ms: Buffer | None,
    cursors: dict[tuple[bytes, int], Any],
    index: tuple[Buffer, int, int] | tuple[()] | None,
    now_ms: int,
    buckets: int,
    touched: set[Any] | None,
    /,
) -> tuple[int, int, int, int, int, int, tuple[int, ...], Any, int] | None:
    """Scan buf[pos:limit] and, when every record is a message (or a filler without
    keys) continuing a queue of `cursors` and the index does not hold the first yet,
    write the units and keys of a prefix of them: (count, stop, stop_pos, index_keys,
    last_store_timestamp (-1: fillers only), lag_sum_ms, lag_counts, more, fillers). The
    prefix ends before the first record whose queue's last file is full (more: that
    cursor, whose next file the caller makes), or with the record whose keys filled the
    index file (more: (the keys that did not fit as int32 bytes, its log offset, its
    store time), for the caller's next file), or, when `index` is () (no file yet),
    before the first record with keys (more: True); otherwise it is every record and
    more is None. stop is -1 when the prefix is not every record scanned (stop_pos: the
    next record). None, with nothing written, for any other batch."""

# engine/native/mqs_cq.c: recovery's walks; engine.consumequeue.valid_units_py and
# zero_tail_py are the references.
def valid_units(units: Buffer, /) -> tuple[int, int]:
    """(how many valid 20-byte consume-queue units lead `units`, the index of the last of
    them that is not a pre-blank or -1), without the GIL. ValueError for a partial unit."""

def zero_tail(buf: Buffer, start: int, /) -> int:
    """Where the trailing zero bytes of buf[start:] begin (`start` if all are zero),
    without the GIL. ValueError for a start outside the buffer."""

# --- recovery's consume-queue check (engine/native/mqs_verify.c) --------------------------

def verify_units(
    units: Buffer,
    first_queue_offset: int,
    queue_id: int,
    prev_end: int,
    log_min: int,
    log_end: int,
    headers_from: int,
    segments: Sequence[Buffer | None],
    segments_base: int,
    segment_size: int,
    /,
) -> tuple[int, int]:
    """Check a run of 20-byte consume-queue units against the log without the GIL ->
    (the first bad queue offset or -1, the new prev_end). `engine.verify.verify_units`
    is its door. ValueError for a partial unit or a segment size <= 0."""

def queue_last_ends(
    buf: Buffer,
    start: int,
    pos: Buffer,
    size: Buffer,
    queue_id: Buffer,
    topic_pos: Buffer,
    topic_len: Buffer,
    /,
) -> dict[tuple[bytes, int], int]:
    """{(topic bytes, queue id): pos + size of its last record} over records [start, n)
    of the scanner's columns, without the GIL. ValueError for columns of unequal lengths
    or a topic span outside `buf`. `engine.verify.queue_last_ends` is its door."""

# --- a pull's walk over consume-queue units (engine/native/mqs_pull.c) --------------------

def pull_register(
    decoded: type[Any], view: type[Any], fields: tuple[str, ...], format_host: Any, /
) -> None:
    """The message classes pull_units builds (engine.record.DecodedRecord, RecordView:
    slotted, `fields` RecordFields' own in its order) and the IPv6 host formatter.
    ValueError for other fields, TypeError for a class without those slots."""

def group_ack(msg: Any, lock: Any, words: Buffer, /) -> int:
    """A group consumer's ack of `msg` in one step while `lock` is free (ipc/native/
    mqs_group_ack.c): 1 acked (its queue's commit point stored in `words`), 0 acked
    before, -1 not here (the lock is held, or the queue is not active, not this grant's
    or its lease is over: nothing changed). `ipc.consumer.group_ack_py` is the reference."""

def pull_register_lazy(cls: type[Any], names: tuple[str, ...], /) -> None:
    """The class a pull `into` an owner builds (a group consumer's ConsumedMessage): its
    slots named for `engine.pull.LAZY_ROLES`. ValueError for a wrong count of names,
    TypeError for a class without those slots."""

def pull_units(
    units: Buffer,
    start: int,
    log: Buffer,
    log_base: int,
    limit: int,
    codes: tuple[int, ...] | None,
    wanted: frozenset[str] | None,
    max_count: int,
    max_bytes: int,
    got_bytes: int,
    zero_copy: bool,
    out: list[Any],
    into: tuple[object, object] | None = None,
    /,
) -> tuple[int, int, int, bool]:
    """A pull's walk over 20-byte consume-queue units from `start`, its messages appended
    to `out` -> (next unit, stop, sizes added, removing): `engine.pull` is its door and
    says the rules; `engine.pull.pull_units_py` is the reference. With `into` (owner,
    tag), lazy messages of pull_register_lazy's class."""
