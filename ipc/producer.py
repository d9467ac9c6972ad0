"""`PutPath`: the puts of a `StoreClient`, in the caller's process, in one C call.

`StoreClient.put` and `put_batch` hand their arguments to `mqstore._native.Appender`'s
`put_message` / `put_batch_messages`, which does the whole put of every documented shape
(`ipc/native/mqs_put.c` names each step). It answers None, having done nothing, only
when this side must act first (`put_held`): the session is due for its supervisor check
(every 10 ms, `ipc.session`) or must re-attach, another thread of this client puts (its
lock, `_native.PutLock`, which the C call takes too), or an argument's type is one the
C call does not read: `ipc.accepts` then raises the TypeError naming the parameter, or
the arguments are passed again in plain types (`_plain`). The put's Python reference,
tests/native/put_reference.py, is what the differential tests compare the C put with.

What the C put asks of this side, through `Appender.configure`: a topic's lane on its
first put (`Lanes.new`: its queue count and round-robin counter), a queue-table row
(`ControlBlock.find_or_add_queue`, under the reservation lock), a segment's mapping with
the pool off (`_map_segment`), the born host and other fields of a `Message`
(`_MessageFields`).
"""

from __future__ import annotations

import array
import contextlib
import functools
import mmap
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any, Final

from mqstore import _native
from mqstore.conf.settings import FlushDiskType, parse_delay_levels
from mqstore.engine import fileio
from mqstore.engine.record import SCHEDULE_TOPIC, Message
from mqstore.engine.recordcodes import parse_host
from mqstore.engine.topics import QueueCounts
from mqstore.ipc import control as c
from mqstore.ipc.accepts import (
    BOOL,
    UNSET_STORE_HOST,
    Host,
    check_batch,
    check_batch_item,
    check_message_types,
    check_put_types,
    check_types,
    hosts_problem,
    int_fields_problem,
)
from mqstore.ipc.results import FSYNC_FAILED, PutMessageStatus, PutResult, flush_timed_out
from mqstore.ipc.session import _STALE_CHECK_NS, Attached, Session

OK: Final = PutMessageStatus.PUT_OK
_PUT_LABEL: Final = "put() argument {!r}"
_LANES_MAX: Final = 4096
_FIELDS: Final = ("topic", "body", "tags", "keys", "properties", "queue_id")
_BORN_V6: Final = 0x10
_STORE_V6: Final = 0x20


class Lanes:
    """What the C put keeps per topic, in `lanes` (topic -> lane): a lane is
    [topic bytes, queue count, round-robin modulus, round-robin counter (the next index,
    kept below the modulus: a cached small int up to 257 queues), queue-table row
    per queue id (-1: found at the first put to it)]. Made on a topic's first put
    (`new`, called from C with a topic the C put validated), followed at each staleness
    check (`refresh`: `mqstore topic set` changes queue counts)."""

    def __init__(
        self,
        counts: QueueCounts,
        topic_queue_nums: Mapping[str, int],
        default_queues: int,
        delay_levels: int,
    ) -> None:
        self.lanes: dict[str, list[Any]] = {}
        self._counts = counts
        self._spread = topic_queue_nums
        self._default = default_queues
        self._delay_levels = delay_levels

    def new(self, topic: str) -> list[Any]:
        if len(self.lanes) >= _LANES_MAX:
            self.lanes.clear()
        lane = [topic.encode(), 0, 0, 0, []]
        self._refresh(topic, lane)
        self.lanes[str(topic)] = lane
        return lane

    def refresh(self) -> None:
        for topic, lane in self.lanes.items():
            self._refresh(topic, lane)

    def _refresh(self, topic: str, lane: list[Any]) -> None:
        queues = self._counts.get(topic, self._default)
        if topic == SCHEDULE_TOPIC:  # one queue per delay level, whatever topics.json says
            queues = max(queues, self._delay_levels)
        lane[2] = self._spread.get(topic) or queues
        if lane[1] != queues:
            lane[1] = queues
            rows: list[int] = lane[4]
            lane[4] = rows[:queues] + [-1] * (queues - len(rows))


