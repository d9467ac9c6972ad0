"""The C put (`Appender.put_message`, `put_batch_messages`) against its Python reference
(tests/native/put_reference.py: `engine.record.encode` and the put's rules), over a real
control block: for every shape of arguments the record bytes equal the reference's, or
the status and reason do, with nothing written; a segment roll writes its BLANK; waits
for room end in their statuses; a type the C put does not read is left to the client
(None, nothing done); its lock-free publish moves the published position as the Python
twin (put_reference.publish_reference) does. These run under ASan/UBSan too
(`make sanitize`)."""

from __future__ import annotations

import array
import dataclasses
import mmap
import os
import secrets
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import record
from mqstore.engine.record import SCHEDULE_TOPIC, Message
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Flags
from mqstore.ipc.fence import fence
from mqstore.ipc.producer import _MessageFields
from mqstore.ipc.results import PutMessageStatus, PutResult
from tests.native.conftest import SEG
from tests.native.put_reference import (
    Lane,
    backlog_reference,
    publish_reference,
    put_reference,
    record_bytes,
)

QUEUES = 4
SPREAD = 3
MAX_BODY = 4096
STORE_HOST = "127.0.0.1:10911"
PREFIX = "7F00000100002A9F"
OK = PutMessageStatus.PUT_OK
BUSY_NS = 50_000_000
MAX_DELAY = 6  # messageDelayLevel's count; the schedule topic has one queue fewer here
SCHEDULE_QUEUES = 5
SETTINGS = settings(
    max_examples=300, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip


class Put:
    """An appender configured as the client configures it, with lanes of QUEUES queues
    (spread over SPREAD by the round robin), and the reference's view of the same lanes."""

    def __init__(self, cb: c.ControlBlock, **kw: Any) -> None:
        self.cb = cb
        self.lanes: dict[str, list[Any]] = {}
        self.ref: dict[str, Lane] = {}
        self.rows = kw.pop("find_row", cb.find_or_add_queue)
        self.app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
        self.config = {
            "lock": _native.PutLock(), "lanes": self.lanes, "new_lane": self.new_lane,
            "find_row": self.rows, "map_segment": None, "message_type": Message,
            "message_fields": _MessageFields(STORE_HOST),
            "stats": array.array("q", bytes(8 * c.CLIENT_FIELDS)),
            "stats_off": cb.client_off(0), "result_type": PutResult,
            "statuses": tuple(PutMessageStatus), "flush_reasons": ("timed out", "failed"),
            "msg_id_prefix": PREFIX, "sync": False, "sync_timeout_ns": 10**9,
            "busy_ns": BUSY_NS, "fast_fail": False, "max_body": MAX_BODY,
            "store_addr": b"\x7f\x00\x00\x01", "store_port": 10911,
            "max_delay_level": MAX_DELAY, **kw,
        }  # fmt: skip
        self.app.configure(**self.config)
        self.app.checked(10**12)

    def new_lane(self, topic: str) -> list[Any]:
        n = SCHEDULE_QUEUES if topic == SCHEDULE_TOPIC else QUEUES
        lane = [topic.encode(), n, SPREAD, 0, [-1] * n]
        self.lanes[topic] = lane
        return lane

    def lane(self, topic: str) -> Lane:
        n = SCHEDULE_QUEUES if topic == SCHEDULE_TOPIC else QUEUES
        return self.ref.setdefault(topic, Lane(n, SPREAD))


@pytest.fixture
def put(cb: c.ControlBlock) -> Iterator[Callable[..., Put]]:
    made: list[Put] = []

    def make(**kw: Any) -> Put:
        for off in (c.OFF_RESERVED, c.OFF_SEQ, c.OFF_PUBLISHED_SEQ, c.OFF_PUBLISHED):
            cb.set(off, 0)
        made.append(Put(cb, **kw))
        return made[-1]

    yield make
    for p in made:
        p.app.close()


class Topic(str):
    pass


class Body(bytes):
    pass


_ascii = st.text(st.characters(max_codepoint=0x7F), max_size=20)  # the one-pass encoder's
_text = (
    st.text(max_size=6)
    | _ascii
    | st.sampled_from(["", "a b", "x\x01", "\ud800", "ü", "k\t", "abcdefgh\x02", "order-17 x"])
)
topics = st.sampled_from(["TopicA", "t-2", Topic("TopicA")]) | st.text(max_size=4)
bodies = st.binary(max_size=MAX_BODY + 2).flatmap(
    lambda b: st.sampled_from([b, bytearray(b), memoryview(b), Body(b)])
)
_sub = st.builds(Topic, _ascii)  # a str subclass: never compact, so the checked pass
tags_ = st.none() | st.sampled_from(["TagA"]) | _text | _sub
keys_ = (
    st.none()
    | _text
    | _sub
    | st.lists(_text | _sub, max_size=3).flatmap(lambda ks: st.sampled_from([ks, tuple(ks)]))
    | st.integers(32000, 33000).map(lambda n: "k" * n)
)
props_ = st.none() | st.dictionaries(
    _text | st.sampled_from(["TAGS", "KEYS", "DELAY", "REAL_QID"]) | _sub,
    _text | _sub,
    max_size=3,
)
queue_ids = st.none() | st.integers(-2, QUEUES + 1) | st.just(2**70)
delays = st.integers(-1, MAX_DELAY + 1) | st.sampled_from([2**70, -(2**70)])
opt_delays = st.none() | delays


def check_stored(p: Put, got: PutResult, want: Message) -> None:
    assert got.status is OK, got
    assert got.msg_id == f"{PREFIX}{got.physical_offset:016X}"
    assert p.cb.pool_buf is not None
    raw = bytes(p.cb.pool_buf[got.physical_offset : got.physical_offset + got.size])
    (born,) = struct.unpack_from(">q", raw, 40)  # "now" for a message without a born time
    if want.born_timestamp:
        assert born == want.born_timestamp
    assert raw == record_bytes(
        _with_born(want, born), got.queue_offset, got.physical_offset, got.store_timestamp
    )


def _with_born(m: Message, born: int) -> Message:
    return Message(
        m.topic, m.body, m.properties, m.queue_id, m.flag, m.sys_flag, born, m.born_host,
        m.store_host, m.reconsume_times, m.prepared_transaction_offset,
    )  # fmt: skip


@SETTINGS
@given(
    topic=topics, body=bodies, tags=tags_, keys=keys_, properties=props_, queue_id=queue_ids,
    delay=opt_delays,
)  # fmt: skip
def test_put_message_stores_the_reference_record_or_its_refusal(
    put: Callable[..., Put], topic: str, body: Any, tags: Any, keys: Any, properties: Any,
    queue_id: Any, delay: Any,
) -> None:  # fmt: skip
    p = put()
    lane = p.lane(str(topic))
    args = (topic, body, tags, keys, properties, queue_id, False)
    got = p.app.put_message(*args) if delay is None else p.app.put_message(*args, False, delay)
    want = put_reference(
        topic, body, tags, keys, properties, queue_id, lane=lane, max_body=MAX_BODY,
        seg_size=SEG, store_host=STORE_HOST, born=0, delay_level=delay, max_delay=MAX_DELAY,
        schedule_lane=p.lane(SCHEDULE_TOPIC),
    )  # fmt: skip
    assert type(got) is PutResult
    if isinstance(want[0], PutMessageStatus):
        assert (got.status, got.reason) == want
        assert (got.msg_id, got.physical_offset, got.size) == ("", 0, 0)
        assert p.cb.get(c.OFF_SEQ) == 0  # nothing reserved
    else:
        msg, size = want
        assert (got.size, got.queue_id) == (size, msg.queue_id)
        check_stored(p, got, msg)
        assert p.cb.get(c.OFF_PUBLISHED_SEQ) == 1  # the producer published its own slot
    if str(topic) in p.lanes:
        assert p.lanes[str(topic)][3] == lane.rr  # the round robin moved as the reference's


_hosts = st.sampled_from(["127.0.0.1:0", "10.1.2.3:77", "[::1]:5", "[fd00::7]:10911"])
messages = st.builds(
    Message,
    topic=topics,
    body=st.binary(max_size=64),
    properties=st.dictionaries(_text, _text, max_size=2),
    queue_id=st.integers(-1, QUEUES),
    flag=st.integers(-(2**31), 2**31 - 1),
    sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC, 0x1, 0x100]),
    born_timestamp=st.sampled_from([0, 1, 2**62]),
    born_host=_hosts,
    store_host=st.sampled_from([STORE_HOST, "127.0.0.1:10911"]),
    reconsume_times=st.integers(0, 3),
    prepared_transaction_offset=st.integers(0, 2**40),
    delay_level=st.just(0) | delays,
)
dicts = st.fixed_dictionaries(
    {"topic": topics, "body": st.binary(max_size=64)},
    optional={
        "tags": tags_, "keys": keys_, "properties": props_, "queue_id": queue_ids,
        "delay_level": opt_delays,
    },
)  # fmt: skip


