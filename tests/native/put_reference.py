"""The Python references of the C put, for the tests only: its reading of a message
(`ipc/native/mqs_fields.c`):
what a put of these fields stores, or the status and reason it is refused with. It is
built from the reference encoder (`engine.record.encode`), the name rule
(`engine.names.topic_problem`) and the queue rule (`queue_id_problem`); the
differential tests (test_put_message.py) compare the C put with it, byte for byte; and
the publisher's twin (`publish_reference`, against `_native.publish`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqstore.engine import record
from mqstore.engine.names import topic_problem
from mqstore.engine.record import Message
from mqstore.engine.retry import schedule_rewrite
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Positions, Reservation
from mqstore.ipc.results import PutMessageStatus
from tests.native.idle_reference import idle_wake_reference
from tests.native.uniq_reference import UNIQ, stamped

ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL


@dataclass
class Lane:
    """A topic's queue count, round-robin modulus and counter (the C put's lane)."""

    queues: int
    spread: int
    rr: int = 0


def _keys_problem(keys: Sequence[str]) -> str | None:
    for i, k in enumerate(keys):
        if not k:
            return f"keys[{i}] is empty"
        if any(ch.isspace() for ch in k):
            return (
                f"keys[{i}] {k!r} contains whitespace, which separates keys in RocketMQ's KEYS "
                "property: pass each key as its own item"
            )
    return None


def properties_of(
    tags: str | None, keys: str | Sequence[str] | None, properties: Mapping[str, str] | None
) -> dict[str, str] | tuple[PutMessageStatus, str]:
    """The record's properties (the caller's, TAGS, KEYS), or why they are refused
    before encoding (a property the reference encoder refuses is left to it)."""
    props = dict(properties or {})
    for name, given in (("TAGS", tags), ("KEYS", keys)):
        if given is not None and name in props:
            return ILLEGAL, (
                f"{name.lower()}= and properties[{name!r}] both set the {name} property: "
                "give it once"
            )
    why = record.properties_problem({**props, **({"TAGS": tags} if tags is not None else {})})
    if why is not None:
        return ILLEGAL, why
    if tags is not None:
        props["TAGS"] = tags
    if keys is not None:
        if not isinstance(keys, str):
            why = _keys_problem(keys)
            if why is not None:
                return ILLEGAL, why
            keys = " ".join(keys)
        props["KEYS"] = keys
        why = record.properties_problem(props)
        if why is not None:
            return ILLEGAL, why
    return props


def put_reference(
    topic: str,
    body: Any,
    tags: str | None,
    keys: str | Sequence[str] | None,
    properties: Mapping[str, str] | None,
    queue_id: int | None,
    *,
    lane: Lane,
    max_body: int,
    seg_size: int,
    store_host: str,
    born: int,
    message: Message | None = None,
    uniq_key: str | None = None,
    delay_level: int | None = None,
    max_delay: int = 18,
    schedule_lane: Lane | None = None,
) -> tuple[Message, int] | tuple[PutMessageStatus, str]:
    """(the Message whose record the put stores, its size), or (status, reason). Moves
    the lane's round-robin counter as the C put does (for a valid topic and body).
    `delay_level` (a Message's own when `message` is given): the delay rewrite
    (`delay_reference`) with `max_delay` levels into `schedule_lane`'s queues.
    `uniq_key`: the id the client's UniqIds makes, stamped after every other check
    (`mqs_uniq_stamp`) unless the properties hold a UNIQ_KEY."""
    got = _put_reference(
        topic, body, tags, keys, properties, queue_id, lane=lane, max_body=max_body,
        seg_size=seg_size, store_host=store_host, born=born, message=message,
        delay_level=delay_level, max_delay=max_delay, schedule_lane=schedule_lane,
    )  # fmt: skip
    if uniq_key is None or isinstance(got[0], PutMessageStatus):
        return got
    msg = got[0]
    if UNIQ in msg.properties:
        return got
    props = stamped(dict(msg.properties), uniq_key)
    n = len(record.encode_properties(props))
    if n > 32767:
        return PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, (
            f"properties are {n} UTF-8 bytes with the UNIQ_KEY the put adds (42); at most "
            "32767 are allowed"
        )
    msg = dataclasses.replace(msg, properties=props)
    size = len(record.encode(msg, max_message_size=max(len(msg.body), 1)).data)
    if size + record.END_FILE_MIN_BLANK_LENGTH > seg_size:
        return ILLEGAL, f"record of {size} bytes does not fit a {seg_size}-byte segment"
    return msg, size


def _put_reference(
    topic: str,
    body: Any,
    tags: str | None,
    keys: str | Sequence[str] | None,
    properties: Mapping[str, str] | None,
    queue_id: int | None,
    *,
    lane: Lane,
    max_body: int,
    seg_size: int,
    store_host: str,
    born: int,
    message: Message | None = None,
    delay_level: int | None = None,
    max_delay: int = 18,
    schedule_lane: Lane | None = None,
) -> tuple[Message, int] | tuple[PutMessageStatus, str]:
    why = topic_problem(topic)
    if why is not None:
        return ILLEGAL, why
    props = properties_of(tags, keys, properties)
    if isinstance(props, tuple):
        return props
    for k, v in props.items():  # a lone surrogate: its field's own error
        try:
            k.encode()
            v.encode()
        except UnicodeError as e:
            return ILLEGAL, f"bad message: {e}"
    body = bytes(body)
    base = message or Message(topic, body, store_host=store_host, born_timestamp=born)
    msg = Message(
        topic,
        body,
        props,
        0,
        base.flag,
        base.sys_flag,
        base.born_timestamp or born,
        base.born_host,
        store_host,
        base.reconsume_times,
        base.prepared_transaction_offset,
    )
    rec = record.encode(msg, max_message_size=max_body)
    if rec.status is not record.EncodeStatus.OK:
        return PutMessageStatus[rec.status.value], rec.reason
    if queue_id is None:
        queue_id = lane.rr % lane.spread if lane.spread > 0 else 0
        lane.rr = (queue_id + 1) % lane.spread if lane.spread > 0 else 0
    if not 0 <= queue_id < lane.queues:
        return ILLEGAL, queue_id_problem(topic, queue_id, lane.queues)
    if message is not None:
        delay_level = message.delay_level
    if delay_level is not None:
        delayed = delay_reference(
            dataclasses.replace(msg, queue_id=queue_id, delay_level=delay_level),
            max_delay, schedule_lane or Lane(max_delay, max_delay),
        )  # fmt: skip
        if isinstance(delayed, tuple):
            return delayed
        msg = delayed
        queue_id = msg.queue_id
        rec = record.encode(msg, max_message_size=max_body)
        if rec.status is not record.EncodeStatus.OK:
            return PutMessageStatus[rec.status.value], rec.reason
    size = len(rec.data)
    if size + record.END_FILE_MIN_BLANK_LENGTH > seg_size:
        return ILLEGAL, f"record of {size} bytes does not fit a {seg_size}-byte segment"
    return dataclasses.replace(msg, queue_id=queue_id), size


def record_bytes(msg: Message, queue_offset: int, physical_offset: int, store_ts: int) -> bytes:
    """The reference encoder's record of `msg` with the three appender fields."""
    enc = record.encode(msg, max_message_size=max(len(msg.body), 1))
    out = bytearray(len(enc.data))
    record.patch_append_fields(out, 0, enc, queue_offset, physical_offset, store_ts)
    return bytes(out)


def queue_id_problem(topic: str, queue_id: object, queues: int) -> str:
    """Why `queue_id` is not one of `topic`'s `queues` write queues. RocketMQ's broker
    refuses such a put ("queueId ... is illegal"): the unit would go to a queue no
    consumer of the topic reads, and a topic config cannot name it
    (`engine.topics.MAX_QUEUE_NUMS`)."""
    return (
        f"queue id {queue_id!r} is not one of topic {topic!r}'s {queues} queues "
        f"(0..{queues - 1}); `mqstore topic DIR set {topic} --queues N` changes the count"
    )


def publish_reference(buf: bytearray) -> int:
    """The Python twin of `_native.publish` (tests compare the two byte for byte): move
    published_seq over contiguous DONE slots below the fence's seq, published_pos and
    published_ts to the last one's end and store time (never lower); when it moved, wake
    the idle workers that said they sleep (`idle_wake_reference`); return the slots
    advanced. One process."""
    pos = Positions(buf)
    slot_count = Reservation(buf).slot_count
    seq = pos.seq
    ps = start = pos.published_seq
    fence = c.I64.unpack_from(buf, c.OFF_FENCE_SEQ)[0]
    if fence > 0:
        seq = min(seq, fence - 1)  # past the fence: never published
    while ps < seq:
        off, _qo, ts, size, _pid, _qslot, state = c.SLOT.unpack_from(
            buf, c.SLOTS_OFF + (ps % slot_count) * c.SLOT_ROW
        )
        if state & c.STATE_MASK != c.STATE_DONE:
            break
        ps += 1
        for at, value in ((c.OFF_PUBLISHED, off + size), (c.OFF_PUBLISHED_TS, ts)):
            if c.I64.unpack_from(buf, at)[0] < value:  # never lower
                c.I64.pack_into(buf, at, value)
        c.I64.pack_into(buf, c.OFF_PUBLISHED_SEQ, ps)
    if ps > start:
        idle_wake_reference(buf)
    return int(ps - start)


_DELAY_PROPS = ("DELAY", "REAL_TOPIC", "REAL_QID")


def delay_reference(
    msg: Message, max_delay: int, schedule_lane: Lane
) -> Message | tuple[PutMessageStatus, str]:
    """The C put's delay rewrite (`mqs_fields.c`: `delay_rewrite`) of `msg` (its real
    queue chosen): `engine.retry.schedule_rewrite` with the put's refusals."""
    level = msg.delay_level
    if level < 0:
        return ILLEGAL, (
            f"delay_level {level!r} is negative: 0 (no delay) or a level 1..{max_delay} of "
            "messageDelayLevel"
        )
    if level == 0 or (msg.sys_flag & 0xC) in (0x4, 0xC):
        return msg
    if max_delay < 1:
        return ILLEGAL, "delay_level given but messageDelayLevel has no levels"
    for name in _DELAY_PROPS:
        if name in msg.properties:
            return ILLEGAL, (
                f"delay_level= and properties['{name}'] both given: the store sets {name} "
                "for a delayed message"
            )
    out = schedule_rewrite(msg, max_delay)
    size = len(record.encode_properties(out.properties))
    if size > record.MAX_PROPERTIES_BYTES:
        return PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, (
            f"properties are {size} UTF-8 bytes with the delay's DELAY, REAL_TOPIC and "
            f"REAL_QID; at most {record.MAX_PROPERTIES_BYTES} are allowed"
        )
    if out.queue_id >= schedule_lane.queues:
        return ILLEGAL, (
            f"delay level {out.delay_level} needs queue {out.queue_id} of SCHEDULE_TOPIC_XXXX, "
            f"which has {schedule_lane.queues} queues"
        )
    return out


def backlog_reference(
    since: int, backlog: int, bound: int, grace_ns: int, drain: int, now: int
) -> tuple[bool, int]:
    """The Python twin of `_native.backlog_full` (C `mqs_backlog_full`, the put's flow
    control with the pool on): (whether the reservation waits, the producer's new
    `since`). No bound (0): never. At or over `drain` (> 0, the committer's drain bytes):
    wait, whatever the grace; `since` kept as the rest of the rule leaves it. Under half
    the bound: caught up, `since` forgotten. Under the bound: go on, `since` kept. At or
    over it: `since` noted at the first such look (`now`, or 1 when the clock says 0),
    and the put waits once `grace_ns` has passed since then, and at every later look at
    the bound until the backlog falls under half."""
    if bound <= 0:
        return False, since
    over_drain = drain > 0 and backlog >= drain
    if backlog < bound - bound // 2:
        return over_drain, 0
    if backlog < bound:
        return over_drain, since
    if since == 0:
        since = now if now > 0 else 1
    return now - since >= grace_ns or over_drain, since
