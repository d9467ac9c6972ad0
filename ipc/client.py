"""`StoreClient`: append to a running store from any process.

    with StoreClient.attach("/var/lib/mqstore") as client:
        r = client.put("orders", b"...", tags="new", keys=["o-17"])
        assert r.status is PutMessageStatus.PUT_OK

Attaching asks the supervisor (Unix socket) for the shared-memory names and layout and
maps them; from then on a put asks nobody. A put runs in the caller's process:

1. **One C call** (`mqstore._native.Appender.put_message`, `ipc/native/mqs_put.c`; a
   batch of dicts: `put_batch_messages`): the argument types; the topic and tags looked
   up in this client's *lanes* (`_Lane`, made by `_warm` once the reference encoder
   accepted them); the KEYS property checked and appended; the queue id (given, or the
   topic's round robin) checked against the topic's queues; then `ipc/native/
   mqs_append.c`: CRC the body; take the reservation lock (a robust process-shared mutex,
   with the busy timeout as deadline); reserve space, slot, queue offset and store
   timestamp; unlock; encode the record straight into the pool buffer (pool on) or the
   segment's mapping (pool off); mark the slot DONE and publish (`ipc.reservation`).
   Under SYNC_FLUSH with wait_store, a futex wait on the control block's flushed
   position (GIL released, 20 ms ticks for signals and the deadline): PUT_OK only once
   the flusher's flushed_pos covers the record. The statistics row is counted and the
   PutResult built in C.
2. **Everything else comes back here with nothing done** (None): `_put_slow` checks the
   supervisor every 10 ms, warms the lanes and tries the C call again; else the general
   path, `_put_general`, the reference of the C put: validate (`ipc.accepts`: topic
   name, queue id within the topic's queues, message fields written as given or
   refused; MESSAGE_ILLEGAL with the reason, nothing reserved), `_prepare` (topic and
   properties cached per (topic, properties)), then `Appender.put` of the prepared
   message or, for the rare paths (a segment roll with a BLANK, waits for the next file,
   a pool buffer or slots, a new queue-table row, flags that refuse writes), `_reserve`
   under the same mutex and the C encoder (`Appender.write`). Born and store hosts may
   be IPv4 or IPv6 (sysflag 0x10 / 0x20).

The protocol (reserve, complete, abandon, publish, fill, repair) is `ipc.reservation`.
Producers publish their own DONE slots; the committer gives a slot whose producer died
(its liveness byte is free) a filler record, so a dead producer never stalls the log.

Thread-safe: one lock per client (`_native.PutLock`, which the C call takes too)
serialises puts of its threads. Fork-safe:
a forked child re-attaches on its first call. If the supervisor stops or dies, the next
call re-attaches or returns SERVICE_NOT_AVAILABLE; it never writes into a stale pool.
"""

from __future__ import annotations

import array
import contextlib
import mmap
import os
import select
import struct
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, overload

from mqstore import _native
from mqstore.conf.settings import settings_from_doc
from mqstore.engine import fileio, record
from mqstore.engine.diskguard import DISK_FULL_BIT, decode_state
from mqstore.engine.names import topic_problem
from mqstore.engine.reader import Geometry
from mqstore.engine.record import END_FILE_MIN_BLANK_LENGTH, DecodedRecord, Message
from mqstore.engine.segment import segment_file_name
from mqstore.engine.topics import QueueCounts
from mqstore.ipc import access, channel
from mqstore.ipc import control as c
from mqstore.ipc.accepts import (
    BOOL,
    NUMBER,
    PATH,
    UNSET_STORE_HOST,
    Host,
    check_batch,
    check_batch_item,
    check_put_types,
    check_types,
    hosts_problem,
    int_fields_problem,
    queue_id_problem,
)
from mqstore.ipc.read_results import PullResult, PullViews
from mqstore.ipc.reads import ClientReads, for_client
from mqstore.ipc.reservation import LiveLock
from mqstore.ipc.results import PutMessageStatus, PutResult, error_for, raise_if_failed