@SETTINGS
@given(st.lists(dicts | messages, min_size=1, max_size=10))
def test_put_batch_stores_the_reference_records_or_refuses_them_all(
    put: Callable[..., Put], batch: list[Any]
) -> None:
    p = put()
    next_before: dict[tuple[str, int], int] = {}
    wants: list[tuple[Message, int]] = []
    refusal = None
    for i, m in enumerate(batch):
        f = dataclasses.asdict(m) if isinstance(m, Message) else m
        want = put_reference(
            f["topic"], f["body"], f.get("tags"), f.get("keys"), f.get("properties"),
            f.get("queue_id"), lane=p.lane(str(f["topic"])), max_body=MAX_BODY, seg_size=SEG,
            store_host=STORE_HOST, born=0, message=m if isinstance(m, Message) else None,
            delay_level=f.get("delay_level"), max_delay=MAX_DELAY,
            schedule_lane=p.lane(SCHEDULE_TOPIC),
        )  # fmt: skip
        if isinstance(want[0], PutMessageStatus):
            refusal = (want[0], f"message {i} of the batch: {want[1]}")
            break
        wants.append(want)  # type: ignore[arg-type]
    for msg, _size in wants:  # the queue rows' next offsets (rows outlive an example)
        row = p.cb.find_or_add_queue(msg.topic.encode(), msg.queue_id)
        next_before.setdefault((msg.topic, msg.queue_id), p.cb.qrow(row)[2])
    got = p.app.put_batch_messages(batch, False)
    assert type(got) is list and len(got) == len(batch)
    if refusal is not None:
        assert {(r.status, r.reason) for r in got} == {refusal}
        assert p.cb.get(c.OFF_SEQ) == 0
        return
    at = 0
    for (msg, size), r in zip(wants, got, strict=True):
        assert (r.physical_offset, r.size, r.queue_id) == (at, size, msg.queue_id)
        if record.takes_queue_offset(msg.sys_flag):
            key = (msg.topic, msg.queue_id)
            assert r.queue_offset == next_before[key]  # in batch order, without gaps
            next_before[key] = r.queue_offset + 1
        else:
            assert r.queue_offset == 0
        check_stored(p, r, msg)
        at += size
    assert len({r.store_timestamp for r in got}) == 1
    assert p.cb.get(c.OFF_PUBLISHED_SEQ) == len(batch)


