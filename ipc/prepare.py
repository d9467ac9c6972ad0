"""`Preparer`: a message validated and laid out for the C appender, and the lanes.

The general path of a put (`ipc.producer`) prepares each message outside any lock:
`_prepare` checks it (`ipc.accepts`: topic name, queue id within the topic's queues,
fields written as given or refused with MESSAGE_ILLEGAL and the reason) and returns a
`_Prep` tuple, the layout the C appender reads (`ipc/native/mqs_module.c`). The topic and
properties bytes come from the reference encoder (`engine.record.encode`) once per
(topic, properties) and are cached (`_tail`, `_keyed_tail`).

A *lane* (`_Lane`, made by `_warm`) is what the C put (`ipc/native/mqs_put.c`) needs of
one topic: its bytes, queue count, round-robin counter, queue-table rows and the
properties bytes per tags value, made once the reference encoder accepted them.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from mqstore.engine import record
from mqstore.engine.names import topic_problem
from mqstore.engine.record import END_FILE_MIN_BLANK_LENGTH, Message
from mqstore.engine.recordcodes import parse_host
from mqstore.ipc.accepts import (
    UNSET_STORE_HOST,
    Host,
    hosts_problem,
    int_fields_problem,
    queue_id_problem,
)
from mqstore.ipc.results import PutMessageStatus, PutResult
from mqstore.ipc.session import Session

_time_ns: Final = time.time_ns
_TX_MASK: Final = 0xC
_TX_COMMIT: Final = 0x8
_BORN_V6: Final = 0x10
_STORE_V6: Final = 0x20
_DEFAULT_BORN: Final[Host] = (b"\x7f\x00\x00\x01", 0, False)  # 127.0.0.1:0


class PutFields(NamedTuple):
    """One message as `put` takes it: what the general path validates (`_prepare`)."""

    topic: str
    body: Any  # bytes, bytearray or memoryview (check_put_types)
    tags: str | None
    keys: str | Sequence[str] | None
    properties: Mapping[str, str] | None
    queue_id: int | None


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


class Preparer(Session):
    """The session's producer half that needs no lock: validation, encoding, lanes."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        timeout_s: float,
        topic_queue_nums: Mapping[str, int] | None,
    ) -> None:
        super().__init__(store_dir, timeout_s)
        self.topic_queue_nums: dict[str, int] = dict(topic_queue_nums or {})
        self._tails: dict[object, tuple[bytes, bytes, int] | PutResult] = {}
        self._heads: dict[tuple[str, str | None], tuple[bytes, int, bytes]] = {}
        self._rr: dict[str, int] = {}  # round-robin counters of topics without a lane

    def _on_attach(self, info: dict[str, Any]) -> None:
        super()._on_attach(info)
        addr, port, v6 = self._store = parse_host(self._store_host)
        self._store_addr, self._store_port, self._store_v6 = addr, port, v6
        self._hosts: dict[str, Host] = {}
        self._msg_id_prefix = (addr + struct.pack(">i", port)).hex().upper()
        self._qslots: dict[tuple[bytes, int], int] = {}
        self._lanes: dict[str, _Lane] = {}

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
        fields: PutFields,
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
        topic, body, tags, keys, properties, queue_id = fields
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
        """`recordcodes.parse_host`, cached (bounded). Raises ValueError."""
        got = self._hosts.get(host)
        if got is None:
            got = parse_host(host)
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
