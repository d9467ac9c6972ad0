"""The commit log's cache of encoded record tails: the appender's fast path.

`engine.record.encode` is the reference encoder: it validates everything and costs tens
of microseconds. `TailCache` keeps, per (topic, properties, born host, store host), the
parts of a record the reference encoder accepted with IPv4 hosts (`Tail`: topic and
properties bytes, fixed length, host bytes), and in front of it a memo of the last
message's shape (properties compared as maps: equal maps share one encoded tail). Hosts
are learnt from a valid record the reference encoder wrote (`learn_hosts`); a key whose
hosts are not known yet is the reference encoder's to judge.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final, NamedTuple

from mqstore.engine import record
from mqstore.engine.record import Message

_V6_BITS: Final = 0x30
_I32: Final = struct.Struct(">i")
_TAIL_CACHE_MAX: Final = 4096
_FIXED_V4V4_BYTES: Final = record.record_length(0, 0, 0)  # 91
_tuple_new: Final = tuple.__new__


class Tail(NamedTuple):
    topic: bytes
    properties: bytes
    fixed_bytes: int  # record length minus body length
    born_addr: bytes
    born_port: int
    store_addr: bytes
    store_port: int


def make_tail(topic: object, props: Mapping[str, str]) -> tuple[bytes, bytes, int] | None:
    """(topic bytes, properties bytes, record length without the body) for IPv4 hosts,
    as `engine.record.encode` lays them out; None unless encode would accept them."""
    try:
        if not isinstance(topic, str):
            return None
        topic_b = topic.encode("utf-8")
        if not 0 < len(topic_b) <= record.MAX_TOPIC_BYTES_V1:
            return None
        if record.properties_problem(props) is not None:
            return None
        props_b = record.encode_properties(props)
    except (TypeError, AttributeError, UnicodeError):
        return None
    if len(props_b) > record.MAX_PROPERTIES_BYTES:
        return None
    return topic_b, props_b, _FIXED_V4V4_BYTES + len(topic_b) + len(props_b)


def store_host_of(data: bytes, ts_pos: int) -> tuple[bytes, int]:
    sys_flag = _I32.unpack_from(data, record.POS_SYSFLAG)[0]
    sh = 20 if sys_flag & record.SysFlag.STOREHOST_V6 else 8
    p = ts_pos + 8
    return bytes(data[p : p + sh - 4]), _I32.unpack_from(data, p + sh - 4)[0]


class TailCache:
    """The fast path's tails by message shape (bounded), and the hosts learnt."""

    def __init__(self) -> None:
        # (topic, properties, born host, store host) -> parts; (born, store) -> host parts
        self._tails: dict[tuple[object, ...], Tail] = {}
        # The last message's shape (topic, properties, hosts) and its tail: a producer
        # usually sends runs of alike messages, and comparing is cheaper than hashing a key.
        self._memo: tuple[object, dict[str, str], object, object, Tail] | None = None
        self._hosts: dict[tuple[object, object], tuple[bytes, int, bytes, int]] = {}

    def find(self, msg: Message) -> Tail | None:
        """The tail of `msg` (memo, then cache, then built from known hosts), or None
        when the reference encoder must judge it. Raises TypeError for unhashable or
        odd-typed fields."""
        props = msg.properties
        memo = self._memo
        if (
            memo is not None
            and msg.topic == memo[0]
            and props == memo[1]
            and msg.born_host == memo[2]
            and msg.store_host == memo[3]
        ):
            return memo[4]
        ent = self.keyed(msg)
        if ent is not None:
            snapshot = dict(props) if props else {}
            self._memo = (msg.topic, snapshot, msg.born_host, msg.store_host, ent)
        return ent

    def keyed(self, msg: Message) -> Tail | None:
        """`find` without the memo. Raises TypeError."""
        props = msg.properties
        key = (msg.topic, tuple(props.items()) if props else (), msg.born_host, msg.store_host)
        ent = self._tails.get(key)
        if ent is None:
            ent = self._tail_for(msg, key)
        return ent

    def learn_hosts(self, msg: Message, data: bytes, ts_pos: int, addr: bytes, port: int) -> None:
        """Remember the host bytes of a valid record the reference encoder wrote for
        `msg`, when both hosts are IPv4."""
        if ts_pos == 56 and not _I32.unpack_from(data, record.POS_SYSFLAG)[0] & _V6_BITS:
            try:
                hosts = (data[48:52], _I32.unpack_from(data, 52)[0], addr, port)
                self._hosts[(msg.born_host, msg.store_host)] = hosts
            except TypeError:
                pass

    def _tail_for(self, msg: Message, key: tuple[object, ...]) -> Tail | None:
        """Build (and cache) the fast-path parts of a message whose hosts were seen in a
        valid IPv4 record; None when anything needs the reference encoder's judgement."""
        hosts = self._hosts.get((msg.born_host, msg.store_host))
        if hosts is None:
            return None
        made = make_tail(msg.topic, msg.properties)
        if made is None:
            return None
        if len(self._tails) >= _TAIL_CACHE_MAX:
            self._tails.clear()
        ent: Tail = _tuple_new(Tail, (*made, *hosts))
        self._tails[key] = ent
        return ent