@pytest.mark.parametrize("n", range(1, 19))
def test_a_separator_or_space_anywhere_in_ascii_text_is_found(
    put: Callable[..., Put], n: int
) -> None:
    """The one-pass encoder of ASCII properties looks at 8 bytes at a time (a short str at
    its first, middle and last bytes): every byte below '!' at every place of a str of
    each length is judged as the reference judges it, as a property's name or value,
    tags, keys, and a key of a list."""
    p = put()
    lane = p.lane("TopicA")
    for ch in "\x00\x01\x02\x03\t\n\x0b\x0c\r\x1b\x1c\x1f !~":
        for at in range(n):
            s = "a" * at + ch + "b" * (n - at - 1)
            for tags, keys, props in (
                (None, None, {s: "v"}), (None, None, {"p": s}), (s, None, None),
                (None, s, None), ("t", [s], {"p": "v"}), (None, ["k", s, "z"], None),
            ):  # fmt: skip
                got = p.app.put_message("TopicA", b"x", tags, keys, props, 0, False)
                want = put_reference(
                    "TopicA", b"x", tags, keys, props, 0, lane=lane, max_body=MAX_BODY,
                    seg_size=SEG, store_host=STORE_HOST, born=0,
                )  # fmt: skip
                if isinstance(want[0], PutMessageStatus):
                    assert (got.status, got.reason) == want, (tags, keys, props)
                else:
                    check_stored(p, got, want[0])


def test_types_the_c_put_does_not_read_are_left_to_the_client(put: Callable[..., Put]) -> None:
    """None, nothing done: the client raises the TypeError (`ipc.accepts`) or passes the
    arguments again in plain types (ipc.producer: `_plain`)."""
    p = put()
    for args in (
        (None, b"x", None, None, None, None, False),
        ("TopicA", "text", None, None, None, None, False),
        ("TopicA", b"x", 1, None, None, None, False),
        ("TopicA", b"x", None, 123, None, None, False),
        ("TopicA", b"x", None, ["k", 1], None, None, False),
        ("TopicA", b"x", None, deque(["k"]), None, None, False),
        ("TopicA", b"x", None, None, {"a": 1}, None, False),
        # a put's properties are written in the pass that checks their types: a wrong one
        # after one written, after one the one-pass encoder leaves to the checked pass,
        # and before a refusal (an empty topic) that a later step would find
        ("TopicA", b"x", None, None, {"a": "b", "c": 1}, None, False),
        ("TopicA", b"x", None, None, {"a": "b", 2: "c"}, None, False),
        ("TopicA", b"x", None, None, {"\u00fc": "b", "c": None}, None, False),
        ("TopicA", b"x", None, None, {Topic("a"): "b", "c": 1}, None, False),
        ("", b"x", "t", "k", {"a": "b", "c": b"d"}, None, False),
        ("TopicA", b"x", None, None, {"a": "b"}.items(), None, False),
        ("TopicA", b"x", None, None, None, True, False),
        ("TopicA", b"x", None, None, None, "1", False),
        ("TopicA", b"x", None, None, None, None, 1),
        ("TopicA", b"x", None, None, None, None, False, False, "3"),
        ("TopicA", b"x", None, None, None, None, False, False, True),
        ("TopicA", b"x", None, None, None, None, False, False, 1.0),
        ("TopicA", memoryview(b"abcd")[::2], None, None, None, None, False),
    ):
        assert p.app.put_message(*args) is None, args
    for batch in (
        [{"topic": "t", "body": b"x", "keys": 5}], [("t", b"x")], ({"topic": "t"},),
        [{"topic": "t", "body": b"x", "delay_level": "1"}],
    ):  # fmt: skip
        assert p.app.put_batch_messages(batch, False) is None, batch
    assert p.cb.get(c.OFF_SEQ) == 0 and not p.lanes


def test_a_born_address_hook_answer_of_neither_4_nor_16_bytes_is_a_value_error(
    put: Callable[..., Put],
) -> None:
    """The born address from the client's `message_fields` hook is copied into the record
    as 4 (IPv4) or 16 (IPv6) bytes: any other length raises ValueError, nothing written
    (the C put read 4 bytes of a 0-3 byte address: past the end of its bytes object)."""
    for addr in (b"", b"\x7f", b"\x7f\x00", b"\x7f\x00\x00", b"\x7f\x00\x00\x01\x00", bytes(17)):
        p = put(message_fields=lambda _i, _m, a=addr: (a, 1, 0, 0, 0, -1, 0))
        msg = Message("TopicA", b"x", {}, store_host=STORE_HOST)
        with pytest.raises(ValueError) as e:
            p.app.put_batch_messages([msg], False)
        assert str(e.value) == (
            f"message_fields: the born address must be 4 (IPv4) or 16 (IPv6) bytes, not {len(addr)}"
        )
        assert p.cb.get(c.OFF_SEQ) == 0, addr
    for addr in (b"\x7f\x00\x00\x01", bytes(16)):  # the two lengths a host has
        p = put(message_fields=lambda _i, _m, a=addr: (a, 1, 0, 0, 0, -1, 0))
        msg = Message("TopicA", b"x", {}, store_host=STORE_HOST)
        (r,) = p.app.put_batch_messages([msg], False)
        assert r.status is OK, r