_SLOT_PACK: Final = c.SLOT.pack_into
_I64_PACK: Final = c.I64.pack_into
_I64_UNPACK: Final = c.I64.unpack_from
_PAIR_PACK: Final = c.PAIR.pack_into
_PAIR_UNPACK: Final = c.PAIR.unpack_from
_tuple_new: Final = tuple.__new__
_time_ns: Final = time.time_ns
_perf_ns: Final = time.perf_counter_ns
_TX_MASK: Final = 0xC
_TX_COMMIT: Final = 0x8
_FALLBACK: Final = _native.FALLBACK
_BORN_V6: Final = 0x10
_STORE_V6: Final = 0x20
_DEFAULT_BORN: Final[Host] = (b"\x7f\x00\x00\x01", 0, False)  # 127.0.0.1:0
_STATS_EVERY: Final = 256
_STATUS_INDEX: Final = {st: i for i, st in enumerate(PutMessageStatus)}
_STALE_CHECK_S: Final = 0.01
_STALE_CHECK_NS: Final = 10_000_000
_INT32_MAX: Final = 2**31 - 1

OK: Final = PutMessageStatus.PUT_OK
_PUT_LABEL: Final = "put() argument {!r}"
_BATCH_FIELDS: Final = frozenset(("topic", "body", "tags", "keys", "properties", "queue_id"))
_monotonic: Final = time.monotonic

# Bumped in every forked child, so a put notices a fork without a getpid() call.
_FORKS = [0]