class _MessageFields:
    """A batch's `Message` beyond put's fields: (born address, born port, sys flag, flag,
    reconsume times, prepared offset, born time), written as given, or the reason it is
    refused: a wrong type raises TypeError naming it (`ipc.accepts`); an integer that does
    not fit its field, a host that does not parse, a store host other than the store's,
    host bits of `sys_flag` that disagree with the hosts are MESSAGE_ILLEGAL."""

    def __init__(self, store_host: str) -> None:
        self._store_host = store_host
        self._store = parse_host(store_host)
        self._hosts: dict[str, Host] = {}

    def _host(self, host: str) -> Host:
        got = self._hosts.get(host)
        if got is None:
            got = parse_host(host)
            if len(self._hosts) > 256:
                self._hosts.clear()
            self._hosts[host] = got
        return got

    def __call__(self, i: int, m: Message) -> tuple[bytes, int, int, int, int, int, int] | str:
        check_message_types(f"put_batch() messages[{i}].{{}}", m)
        why = int_fields_problem(m)
        if why is not None:
            return why
        try:
            born = self._host(m.born_host)
            given = None if m.store_host == UNSET_STORE_HOST else self._host(m.store_host)
        except ValueError as e:
            return str(e)
        why = hosts_problem(m.sys_flag, born, self._store, self._store_host, given)
        if why is not None:
            return why
        return (
            born[0], born[1], m.sys_flag & ~(_BORN_V6 | _STORE_V6), m.flag, m.reconsume_times,
            m.prepared_transaction_offset, m.born_timestamp,
        )  # fmt: skip


def _configure_compression(app: _native.Appender, a: Attached) -> None:
    """The store's body compression (`compress_type`, `compress_level`,
    `compress_msg_body_over_howmuch_bytes`) into the C put: the codec's C function."""
    s = a.settings
    kind = s.compress_type.strip().upper()
    if kind == "NONE":
        app.configure_compression(None, 0, 0)
        return
    from mqstore.engine import compression  # the codecs' libraries: only when configured

    codec = compression.Codec[kind]
    app.configure_compression(
        compression.compressor(codec, s.compress_level),
        s.compress_msg_body_over_howmuch_bytes,
        codec.flag,
    )


def _map_segment(store_dir: str, seg_size: int, index: int) -> mmap.mmap:
    """The writable mapping of commit-log segment `index` (pool off), for the C put."""
    from mqstore.engine.segment import segment_file_name  # the file layer, once per segment

    path = os.path.join(store_dir, "commitlog", segment_file_name(index * seg_size))
    fd = fileio.open_file(path, create=False)
    try:
        return fileio.mmap_file(fd, seg_size, writable=True, path=path)
    finally:
        fileio.close(fd, path)


def _plain(
    topic: Any, body: Any, tags: Any, keys: Any, properties: Any, queue_id: Any
) -> tuple[Any, ...]:
    """Put's fields (their types checked) in the types the C put reads: a sequence of
    keys as a tuple, a mapping as a dict, a non-contiguous memoryview as bytes."""
    if isinstance(body, memoryview) and not body.c_contiguous:
        body = bytes(body)
    if keys is not None and not isinstance(keys, str | list | tuple):
        keys = tuple(keys)
    if properties is not None and type(properties) is not dict:
        properties = dict(properties)
    return topic, body, tags, keys, properties, queue_id


def _plain_item(m: Any) -> Any:
    """A batch's item (its types checked), as `_plain` makes put's fields."""
    if isinstance(m, Message):
        _t, body, _g, _k, props, _q = _plain(None, m.body, None, None, m.properties, None)
        if body is m.body and props is m.properties:
            return m
        import dataclasses  # here: a producer's import does not load it

        return dataclasses.replace(m, body=body, properties=props)
    d = dict(m)
    plain = _plain(*(d.get(k) for k in _FIELDS))
    for k, v in zip(_FIELDS, plain, strict=True):
        if k in d:
            d[k] = v
    return d


@functools.cache
def host_ip() -> bytes:
    """This host's IPv4 address for message ids (RocketMQ's UtilAll.getIP: the first
    address that is not loopback): the source address of a route out, found without
    sending anything; 127.0.0.1 without one. Once per process."""
    ip = b"\x7f\x00\x00\x01"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: a connect of UDP sends nothing
        ip = socket.inet_aton(s.getsockname()[0])
    return ip