def test_a_batch_dict_is_read_alike_whatever_its_keys_are(put: Callable[..., Put]) -> None:
    """Keys equal to the field names but other objects (not the interned names a literal
    has) give the same record; unknown and missing fields are refused by name."""
    literal = {"topic": "TopicA", "body": b"ab", "tags": "TagA", "keys": "k1", "queue_id": 2}
    built = {"".join(list(k)): v for k, v in literal.items()}
    sizes = {put().app.put_batch_messages([m], False)[0].size for m in (literal, built)}
    assert len(sizes) == 1
    for bad, reason in (
        ({**literal, "extra": 1, "b": 2}, "unknown fields ['b', 'extra']"),
        ({"topic": "TopicA"}, "missing field 'body'"),
        ({"body": b"x"}, "missing field 'topic'"),
    ):
        (r,) = put().app.put_batch_messages([bad], False)
        assert (r.status, r.reason) == (
            PutMessageStatus.MESSAGE_ILLEGAL,
            f"message 0 of the batch: {reason}",
        )


def test_a_put_that_does_not_fit_the_segment_rolls_with_a_blank(put: Callable[..., Put]) -> None:
    p = put()
    p.cb.set(c.OFF_RESERVED, SEG - 100)
    r = p.app.put_message("TopicA", b"x" * 200, None, None, None, 0, False)
    assert r.status is OK and r.physical_offset == SEG
    assert p.cb.pool_buf is not None
    assert bytes(p.cb.pool_buf[SEG - 100 : SEG - 92]) == struct.pack(
        ">iI", 100, record.BLANK_MAGIC_CODE
    )
    # one reservation: the record's slot is joined to the BLANK's (all or nothing)
    assert [p.cb.slot_state(s) for s in (0, 1)] == [c.STATE_DONE, c.STATE_DONE | c.STATE_JOINED]
    assert p.cb.slot(0)[5] == -1  # the BLANK's slot takes no queue offset
    assert p.cb.get(c.OFF_SEQ) == p.cb.get(c.OFF_PUBLISHED_SEQ) == 2
    assert p.cb.get(c.OFF_PUBLISHED) == SEG + r.size


@pytest.mark.parametrize(
    ("setup", "status", "reason"),
    [
        (lambda cb: cb.set(c.OFF_ALLOCATED, 0), "CREATE_MAPPED_FILE_FAILED",
         "the allocator did not have the next segment file ready in 50 ms"),
        (lambda cb: cb.set(c.OFF_SEQ, 64), "OS_PAGECACHE_BUSY",
         "no free reservation slot within 50 ms"),
        (lambda cb: cb.set(c.OFF_RESERVED, 2 * SEG), "OS_PAGECACHE_BUSY",
         "no free write-pool buffer within 50 ms"),
        (lambda cb: Flags(cb).mark_read_only(), "SERVICE_NOT_AVAILABLE",
         "the store is read-only after a failed fsync"),
        (lambda cb: cb.set(c.OFF_FLAGS, 0), "SERVICE_NOT_AVAILABLE",
         "the store is stopping or not running; writes are refused"),
        (lambda cb: cb.set(c.OFF_RESERVED, -4096), "SERVICE_NOT_AVAILABLE",
         "the control block's positions are out of range"),
        (lambda cb: cb.set(c.OFF_DISK_STATE, 1 | 950 << 16), "SERVICE_NOT_AVAILABLE",
         "the disk is full (95.0% used); writes resume by themselves once the cleaner has "
         "freed space"),
    ],
)  # fmt: skip
def test_a_reservation_without_room_waits_then_says_why(
    put: Callable[..., Put], setup: Callable[[c.ControlBlock], None], status: str, reason: str
) -> None:
    p = put()
    setup(p.cb)
    reserved, seq = p.cb.get(c.OFF_RESERVED), p.cb.get(c.OFF_SEQ)
    busy = p.cb.get(c.OFF_BUSY)
    t0 = time.monotonic()
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    waited = time.monotonic() - t0
    assert (r.status.name, r.reason) == (status, reason)
    assert (p.cb.get(c.OFF_RESERVED), p.cb.get(c.OFF_SEQ)) == (reserved, seq)
    if reason.endswith("50 ms"):  # a wait for room: counted, and as long as the busy timeout
        assert waited >= 0.045 and p.cb.get(c.OFF_BUSY) == busy + 1


def test_a_sync_put_whose_generation_ends_before_its_flush_is_never_ok(
    put: Callable[..., Put],
) -> None:
    """The fenced wait (outcome 3): the put is published, then its generation is fenced
    and stopped with nothing flushed; it answers at once FLUSH_DISK_TIMEOUT naming the
    generation, never PUT_OK (its record may be in the log)."""
    p = put(sync=True, sync_timeout_ns=60 * 10**9)

    def end_generation() -> None:
        deadline = time.monotonic() + 30
        while p.cb.get(c.OFF_SYNC_REQUEST) <= 0 and time.monotonic() < deadline:
            time.sleep(0.001)  # until the put waits for its flush
        fence(p.cb)
        p.cb.set(c.OFF_FLAGS, p.cb.get(c.OFF_FLAGS) | c.FLAG_STOPPED)
        _native.flushed_wake_all(p.cb.buf)

    ender = threading.Thread(target=end_generation)
    ender.start()
    t0 = time.monotonic()
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, True)
    ender.join()
    assert p.cb.get(c.OFF_PUBLISHED_SEQ) == 1 and p.cb.get(c.OFF_FLUSHED) == 0
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT, r
    assert f"generation {p.cb.generation} is over" in r.reason, r
    assert time.monotonic() - t0 < 30  # at the fence, not at the 60 s timeout