# The liveness locks of this process's clients: a forked child closes its copies at
# once (the lock is the open file description's, shared with the parent: a copy kept in
# a child would make a dead parent look alive, and its reservations never filled).
_LIVE_LOCKS: weakref.WeakSet[LiveLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    _FORKS[0] += 1
    for lock in list(_LIVE_LOCKS):
        with contextlib.suppress(OSError):
            lock.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _attach_checked(store_dir: str, ctl: str, pool: str) -> c.ControlBlock:
    """Map the segments the supervisor named, after checking that the store created
    them: the names and nonce its owner-only names file records, segments owned by the
    store's owner and closed to others. Raises access.StoreAccessDenied."""
    names = access.read_names(store_dir)
    if names.get("ctl") != ctl or names.get("pool", "") != pool:
        raise access.StoreAccessDenied(
            f"the supervisor named {ctl!r}, the store's names file {names.get('ctl')!r}"
        )
    for name in (ctl, pool):
        if name:
            access.check_segment(name.lstrip("/"), store_dir)
    cb = c.ControlBlock.attach(ctl, pool)
    if cb.get(c.OFF_NONCE) != names.get("nonce"):
        cb.close()
        raise access.StoreAccessDenied(
            f"shared memory {ctl} does not carry the store's nonce: the store did not create it"
        )
    return cb


def check_attach_types(
    method: str, store_dir: object, topic_queue_nums: object, timeout_s: object
) -> None:
    """TypeError for `attach`'s arguments of the wrong type (shared with AsyncStoreClient)."""
    check_types(method, store_dir=(store_dir, PATH), timeout_s=(timeout_s, NUMBER))
    if topic_queue_nums is not None:
        if not isinstance(topic_queue_nums, Mapping):
            raise TypeError(
                f"{method}() argument 'topic_queue_nums' must be a mapping of str to int, "
                f"not {type(topic_queue_nums).__name__}"
            )
        for topic, n in topic_queue_nums.items():
            if not isinstance(topic, str) or type(n) is not int:
                raise TypeError(
                    f"{method}() argument 'topic_queue_nums' must map str to int, not "
                    f"{type(topic).__name__} to {type(n).__name__}"
                )


class _Busy(Exception):
    def __init__(self, status: PutMessageStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Refused(Exception):
    pass


# A prepared (validated) message, as the C appender reads it (ipc/native/mqs_module.c):
# (size, queue_id, flag, sys_flag, born_ts, body, topic_b, properties_b, takes_offset,
#  reconsume_times, prepared_offset, born_addr, born_port, store_addr, store_port)
_Prep = tuple[int, int, int, int, int, bytes, bytes, bytes, bool, int, int, bytes, int, bytes, int]
_P_SIZE: Final = 0
_P_QUEUE: Final = 1
_P_TOPIC: Final = 6
_P_TAKES: Final = 8


# A lane: what the C put (`ipc/native/mqs_put.c`) needs of one topic, made by `_warm`
# once the general path validated the topic (and each tags value) as `_tail` does:
# [topic bytes, queue count, round-robin modulus, round-robin counter,
#  queue-table row per queue id (-1: not known yet), {tags or None: properties bytes}]
_Lane = list[Any]
_L_QUEUES: Final = 1
_L_RR_N: Final = 2
_L_RR: Final = 3
_L_QSLOTS: Final = 4
_L_HEADS: Final = 5
_LANES_MAX: Final = 4096


class StoreClient:
    """A producer attached to one running store. Create with `StoreClient.attach`."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        raise_on_status: bool = False,
    ) -> None:
        check_attach_types("attach", store_dir, topic_queue_nums, timeout_s)
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self.raise_on_status = raise_on_status
        self.topic_queue_nums: dict[str, int] = dict(topic_queue_nums or {})
        self._timeout_s = timeout_s
        self._tlock = _native.PutLock()  # threading.Lock's API; the C put takes it too
        self._closed = False
        self._attached = False
        self._tails: dict[object, tuple[bytes, bytes, int] | PutResult] = {}
        self._heads: dict[tuple[str, str | None], tuple[bytes, int, bytes]] = {}
        self._rr: dict[str, int] = {}  # round-robin counters of topics without a lane
        self._attach()

    @classmethod
    def attach(
        cls,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        raise_on_status: bool = False,
    ) -> StoreClient:
        """Attach to the supervisor of `store_dir`. Raises channel.SupervisorUnavailable
        when none runs. `topic_queue_nums` overrides the queue count per topic used to
        spread puts with `queue_id=None` (default: `default_topic_queue_nums`).
        `raise_on_status`: puts raise `ipc.results.PutError` (its status family's
        subclass) for any status but PUT_OK, instead of returning it."""
        return cls(
            store_dir,
            topic_queue_nums=topic_queue_nums,
            timeout_s=timeout_s,
            raise_on_status=raise_on_status,
        )

    # --- attach / detach --------------------------------------------------------------

    def _attach(self) -> None:
        sock = channel.connect(self.store_dir, self._timeout_s)
        try:
            channel.send_json(sock, {"op": "attach", "pid": os.getpid()})
            info = channel.recv_json(sock)
            if info.get("denied"):
                raise access.StoreAccessDenied(str(info["error"]))
            if "error" in info:
                raise channel.SupervisorUnavailable(str(info["error"]))
            cb = _attach_checked(self.store_dir, info["ctl"], info["pool"])
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._cb = cb
        self._buf = cb.buf
        self._pid = os.getpid()
        self._fork_gen = _FORKS[0]
        self._client_index = int(info["client_index"])
        self._generation = cb.generation
        self._seg_size = cb.segment_size
        self._pool_n = cb.pool_buffers
        self._slot_count = cb.slot_count
        self._qtable_off = cb.qtable_off
        self._sync = info["flush_disk_type"] == "SYNC_FLUSH"
        self._sync_timeout_s = int(info["sync_flush_timeout_ms"]) / 1000
        self._busy_timeout_s = int(info["os_page_cache_busy_timeout_ms"]) / 1000
        self._fast_fail = bool(info["fast_fail_if_no_buffer_in_store_pool"])
        self._max_body = int(info["max_message_size_bytes"])
        self._default_queues = int(info["default_topic_queue_nums"])
        # Per-topic queue counts (`mqstore topic DIR set T --queues N`), re-read at most
        # every 100 ms from config/topics.json.
        self._qcounts = QueueCounts(self.store_dir)
        self._store_host = str(info["store_host"])
        # The store's settings and file sizes, for the read side (`ipc.reads.for_client`).
        self._store_settings = settings_from_doc(info["settings"])
        self._store_geometry = Geometry(**info["geometry"])
        addr, port, v6 = self._store = record.parse_host(self._store_host)
        self._store_addr, self._store_port, self._store_v6 = addr, port, v6
        self._hosts: dict[str, Host] = {}
        self._msg_id_prefix = (addr + struct.pack(">i", port)).hex().upper()
        self._busy_ns = int(self._busy_timeout_s * 1e9)
        self._sync_timeout_ns = int(self._sync_timeout_s * 1e9)
        try:
            self._live = LiveLock(self.store_dir)
        except OSError:
            cb.close()
            sock.close()
            raise
        _LIVE_LOCKS.add(self._live)
        self._app = _native.Appender(cb.buf, cb.pool_buf, self._pid)
        self._cur: tuple[int, mmap.mmap | None] = (-2, None)  # the newest mapped segment
        self._qslots: dict[tuple[bytes, int], int] = {}
        self._lanes: dict[str, _Lane] = {}
        self._pviews: list[memoryview] = []
        if self._pool_n:
            assert cb.pool_buf is not None
            s = self._seg_size
            self._pviews = [cb.pool_buf[k * s : (k + 1) * s] for k in range(self._pool_n)]
        self._maps: dict[int, tuple[int, mmap.mmap]] = {}
        self._last_stale_check = time.monotonic()
        self._stats = array.array("q", bytes(8 * c.CLIENT_FIELDS))  # counted in C
        self._stats[c.CF_PID] = self._pid
        self._since_stats = 0
        self._configure_native()
        self._attached = True

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

    def _detach(self) -> None:
        if not self._attached:
            return
        self._attached = False
        with contextlib.suppress(ValueError, TypeError):
            self._publish_stats()
        for v in self._pviews:
            v.release()
        self._pviews = []
        for fd, mm in self._maps.values():
            mm.close()
            fileio.close(fd)
        self._maps.clear()
        self._cur = (-2, None)
        del self._buf
        self._app.close()
        self._cb.close()
        self._live.close()
        self._sock.close()

    def close(self) -> None:
        """Detach: nothing of this client stays in the supervisor or in /dev/shm."""
        with self._tlock:
            if self._closed:
                return
            self._closed = True
            reads = getattr(self, "_reads_of_pid", None)
            if reads is not None and reads[0] == os.getpid():
                reads[1].close()
            if self._pid == os.getpid():
                self._detach()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and getattr(self, "_attached", False):
            with contextlib.suppress(Exception):
                self.close()

    # --- staleness ----------------------------------------------------------------------

    def _ensure_live(self) -> str:
        """ "" when attached to a live supervisor (re-attaching if needed), else why not."""
        if self._closed:
            return "the client is closed"
        if self._fork_gen != _FORKS[0] or self._pid != os.getpid():
            # A forked child: start over with our own handles. The liveness lock's
            # descriptor is the parent's open file: keeping it would make a dead parent
            # look alive.
            with contextlib.suppress(OSError):
                self._live.forget()  # done at fork already (_after_fork_in_child)
            self._attached = False
            self._pviews = []
            self._maps = {}
            self._cur = (-2, None)
            try:
                self._attach()
            except (OSError, ValueError) as e:
                return f"re-attach after fork failed: {e}"
            return ""
        now = time.monotonic()
        if self._attached and now - self._last_stale_check < _STALE_CHECK_S:
            return ""
        self._last_stale_check = now
        if self._attached:
            self._publish_stats()  # the C put counts into the row between two checks
            stale = self._cb.flags & c.FLAG_STOPPED
            if not stale:
                r, _, _ = select.select([self._sock], [], [], 0)
                stale = bool(r)  # the supervisor closed our connection: it is gone
            if not stale:
                self._refresh_lanes()
                self._app.checked(_STALE_CHECK_NS)
                return ""
            self._detach()
        try:
            self._attach()
        except (OSError, ValueError) as e:
            return f"the supervisor of {self.store_dir} is not running ({e})"
        return ""

    # --- encoding ---------------------------------------------------------------------

    def _tail(self, topic: str, props: Mapping[str, str]) -> tuple[bytes, bytes, int] | PutResult:
        """(topic bytes, properties bytes, record length without body), or
        MESSAGE_ILLEGAL for a topic outside RocketMQ's name rule (`engine.names`) or
        what the reference encoder refuses. Cached by the callers."""
        why = topic_problem(topic)
        if why is not None:
            return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, why)
        rec = record.encode(
            Message(topic, b"", props, store_host=self._store_host),
            max_message_size=self._max_body,
        )
        if rec.status is not record.EncodeStatus.OK:
            return PutResult(PutMessageStatus[rec.status.value], rec.reason)
        topic_b = topic.encode("utf-8")
        props_b = record.encode_properties(props)
        fixed = record.record_length(0, len(topic_b), len(props_b), store_v6=self._store_v6)
        return topic_b, props_b, fixed

    def _keyed_tail(
        self, topic: str, tags: str | None, keys: str
    ) -> tuple[bytes, bytes, int] | PutResult:
        """(topic, properties, fixed length) for properties {TAGS: tags, KEYS: keys}
        without the encoder: the (topic, tags) part is cached (validated by the encoder
        once), KEYS is checked as `properties_problem` would and appended. O(len(keys))."""
        head = self._heads.get((topic, tags))
        if head is None:
            base = self._tail(topic, {record.PROPERTY_TAGS: tags} if tags is not None else {})
            if type(base) is PutResult:
                return base
            topic_b, props0, fixed0 = base  # type: ignore[misc]
            head = (props0, fixed0 - len(props0), topic_b)
            if len(self._heads) > 4096:
                self._heads.clear()
            self._heads[(topic, tags)] = head
        props0, fixed_np, topic_b = head
        if not keys:
            return PutResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                "property 'KEYS' has an empty value (RocketMQ's decoder would drop it)",
            )
        if "\x01" in keys or "\x02" in keys:
            return PutResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                "property 'KEYS' contains a separator character (0x01 or 0x02)",
            )
        props = b"".join((props0, b"KEYS\x01", keys.encode("utf-8"), b"\x02"))
        plen = len(props)
        if plen > record.MAX_PROPERTIES_BYTES:
            return PutResult(
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                f"properties are {plen} UTF-8 bytes; at most 32767 are allowed",
            )
        return topic_b, props, fixed_np + plen

    def _prepare(
        self,
        topic: str,
        body: Any,
        tags: str | None,
        keys: str | Sequence[str] | None,
        properties: Mapping[str, str] | None,
        queue_id: int | None,
        flag: int = 0,
        sys_flag: int = 0,
        reconsume_times: int = 0,
        prepared_offset: int = 0,
        born: Host = _DEFAULT_BORN,
        born_timestamp: int = 0,
    ) -> _Prep | PutResult:
        """Validate and encode one message outside any lock (cost O(body) for the CRC;
        the tail is cached). `sys_flag`'s host bits are already checked against `born`
        (`_message_fields`); a `born_timestamp` of 0 means unset: now."""
        # Keys are usually unique per message: (topic, tags) is cached and the KEYS
        # property appended to it, exactly as encode_properties({TAGS, KEYS}) lays it out.
        if not properties and type(keys) is str:
            try:
                got = self._keyed_tail(topic, tags, keys)
            except UnicodeError as e:  # a lone surrogate: no UTF-8 form
                return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, f"bad message: {e}")
            if type(got) is PutResult:
                return got
            ent = got
            pkey: object = None
        else:
            ent = None
            # The cache key: (topic, tags, None) without keys, (topic, properties as
            # items, None) otherwise; a miss builds the properties and asks the encoder.
            simple = not properties and keys is None
            pkey = (topic, tags, None) if simple else None
            ent = self._tails.get(pkey) if simple else None
        if ent is None:
            d = dict(properties) if properties else {}
            if tags is not None:
                d[record.PROPERTY_TAGS] = tags
            if keys is not None:
                d[record.PROPERTY_KEYS] = (
                    keys if isinstance(keys, str) else record.KEY_SEPARATOR.join(keys)
                )
            props: Mapping[str, str] = d
            if not simple:
                pkey = (topic, tuple(d.items()), None)
                ent = self._tails.get(pkey)
        if ent is None:
            try:
                ent = self._tail(topic, props)
            except ValueError as e:  # UnicodeEncodeError: a lone surrogate
                return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, f"bad message: {e}")
            if pkey is not None:
                if len(self._tails) > 4096:
                    self._tails.clear()
                self._tails[pkey] = ent
        if type(ent) is PutResult:
            return ent
        topic_b, props_b, fixed = ent  # type: ignore[misc]
        if type(body) is not bytes:
            body = bytes(body)  # bytearray or memoryview (check_put_types)
        blen = len(body)
        if blen > self._max_body:
            return PutResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"body is {blen} bytes; maxMessageSize is {self._max_body}",
            )
        queues = self._qcounts.get(topic, self._default_queues)
        if queue_id is None:
            n = self.topic_queue_nums.get(topic) or queues
            lane = self._lanes.get(topic)
            if lane is None:
                k = self._rr.get(topic, 0)
                self._rr[topic] = k + 1
            else:  # one counter with the C put
                k = lane[_L_RR]
                lane[_L_RR] = k + 1
            queue_id = k % n if n > 0 else 0
        if type(queue_id) is not int or not 0 <= queue_id < queues:
            return PutResult(
                PutMessageStatus.MESSAGE_ILLEGAL, queue_id_problem(topic, queue_id, queues)
            )
        size = fixed + blen + 12 if born[2] else fixed + blen
        if size + END_FILE_MIN_BLANK_LENGTH > self._seg_size:
            return PutResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"record of {size} bytes does not fit a {self._seg_size}-byte segment",
            )
        tx = sys_flag & _TX_MASK
        return (
            size, queue_id, flag, sys_flag, born_timestamp or _time_ns() // 1_000_000, body,
            topic_b, props_b, tx == 0 or tx == _TX_COMMIT, reconsume_times, prepared_offset,
            born[0], born[1], self._store_addr, self._store_port,
        )  # fmt: skip

    # --- lanes: the C put's view of topics ---------------------------------------------

    def _warm(self, topic: object, tags: object) -> None:
        """Make the lane of `topic` and its entry for `tags` when the reference encoder
        accepts them (`_tail`), and learn the queue rows found since. Caller holds the
        thread lock. O(queues) for a known topic."""
        if type(topic) is not str or not (tags is None or type(tags) is str):
            return
        lane = self._lanes.get(topic)
        if lane is None:
            try:
                base = self._tail(topic, {})
            except ValueError:  # a lone surrogate: the general path says so
                return
            if type(base) is PutResult:
                return
            if len(self._lanes) >= _LANES_MAX:
                self._lanes.clear()
            lane = [base[0], 0, 0, self._rr.pop(topic, 0), [], {}]
            self._lanes[topic] = lane
            self._refresh_lane(topic, lane)
        heads: dict[str | None, bytes] = lane[_L_HEADS]
        if tags not in heads:
            try:
                got = self._tail(topic, {record.PROPERTY_TAGS: tags} if tags is not None else {})
            except ValueError:
                return
            if isinstance(got, PutResult):
                return
            heads[tags] = got[1]
        qslots: list[int] = lane[_L_QSLOTS]
        if -1 in qslots:
            topic_b = lane[0]
            lane[_L_QSLOTS] = [self._qslots.get((topic_b, q), -1) for q in range(len(qslots))]

    def _refresh_lanes(self) -> None:
        """Follow `mqstore topic set` (queue counts) in every lane; at each check."""
        for topic, lane in self._lanes.items():
            self._refresh_lane(topic, lane)

    def _refresh_lane(self, topic: str, lane: _Lane) -> None:
        queues = self._qcounts.get(topic, self._default_queues)
        lane[_L_RR_N] = self.topic_queue_nums.get(topic) or queues
        if lane[_L_QUEUES] != queues:
            lane[_L_QUEUES] = queues
            topic_b = lane[0]
            lane[_L_QSLOTS] = [self._qslots.get((topic_b, q), -1) for q in range(queues)]

    def _host(self, host: str) -> Host:
        """`record.parse_host`, cached (bounded). Raises ValueError."""
        got = self._hosts.get(host)
        if got is None:
            got = record.parse_host(host)
            if len(self._hosts) > 256:
                self._hosts.clear()
            self._hosts[host] = got
        return got

    def _message_fields(self, m: Message) -> tuple[Host, int] | PutResult:
        """The born host and sys flag of a `Message` in a batch, written as given, or
        MESSAGE_ILLEGAL: an integer that does not fit its field, a host that does not
        parse, a store host other than the store's, host bits of `sys_flag` that
        disagree with the hosts (`ipc.accepts`)."""
        why = int_fields_problem(m)
        if why is None:
            try:
                born = self._host(m.born_host)
                given = None if m.store_host == UNSET_STORE_HOST else self._host(m.store_host)
            except ValueError as e:
                return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, str(e))
            why = hosts_problem(m.sys_flag, born, self._store, self._store_host, given)
            if why is None:
                return born, m.sys_flag & ~(_BORN_V6 | _STORE_V6)
        return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, why)

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

    def _lock_failed(self, code: int) -> _Busy:
        """The status for a reservation lock the C side could not take."""
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
        while True:
            code = app.lock(self._busy_ns)
            if code:
                raise self._lock_failed(code)
            try:
                flags = _I64_UNPACK(buf, c.OFF_FLAGS)[0]
                if flags & (c.FLAG_REFUSE_WRITES | c.FLAG_READ_ONLY | c.FLAG_STOPPED) or not (
                    flags & c.FLAG_RUNNING
                ):
                    raise _Refused(
                        "the store is read-only after a failed fsync"
                        if flags & c.FLAG_READ_ONLY
                        else "the store is stopping or not running; writes are refused"
                    )
                disk = _I64_UNPACK(buf, c.OFF_DISK_STATE)[0]
                if disk & DISK_FULL_BIT:
                    ratio = decode_state(disk)[2]
                    raise _Refused(
                        f"the disk is full ({ratio:.1%} used); writes resume by themselves "
                        "once the cleaner has freed space"
                    )
                reserved, seq = _PAIR_UNPACK(buf, c.OFF_RESERVED)
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
                if end > _I64_UNPACK(buf, c.OFF_ALLOCATED)[0]:
                    why = "file"
                elif (
                    self._pool_n
                    and _I64_UNPACK(buf, c.OFF_COMMITTED)[0] < (index - self._pool_n + 1) * seg_size
                ):
                    why = "pool"
                elif seq + nslots - _I64_UNPACK(buf, c.OFF_PUBLISHED_SEQ)[0] > self._slot_count:
                    why = "slots"
                if not why:
                    # The intent record (cs_seq, then cs_pid), as mqs_reserve writes it.
                    _I64_PACK(buf, c.OFF_CS_SEQ, seq)
                    _I64_PACK(buf, c.OFF_CS_PID, pid)
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
                    for p in preps:
                        key = (p[_P_TOPIC], p[_P_QUEUE])
                        qs = qslots.get(key)
                        if qs is None:
                            qs = self._cb.find_or_add_queue(p[_P_TOPIC], p[_P_QUEUE])
                            if qs < 0:
                                _I64_PACK(buf, c.OFF_CS_PID, 0)
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
                        _SLOT_PACK(
                            buf, slot_off + (seq % count) * slot_row, at, qo, now, p[_P_SIZE],
                            pid, qs if p[_P_TAKES] else -2, c.STATE_RESERVED,
                        )  # fmt: skip
                        seq += 1
                        at += p[_P_SIZE]
                    _PAIR_PACK(buf, c.OFF_RESERVED, end, seq)  # the commit point
                    for qs, nxt in qupd.items():
                        _I64_PACK(buf, qtable_off + qs * c.QROW + 8, nxt)
                    _I64_PACK(buf, c.OFF_CS_PID, 0)
                    return first, start, blank, now, qoffs
            finally:
                app.unlock()
            # Not enough room: the pool buffer, the next file or the slot ring is busy.
            now_s = time.monotonic()
            if deadline == 0.0:
                if why == "pool" and self._fast_fail:
                    raise _Busy(PutMessageStatus.OS_PAGECACHE_BUSY, "no free write-pool buffer")
                deadline = now_s + self._busy_timeout_s
                self._cb.add(c.OFF_BUSY, 1)
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
            if self._cb.slot_state(seq) == c.STATE_RESERVED:
                self._cb.set_slot_state(seq, c.STATE_ABANDONED)

    def _copy(
        self, preps: list[_Prep], first: int, start: int, blank: int, now: int, qoffs: list[int]
    ) -> None:
        """The general path's copy: the C encoder writes each record (and the BLANK
        that ends the previous segment) and marks its slot DONE."""
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

    # --- flush wait -------------------------------------------------------------------

    def _wait_flushed(self, end: int) -> tuple[PutMessageStatus, str]:
        """Until the flusher's flushed_pos covers `end` (a futex wait on the control
        block, `ipc/native/mqs_futex.c`), the sync flush timeout, or a failed fsync."""
        code = self._app.wait_flushed(end, self._sync_timeout_ns)
        if code == 0:
            return OK, ""
        if code == 1:
            return PutMessageStatus.FLUSH_DISK_TIMEOUT, self._flush_reason(1)
        return PutMessageStatus.FLUSH_DISK_FAILED, self._flush_reason(2)

    def _flush_reason(self, code: int) -> str:
        """The reason of a sync wait that ended with `code` 1 (timed out) or 2 (failed)."""
        if code == 1:
            return f"not flushed within syncFlushTimeout ({self._sync_timeout_s * 1000:.0f} ms)"
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
        return self._put_slow(topic, body, tags, keys, properties, queue_id, wait_store)

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

    def _put_slow(
        self,
        topic: str,
        body: bytes,
        tags: str | None,
        keys: str | Sequence[str] | None,
        properties: Mapping[str, str] | None,
        queue_id: int | None,
        wait_store: bool,
    ) -> PutResult:
        """A put the C call left to Python, nothing done (the client's checks are due,
        another thread puts, a first put of a topic or tags value, a type or value to
        refuse, a roll or a wait): check, warm the lanes, try the C put again, else the
        general path."""
        t0 = _perf_ns()
        check_put_types(_PUT_LABEL, topic, body, tags, keys, properties, queue_id)
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
            self._warm(topic, tags)
            got = self._app.put_message(
                topic, body, tags, keys, properties, queue_id, wait_store, True
            )
            if got is not None:
                return self._settle(t0, got)
            return self._put_general(t0, topic, body, tags, keys, properties, queue_id, wait_store)

    def _put_general(
        self,
        t0: int,
        topic: str,
        body: bytes,
        tags: str | None,
        keys: str | Sequence[str] | None,
        properties: Mapping[str, str] | None,
        queue_id: int | None,
        wait_store: bool,
    ) -> PutResult:
        """The put in Python (the reference of the C put): `_prepare`, then the C
        reservation of one prepared message or `_reserve` and `_copy`. Caller holds the
        thread lock and checked the types."""
        prep = self._prepare(topic, body, tags, keys, properties, queue_id)
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
                            m.topic, m.body, None, None, m.properties, m.queue_id, m.flag,
                            sys_flag, m.reconsume_times, m.prepared_transaction_offset, born,
                            m.born_timestamp,
                        )  # fmt: skip
                else:
                    try:
                        get = m.get
                        prep = self._prepare(
                            m["topic"], m["body"], get("tags"), get("keys"), get("properties"),
                            get("queue_id"),
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

    # --- introspection ------------------------------------------------------------------

    def positions(self) -> dict[str, int]:
        """The control block's positions (reserved, published, committed, flushed)."""
        cb = self._cb
        return {
            "reserved": cb.get(c.OFF_RESERVED),
            "published": cb.get(c.OFF_PUBLISHED),
            "committed": cb.get(c.OFF_COMMITTED),
            "flushed": cb.get(c.OFF_FLUSHED),
        }

    # --- reads (ipc.reads.ClientReads, in this process) and consumer offsets -------------

    def _read_side(self) -> ClientReads:
        """This process's `ClientReads` (made on first use, again after a fork)."""
        got = getattr(self, "_reads_of_pid", None)
        if got is None or got[0] != os.getpid():
            got = (os.getpid(), for_client(self))
            self._reads_of_pid = got
        reads: ClientReads = got[1]
        return reads

    @overload
    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
        zero_copy: Literal[False] = False,
    ) -> PullResult: ...
    @overload
    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
        zero_copy: Literal[True],
    ) -> PullViews: ...
    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
        zero_copy: bool = False,
    ) -> PullResult | PullViews:
        """Up to `max_count` messages of (topic, queue_id) from queue offset `offset`; see
        `ipc.reads.ClientReads.pull` (statuses, `tags="a || b"`, long polling, and
        `zero_copy`: bodies as views of the mapped log)."""
        reads = self._read_side()
        if zero_copy:
            return reads.pull(
                topic, queue_id, offset, max_count, tags=tags, wait_ms=wait_ms, zero_copy=True
            )
        return reads.pull(topic, queue_id, offset, max_count, tags=tags, wait_ms=wait_ms)

    def get(self, physical_offset: int) -> DecodedRecord | None:
        """The message at `physical_offset` (None when there is none, or not durable)."""
        return self._read_side().get(physical_offset)

    def get_by_msg_id(self, msg_id: str) -> DecodedRecord | None:
        """The message with this offset message id (None when there is none)."""
        return self._read_side().get_by_msg_id(msg_id)

    def query(
        self,
        topic: str,
        key: str,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_count: int = 32,
    ) -> list[DecodedRecord]:
        """Messages of `topic` carrying `key`, through the index (`ClientReads.query`)."""
        return self._read_side().query(topic, key, begin_ms, end_ms, max_count)

    def offset_for_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset stored at or after `ts_ms`."""
        return self._read_side().offset_for_time(topic, queue_id, ts_ms)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._read_side().min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._read_side().max_offset(topic, queue_id)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Persist the group's next offset (config/consumerOffset.json, durable on return)."""
        self._read_side().commit_offset(group, topic, queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset, -1 when it never committed one."""
        return self._read_side().committed_offset(group, topic, queue_id)