class PutPath:
    """The puts of one client: the session they ride (`session`, made here) and, per
    attach, the C appender configured for it. `ids` makes the client's UNIQ_KEYs
    (`_native.UniqIds`: one producer id for the client's life, re-attaches included);
    `idempotence`: a put whose UNIQ_KEY the store holds already answers its first
    result (`ipc/native/mqs_uniq.h`, docs/durability.md)."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        timeout_s: float,
        topic_queue_nums: Mapping[str, int] | None,
        raise_on_status: bool,
        idempotence: bool = True,
    ) -> None:
        self.ids = _native.UniqIds(host_ip())
        self.idempotence = idempotence
        self.session = Session(store_dir, timeout_s, self)
        self.topic_queue_nums: dict[str, int] = dict(topic_queue_nums or {})
        self.raise_on_status = raise_on_status
        # Per-topic queue counts (`mqstore topic DIR set T --queues N`), re-read at most
        # every 100 ms from config/topics.json.
        self._counts = QueueCounts(self.session.store_dir)

    # --- the session's rider ------------------------------------------------------------

    def attached(self, a: Attached) -> None:
        cb, s = a.cb, a.settings
        addr, port, _v6 = parse_host(s.store_host)
        delay_levels = len(parse_delay_levels(s.message_delay_level))
        queues = s.default_topic_queue_nums
        self._lanes = Lanes(self._counts, self.topic_queue_nums, queues, delay_levels)
        self._stats = array.array("q", bytes(8 * c.CLIENT_FIELDS))  # counted in C
        self._stats[c.CF_PID] = a.pid
        self.app = _native.Appender(cb.buf, cb.pool_buf, a.pid)
        self.app.configure(
            lock=self.session.lock,
            lanes=self._lanes.lanes,
            new_lane=self._lanes.new,
            find_row=cb.find_or_add_queue,
            map_segment=(
                None
                if cb.pool_buffers
                else functools.partial(_map_segment, self.session.store_dir, cb.segment_size)
            ),
            message_type=Message,
            message_fields=_MessageFields(s.store_host),
            stats=self._stats,
            stats_off=cb.client_off(a.client_index),
            result_type=PutResult,
            statuses=tuple(PutMessageStatus),
            flush_reasons=(flush_timed_out(s.sync_flush_timeout_ms / 1000), FSYNC_FAILED),
            msg_id_prefix=(addr + struct.pack(">i", port)).hex().upper(),
            sync=s.flush_disk_type is FlushDiskType.SYNC_FLUSH,
            sync_timeout_ns=s.sync_flush_timeout_ms * 1_000_000,
            busy_ns=s.os_page_cache_busy_timeout_ms * 1_000_000,
            fast_fail=s.fast_fail_if_no_buffer_in_store_pool,
            max_body=s.max_message_size_bytes,
            store_addr=addr,
            store_port=port,
            max_delay_level=delay_levels,
            backlog_bytes=s.commit_backlog_max_bytes if cb.pool_buffers else 0,
            backlog_grace_ns=s.commit_backlog_grace_ms * 1_000_000,
        )
        self.app.use_ids(self.ids, self.idempotence)
        _configure_compression(self.app, a)
        self.app.checked(_STALE_CHECK_NS)

    def detaching(self, a: Attached) -> None:
        with contextlib.suppress(ValueError, TypeError):
            a.cb.write_client(a.client_index, self._stats)
        self.app.close()

    def checking(self, a: Attached) -> None:
        a.cb.write_client(a.client_index, self._stats)  # counted in C between two checks

    def checked(self, a: Attached) -> None:
        self._lanes.refresh()
        self.app.checked(_STALE_CHECK_NS)

    # --- flush wait -------------------------------------------------------------------

    def wait_flushed(self, end: int, timeout_s: float) -> int:
        """Wait until the flusher's flushed position covers `end`, at most `timeout_s`
        (a futex wait, GIL released): 0 covered, 1 not yet, 2 fsync failed (read-only),
        3 the generation ended without flushing it (`ipc.fence`). AttributeError or
        ValueError while the client re-attaches."""
        return self.app.wait_flushed(end, int(timeout_s * 1e9))

    # --- what the C call leaves to this side -----------------------------------------

    def put_held(
        self,
        topic: Any,
        body: Any,
        tags: Any,
        keys: Any,
        props: Any,
        qid: Any,
        wait_store: Any,
        delay_level: Any = 0,
    ) -> PutResult:
        """A put the C call (`app.put_message`) left to this side, nothing done: the
        types checked, the session made live, then the C call again, under the lock."""
        check_put_types(_PUT_LABEL, topic, body, tags, keys, props, qid, delay_level)
        check_types("put", wait_store=(wait_store, BOOL))
        topic, body, tags, keys, props, qid = _plain(topic, body, tags, keys, props, qid)
        with self.session.lock:
            why = self.session.ensure_live()
            if why:
                return PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, why)
            got: PutResult | None = self.app.put_message(
                topic, body, tags, keys, props, qid, wait_store, True, delay_level
            )
        if got is None:
            raise TypeError("put() arguments of types the store cannot read")
        return got

    def put_batch_held(
        self, messages: Any, wait_store: Any, redelivered: bool = False
    ) -> list[PutResult]:
        """As `_put_held`, for a batch."""
        msgs = check_batch(messages)
        for i, m in enumerate(msgs):
            check_batch_item(i, m)
        check_types("put_batch", wait_store=(wait_store, BOOL))
        plain = [_plain_item(m) for m in msgs]
        with self.session.lock:
            why = self.session.ensure_live()
            if why:
                return [PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, why) for _ in msgs]
            got: list[PutResult] | None = self.app.put_batch_messages(
                plain, wait_store, True, redelivered
            )
        if got is None:
            raise TypeError("put_batch() messages of types the store cannot read")
        return got