_NS = st.integers(0, 2**62)


@SETTINGS
@given(
    bound=st.integers(-2, 1 << 30),
    grace=st.integers(0, 2**40),
    looks=st.lists(
        st.tuples(st.integers(0, 1 << 31), st.integers(0, 2**36), st.integers(-1, 1 << 31)),
        max_size=40,
    ),
    since=st.one_of(st.just(0), _NS),
)
def test_the_backlog_rule_matches_its_reference(
    bound: int, grace: int, looks: list[tuple[int, int, int]], since: int
) -> None:
    """C `mqs_backlog_full` against `backlog_reference`, look after look of one producer
    (backlog, time moving on, the committer's drain bytes changing), the state carried
    from each look to the next."""
    c_since, ref_since, now = since, since, since
    for backlog, step, drain in looks:
        now += step
        at = now if backlog >= bound else 0  # the C reserve reads the clock only then
        got = _native.backlog_full(c_since, backlog, bound, grace, drain, at)
        want = backlog_reference(ref_since, backlog, bound, grace, drain, at)
        assert got == want, (backlog, bound, grace, drain, at, c_since)
        c_since, ref_since = got[1], want[1]


def test_the_backlog_rule_waits_after_the_grace_until_under_half() -> None:
    """The rule's story: a burst under the grace goes on; once the grace has passed it
    waits at the bound, goes on under it, and forgets the grace only under half."""
    full, bound, grace = _native.backlog_full, 1000, 50
    assert full(0, 999, bound, grace, 0, 0) == (False, 0)
    assert full(0, 1000, bound, grace, 0, 100) == (False, 100)  # seen at the bound: noted
    assert full(100, 2000, bound, grace, 0, 149) == (False, 100)  # still within the grace
    assert full(100, 2000, bound, grace, 0, 150) == (True, 100)  # the grace is over: wait
    assert full(100, 700, bound, grace, 0, 0) == (False, 100)  # under the bound: go on
    assert full(100, 1000, bound, grace, 0, 151) == (True, 100)  # at it again: no new grace
    assert full(100, 499, bound, grace, 0, 0) == (False, 0)  # under half: caught up
    assert full(0, 10**9, 0, 0, 0, 5) == (False, 0)  # no bound
    assert full(0, 1, 1, 0, 0, 7) == (True, 7)  # a 1-byte bound, no grace: waits at once


def test_the_drain_bound_waits_whatever_the_grace() -> None:
    """The committer's drain bytes bound the backlog with no grace: within the grace a
    burst goes on only up to them, and under the fixed bound too when they are smaller
    (a slowed committer); 0 (not measured, or commit_backlog_drain_ms 0) changes nothing."""
    full, bound, grace = _native.backlog_full, 1000, 50
    assert full(0, 1500, bound, grace, 2000, 100) == (False, 100)  # in the grace, under it
    assert full(100, 2000, bound, grace, 2000, 120) == (True, 100)  # in the grace, at it
    assert full(100, 1999, bound, grace, 2000, 121) == (False, 100)  # back under: go on
    assert full(0, 600, bound, grace, 600, 0) == (True, 0)  # slow committer: under the bound
    assert full(0, 400, bound, grace, 600, 0) == (False, 0)
    assert full(0, 2000, bound, grace, 0, 100) == (False, 100)  # no drain bytes: the grace
    assert full(0, 10**9, 0, 0, 600, 5) == (False, 0)  # no bound at all: none either


def test_a_put_waits_for_the_commit_backlog_then_says_why(put: Callable[..., Put]) -> None:
    """Pool on, bound 64 KiB, no grace: a put whose start is 64 KiB or more past the
    committed position waits the busy timeout, counted, and is OS_PAGECACHE_BUSY naming the
    bound, with nothing reserved; once the committer's position comes within the bound
    the same put goes through, even one larger than the bound."""
    p = put(backlog_bytes=65536, backlog_grace_ns=0)
    p.cb.set(c.OFF_RESERVED, 65536)
    busy = p.cb.get(c.OFF_BUSY)
    t0 = time.monotonic()
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    waited = time.monotonic() - t0
    assert (r.status, r.reason) == (
        PutMessageStatus.OS_PAGECACHE_BUSY,
        "the commit backlog stayed at its bound (commit_backlog_max_bytes, 65536 bytes) and "
        "the committer did not move for 50 ms",
    )
    assert waited >= 0.045 and p.cb.get(c.OFF_BUSY) == busy + 1
    assert (p.cb.get(c.OFF_RESERVED), p.cb.get(c.OFF_SEQ)) == (65536, 0)
    p.cb.set(c.OFF_COMMITTED, 1)  # 65535 behind: under the bound
    r = p.app.put_message("TopicA", b"y" * MAX_BODY, None, None, None, 0, False)
    assert r.status is OK and r.physical_offset == 65536, r
    assert p.cb.get(c.OFF_RESERVED) - p.cb.get(c.OFF_COMMITTED) > 65536  # a put may pass it


def test_a_put_waits_at_the_committers_drain_bytes_within_the_grace(
    put: Callable[..., Put],
) -> None:
    """Pool on, bound 1 MiB with a long grace: a put 8 KiB past the committed position
    waits once the committer's published drain bytes (here 8 KiB) say it cannot work that
    off in time, and is OS_PAGECACHE_BUSY naming both bounds when the committer does not
    move; with the word back at 0 the same put goes through within the grace."""
    p = put(backlog_bytes=1 << 20, backlog_grace_ns=10**12)
    p.cb.set(c.OFF_RESERVED, 8192)
    p.cb.set(c.OFF_COMMIT_DRAIN, 8192)
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    assert (r.status, r.reason) == (
        PutMessageStatus.OS_PAGECACHE_BUSY,
        "the commit backlog stayed at its bound (commit_backlog_max_bytes, 1048576 bytes, or "
        "commit_backlog_drain_ms of the committer's recent pace, 8192 bytes) and the "
        "committer did not move for 50 ms",
    )
    assert (p.cb.get(c.OFF_RESERVED), p.cb.get(c.OFF_SEQ)) == (8192, 0)
    p.cb.set(c.OFF_COMMIT_DRAIN, 0)
    r = p.app.put_message("TopicA", b"y", None, None, None, 0, False)
    assert r.status is OK and r.physical_offset == 8192, r


def test_a_put_waiting_on_the_backlog_goes_on_when_the_commit_moves(
    put: Callable[..., Put],
) -> None:
    p = put(backlog_bytes=4096, backlog_grace_ns=0, busy_ns=30 * 10**9)
    p.cb.set(c.OFF_RESERVED, 8192)
    committer = threading.Timer(0.1, lambda: p.cb.set(c.OFF_COMMITTED, 8192))
    committer.start()
    t0 = time.monotonic()
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    committer.join()
    assert r.status is OK and r.physical_offset == 8192, r
    assert 0.09 <= time.monotonic() - t0 < 20


def test_a_backlog_wait_goes_on_while_the_committer_moves_up_to_the_cap(
    put: Callable[..., Put],
) -> None:
    """Flow control is not a fault: a committer that moves, however slowly, keeps the put
    waiting past the busy timeout (0.4 s here) until the backlog is under the bound (here,
    after 1 s); one that never brings it under is refused at the sync flush timeout's cap
    (2 s here), saying it moved.

    The committer steps every 20 ms; the busy timeout is 20 steps, so only a committer
    thread left unscheduled for 0.4 s makes the put see one that stood still. (With the
    default 50 ms, 2.5 steps, 6 spinners on the 2 cores failed it 1 run in 10.)"""
    busy_s, cap_s = 0.4, 2.0
    p = put(backlog_bytes=4096, backlog_grace_ns=0, busy_ns=int(busy_s * 1e9),
            sync_timeout_ns=int(cap_s * 1e9))  # fmt: skip
    p.cb.set(c.OFF_RESERVED, 1 << 20)
    stop = threading.Event()

    def committer(until: float, upto: int) -> None:
        com = 0
        while not stop.is_set() and time.monotonic() < until:
            com += 1  # a step every 20 ms: never under the bound before `until`
            p.cb.set(c.OFF_COMMITTED, com)
            time.sleep(0.02)
        if not stop.is_set():
            p.cb.set(c.OFF_COMMITTED, upto)

    t = threading.Thread(target=committer, args=(time.monotonic() + 2.5 * busy_s, 1 << 20))
    t0 = time.monotonic()
    t.start()
    try:
        r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    finally:
        stop.set()
        t.join()
    assert r.status is OK and r.physical_offset == 1 << 20, r
    assert time.monotonic() - t0 >= 2.4 * busy_s  # well past the busy timeout
    stop.clear()
    p.cb.set(c.OFF_COMMITTED, 0)
    t = threading.Thread(target=committer, args=(time.monotonic() + 60, 0))
    t0 = time.monotonic()
    t.start()
    try:
        r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    finally:
        stop.set()
        t.join()
    took = time.monotonic() - t0
    assert (r.status, r.reason) == (
        PutMessageStatus.OS_PAGECACHE_BUSY,
        "the commit backlog did not come under its bound (commit_backlog_max_bytes, 4096 "
        "bytes) within 2000 ms (the longer of syncFlushTimeout and "
        "osPageCacheBusyTimeOutMills), though the committer moved",
    )
    assert cap_s - 0.05 <= took < 30, took


def test_a_backlog_burst_within_the_grace_is_not_held_back(put: Callable[..., Put]) -> None:
    p = put(backlog_bytes=4096, backlog_grace_ns=3600 * 10**9)
    p.cb.set(c.OFF_RESERVED, 8192)
    rs = [p.app.put_message("TopicA", b"x" * 100, None, None, None, 0, False) for _ in range(50)]
    assert all(r.status is OK for r in rs)
    assert p.cb.get(c.OFF_COMMITTED) == 0


def test_the_backlog_bound_is_refused_negative(put: Callable[..., Put]) -> None:
    p = put()
    why = "backlog_bytes (0: no bound) and backlog_grace_ns must be >= 0"
    for kw in ({"backlog_bytes": -1}, {"backlog_grace_ns": -1}):
        with pytest.raises(ValueError) as e:
            p.app.configure(**{**p.config, **kw})
        assert str(e.value) == why


def test_fast_fail_refuses_at_once_without_a_pool_buffer(put: Callable[..., Put]) -> None:
    p = put(fast_fail=True)
    p.cb.set(c.OFF_RESERVED, 2 * SEG)
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    assert (r.status, r.reason) == (PutMessageStatus.OS_PAGECACHE_BUSY, "no free write-pool buffer")


def test_a_wait_for_the_next_file_ends_when_it_is_made(put: Callable[..., Put]) -> None:
    p = put(busy_ns=5 * 10**9)
    p.cb.set(c.OFF_ALLOCATED, 0)
    allocator = threading.Timer(0.05, lambda: p.cb.set(c.OFF_ALLOCATED, 64 * SEG))
    allocator.start()
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    allocator.join()
    assert r.status is OK and r.physical_offset == 0


def test_a_full_queue_table_is_refused(put: Callable[..., Put]) -> None:
    p = put(find_row=lambda _topic, _qid: -1)
    r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
    assert (r.status, r.reason) == (
        PutMessageStatus.SERVICE_NOT_AVAILABLE,
        "the queue table of the control block is full",
    )
    assert p.cb.get(c.OFF_SEQ) == 0


@pytest.fixture
def cb_no_pool(tmp_path: Path) -> Iterator[c.ControlBlock]:
    geo = c.Geometry(segment_size=SEG, pool_buffers=0, slot_count=64, qtable_capacity=256)
    block = c.ControlBlock.create(tmp_path, 1, geo, token=secrets.token_hex(4))
    block.set(c.OFF_FLAGS, c.FLAG_RUNNING)
    block.set(c.OFF_ALLOCATED, 64 * SEG)
    try:
        yield block
    finally:
        block.close()


def test_pool_off_writes_into_the_segments_mapping(cb_no_pool: c.ControlBlock) -> None:
    """The records go into the mapping the client makes per segment (`map_segment`), the
    BLANK of a roll into the one before; a mapping that fails after the reservation
    hands its slots to the committer's filler (ABANDONED) and raises."""
    segments: dict[int, mmap.mmap] = {}

    def map_segment(index: int) -> mmap.mmap:
        if index == 3:
            raise KeyboardInterrupt
        return segments.setdefault(index, mmap.mmap(-1, SEG))

    p = Put(cb_no_pool, map_segment=map_segment)
    try:
        cb_no_pool.set(c.OFF_RESERVED, SEG - 50)
        r = p.app.put_message("TopicA", b"y" * 100, None, None, None, 0, False)
        assert r.status is OK and r.physical_offset == SEG
        assert bytes(segments[0][SEG - 50 : SEG - 42]) == struct.pack(
            ">iI", 50, record.BLANK_MAGIC_CODE
        )
        assert bytes(segments[1][: r.size]) == record_bytes(
            Message("TopicA", b"y" * 100, store_host=STORE_HOST,
                    born_timestamp=struct.unpack_from(">q", segments[1], 40)[0]),
            0, SEG, r.store_timestamp,
        )  # fmt: skip
        cb_no_pool.set(c.OFF_RESERVED, 3 * SEG)
        seq = cb_no_pool.get(c.OFF_SEQ)
        with pytest.raises(KeyboardInterrupt):
            p.app.put_message("TopicA", b"z", None, None, None, 0, False)
        assert cb_no_pool.slot_state(seq) == c.STATE_ABANDONED
    finally:
        p.app.close()
        for m in segments.values():
            m.close()


def test_pool_off_has_no_backlog_to_bound(cb_no_pool: c.ControlBlock) -> None:
    """Without a pool producers write the files: nothing trails them, so a bound given to
    a pool-off appender is not applied (committed stays 0 here, far behind)."""
    segments: dict[int, mmap.mmap] = {}
    p = Put(
        cb_no_pool, map_segment=lambda i: segments.setdefault(i, mmap.mmap(-1, SEG)),
        backlog_bytes=1, backlog_grace_ns=0,
    )  # fmt: skip
    try:
        cb_no_pool.set(c.OFF_RESERVED, 4096)
        r = p.app.put_message("TopicA", b"x", None, None, None, 0, False)
        assert r.status is OK and r.physical_offset == 4096, r
    finally:
        p.app.close()
        for m in segments.values():
            m.close()


def test_put_message_leaves_the_put_when_the_client_must_check_first(
    put: Callable[..., Put],
) -> None:
    p = put()
    p.app.checked(0)  # the check is due: the client's Python side runs it
    assert p.app.put_message("TopicA", b"x", None, None, None, None, False) is None
    assert type(p.app.put_message("TopicA", b"x", None, None, None, None, False, True)) is PutResult
    p.app.checked(10**12)
    assert type(p.app.put_message("TopicA", b"x", None, None, None, None, False)) is PutResult


def test_put_message_counts_into_the_statistics_row(put: Callable[..., Put]) -> None:
    p = put()
    for _ in range(300):  # past one copy into the control block (every 256)
        assert p.app.put_message("TopicA", b"xy", None, "k", None, 1, False).status is OK
    row = p.cb.client_row(0)
    assert row[c.CF_PUTS] == 256 and row[c.CF_STATUS] == 256
    assert row[c.CF_BYTES] == 256 * p.cb.slot(0)[3]


def _phase(p: Put, name: str) -> tuple[int, int]:
    """(puts counted, ns summed) of a phase in the client's own statistics row."""
    base = c.CF_PHASES + c.PHASES.index(name) * c.PHASE_FIELDS
    row = p.config["stats"]
    return sum(row[base : base + c.PHASE_BUCKETS]), row[base + c.PHASE_BUCKETS]


def test_lock_wait_is_the_time_waited_for_the_lock_or_room(put: Callable[..., Put]) -> None:
    """The lock_wait phase counts every put; it sums only what a put waited: 0 for a lock
    taken at once (no clock read for it), the wait for a held lock or for room (how long
    exactly depends on when the waiter ran: only more than nothing is asserted)."""
    p = put(busy_ns=5 * 10**9)
    assert p.app.put_message("TopicA", b"x", None, None, None, 0, False).status is OK
    assert _phase(p, "lock_wait") == (1, 0)
    assert _phase(p, "append")[0] == 1 and _phase(p, "append")[1] > 0
    holder = _native.Appender(p.cb.buf, p.cb.pool_buf, os.getpid())
    taken = threading.Event()

    def hold() -> None:  # in its own thread: the mutex is the holder thread's to unlock
        assert holder.lock(0) == 0
        taken.set()
        time.sleep(0.05)
        holder.unlock()

    t = threading.Thread(target=hold)
    try:
        t.start()
        assert taken.wait(30)
        t0 = time.monotonic_ns()
        assert p.app.put_message("TopicA", b"x", None, None, None, 0, False).status is OK
        took = time.monotonic_ns() - t0
    finally:
        t.join()
        holder.close()
    count, waited = _phase(p, "lock_wait")
    assert count == 2 and 0 < waited <= took
    p.cb.set(c.OFF_ALLOCATED, p.cb.get(c.OFF_RESERVED))  # no room until the next file
    allocator = threading.Timer(0.05, lambda: p.cb.set(c.OFF_ALLOCATED, 64 * SEG))
    allocator.start()
    assert p.app.put_message("TopicA", b"x", None, None, None, 0, False).status is OK
    allocator.join()
    count, waited_too = _phase(p, "lock_wait")
    assert count == 3 and waited_too > waited


def test_put_lock_is_a_lock() -> None:
    lock = _native.PutLock()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()


def test_put_lock_makes_another_thread_wait_until_it_is_released() -> None:
    lock = _native.PutLock()
    lock.acquire()
    started, got = threading.Event(), threading.Event()

    def take() -> None:
        started.set()
        with lock:
            got.set()

    t = threading.Thread(target=take)
    t.start()
    assert started.wait(10)
    assert not got.wait(0.2)  # held: the other thread waits in acquire
    lock.release()
    assert got.wait(10)
    t.join()
    assert not lock.locked()


# --- publish: C against the Python twin -------------------------------------------------

SLOTS = 16


@settings(max_examples=300, deadline=None)
@given(
    published=st.integers(0, 40),
    states=st.lists(
        st.tuples(
            st.sampled_from([c.STATE_RESERVED, c.STATE_DONE, c.STATE_ABANDONED, c.STATE_FILLING]),
            st.sampled_from([0, c.STATE_JOINED]),
        ).map(lambda t: t[0] | t[1]),
        min_size=0,
        max_size=SLOTS,
    ),
    sizes=st.lists(st.integers(1, 5000), min_size=SLOTS, max_size=SLOTS),
    fence=st.one_of(st.just(0), st.integers(1, 60)),
    idle=st.tuples(st.integers(0, 1), st.sampled_from([0, 7, 0xFFFFFFFF])),
)
def test_publish_matches_its_python_twin(
    published: int, states: list[int], sizes: list[int], fence: int, idle: tuple[int, int]
) -> None:
    """Joined slots publish like any DONE one, and nothing at or past the fence; a
    publish that moved wakes the idle workers that said they sleep, once."""
    buf = bytearray(c.SLOTS_OFF + SLOTS * c.SLOT_ROW)
    struct.pack_into("<q", buf, c.OFF_SLOT_COUNT, SLOTS)
    struct.pack_into("<q", buf, c.OFF_FENCE_SEQ, fence)
    struct.pack_into("<II", buf, c.OFF_IDLE_WAKE, idle[1], idle[0])
    at = 1000 * published
    struct.pack_into("<qq", buf, c.OFF_PUBLISHED, at, published)
    struct.pack_into("<q", buf, c.OFF_SEQ, published + len(states))
    for i, state in enumerate(states):
        seq = published + i
        c.SLOT.pack_into(
            buf, c.SLOTS_OFF + (seq % SLOTS) * c.SLOT_ROW,
            at, seq, 7 + seq, sizes[i], 1, 0, state,
        )  # fmt: skip
        at += sizes[i]
    twin = bytearray(buf)
    assert _native.publish(buf) == publish_reference(twin)
    assert buf == twin


def test_a_delayed_put_goes_to_its_levels_schedule_queue(put: Callable[..., Put]) -> None:
    """RocketMQ's delay rewrite: SCHEDULE_TOPIC_XXXX queue level-1, DELAY / REAL_TOPIC /
    REAL_QID after the caller's properties, TAGS and KEYS; a level past the last is the
    last; the real topic's round robin still chooses REAL_QID."""
    p = put()
    r = p.app.put_message("TopicA", b"x", "TagA", "k1", {"a": "b"}, 2, False, False, 3)
    assert (r.status, r.queue_id) == (OK, 2)
    assert p.cb.pool_buf is not None
    raw = bytes(p.cb.pool_buf[r.physical_offset : r.physical_offset + r.size])
    got = record.decode(raw, 0)
    assert (got.topic, got.queue_id) == (SCHEDULE_TOPIC, 2)
    assert list(got.properties.items()) == [
        ("a", "b"), ("TAGS", "TagA"), ("KEYS", "k1"),
        ("DELAY", "3"), ("REAL_TOPIC", "TopicA"), ("REAL_QID", "2"),
    ]  # fmt: skip
    r = p.app.put_message("TopicA", b"x", None, None, None, None, False, False, 99)
    assert (r.status, r.queue_id) == (PutMessageStatus.MESSAGE_ILLEGAL, 0)
    assert r.reason == "delay level 6 needs queue 5 of SCHEDULE_TOPIC_XXXX, which has 5 queues"
    r = p.app.put_message("TopicA", b"x", None, None, None, 1, False, False, 5)
    raw = bytes(p.cb.pool_buf[r.physical_offset : r.physical_offset + r.size])
    assert record.decode(raw, 0).properties["REAL_QID"] == "1" and r.queue_id == 4
