"""The C put of one message (`Appender.put_message`) against its references, over a real
control block: the record bytes equal `engine.record.encode`'s, it refuses (None, nothing
written) exactly what the client's general path refuses, and its lock-free publish moves
the published position as the Python twin (`ipc.reservation.publish_reference`) does.
These run under ASan/UBSan too (`make sanitize`)."""

from __future__ import annotations

import array
import os
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import record
from mqstore.engine.record import Message
from mqstore.ipc import control as c
from mqstore.ipc.reservation import publish_reference
from mqstore.ipc.results import PutMessageStatus, PutResult
from tests.native.test_append import expected

QUEUES = 4
MAX_BODY = 4096
PREFIX = "7F00000100002A9F"
TOPICS = ("TopicA", "t-2")
KNOWN_TAGS = (None, "TagA", "ü tag")
OK = PutMessageStatus.PUT_OK


def fresh(cb: c.ControlBlock) -> tuple[dict[str, list[Any]], _native.Appender]:
    """The log started over (each example on its own), lanes and a configured appender."""
    for off in (c.OFF_RESERVED, c.OFF_SEQ, c.OFF_PUBLISHED_SEQ):
        cb.set(off, 0)
    lanes = lanes_of(cb)
    return lanes, appender(cb, lanes)


def lanes_of(cb: c.ControlBlock) -> dict[str, list[Any]]:
    """The lanes `StoreClient._warm` makes, for TOPICS and KNOWN_TAGS."""
    out: dict[str, list[Any]] = {}
    for topic in TOPICS:
        tb = topic.encode()
        qslots = [cb.find_or_add_queue(tb, q) for q in range(QUEUES)]
        heads = {
            t: record.encode_properties({record.PROPERTY_TAGS: t} if t else {}) for t in KNOWN_TAGS
        }
        out[topic] = [tb, QUEUES, QUEUES, 0, qslots, heads]
    return out


def appender(cb: c.ControlBlock, lanes: dict[str, list[Any]]) -> _native.Appender:
    app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
    app.configure(
        lock=_native.PutLock(),
        lanes=lanes,
        stats=array.array("q", bytes(8 * c.CLIENT_FIELDS)),
        stats_off=cb.client_off(0),
        result_type=PutResult,
        outcomes=(
            (OK, 0, ""),
            (PutMessageStatus.FLUSH_DISK_TIMEOUT, 1, "timed out"),
            (PutMessageStatus.FLUSH_DISK_FAILED, 10, "failed"),
        ),
        msg_id_prefix=PREFIX,
        sync=False,
        sync_timeout_ns=10**9,
        busy_ns=10**8,
        max_body=MAX_BODY,
        store_addr=b"\x7f\x00\x00\x01",
        store_port=10911,
    )
    app.checked(10**12)
    return app


def refused(tags: str | None, keys: str | None, queue_id: int | None, body: bytes) -> bool:
    """Whether the client's general path refuses this put (or the C put leaves it to it:
    a tags value without a lane entry)."""
    props = {record.PROPERTY_TAGS: tags} if tags is not None else {}
    if keys is not None:
        props[record.PROPERTY_KEYS] = keys
    if tags not in KNOWN_TAGS or record.properties_problem(props) or len(body) > MAX_BODY:
        return True
    try:
        if len(record.encode_properties(props)) > record.MAX_PROPERTIES_BYTES:
            return True
    except UnicodeError:
        return True
    return queue_id is not None and not 0 <= queue_id < QUEUES


@settings(
    max_examples=300, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(
    topic=st.sampled_from(TOPICS),
    body=st.binary(max_size=MAX_BODY + 2),
    tags=st.none() | st.sampled_from(KNOWN_TAGS[1:]) | st.text(max_size=8),
    keys=st.none() | st.text(max_size=40) | st.integers(32000, 33000).map(lambda n: "k" * n),
    queue_id=st.none() | st.integers(-2, QUEUES + 1) | st.just(2**70),
)
def test_put_message_writes_the_reference_bytes_or_leaves_the_put(
    cb: c.ControlBlock,
    topic: str,
    body: bytes,
    tags: str | None,
    keys: str | None,
    queue_id: int | None,
) -> None:
    lanes, app = fresh(cb)
    try:
        got = app.put_message(topic, body, tags, keys, None, queue_id, False)
        if refused(tags, keys, queue_id, body):
            assert got is None
            assert cb.get(c.OFF_SEQ) == 0 and lanes[topic][3] == 0
            return
        assert type(got) is PutResult and got.status is OK, got
        assert got.queue_id == (0 if queue_id is None else queue_id)
        assert lanes[topic][3] == (1 if queue_id is None else 0)  # the round-robin counter
        assert got.msg_id == f"{PREFIX}{got.physical_offset:016X}"
        assert cb.pool_buf is not None
        raw = bytes(cb.pool_buf[got.physical_offset : got.physical_offset + got.size])
        assert raw == reference_bytes(topic, body, tags, keys, got, raw)
        assert cb.get(c.OFF_PUBLISHED_SEQ) == 1  # the producer published its own slot
        assert cb.get(c.OFF_PUBLISHED) >= got.physical_offset + got.size
    finally:
        app.close()


def reference_bytes(
    topic: str, body: bytes, tags: str | None, keys: str | None, got: PutResult, raw: bytes
) -> bytes:
    """The reference encoder's record for a put the C call made (its born time read back)."""
    (born,) = struct.unpack_from(">q", raw, 40)
    props = {record.PROPERTY_TAGS: tags} if tags is not None else {}
    if keys is not None:
        props[record.PROPERTY_KEYS] = keys
    msg = Message(
        topic, body, props, queue_id=got.queue_id, born_timestamp=born,
        store_host="127.0.0.1:10911",
    )  # fmt: skip
    return expected(msg, got.queue_offset, got.physical_offset, got.store_timestamp)


put_fields = st.fixed_dictionaries(
    {"topic": st.sampled_from(TOPICS), "body": st.binary(max_size=64)},
    optional={
        "tags": st.none() | st.sampled_from(KNOWN_TAGS[1:]) | st.text(max_size=4),
        "keys": st.none() | st.text(max_size=12),
        "queue_id": st.none() | st.integers(-1, QUEUES),
    },
)


@settings(
    max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(st.lists(put_fields, min_size=1, max_size=12))
def test_put_batch_messages_writes_the_reference_bytes_or_leaves_the_batch(
    cb: c.ControlBlock, msgs: list[dict[str, Any]]
) -> None:
    lanes, app = fresh(cb)
    next_before = {(t, q): cb.qrow(lanes[t][4][q])[2] for t in TOPICS for q in range(QUEUES)}
    try:
        got = app.put_batch_messages(msgs, False)
        fields = [(m.get("tags"), m.get("keys"), m.get("queue_id"), m["body"]) for m in msgs]
        if any(refused(*f) for f in fields):
            assert got is None  # all or nothing: the general path refuses the batch
            assert cb.get(c.OFF_SEQ) == 0 and all(lane[3] == 0 for lane in lanes.values())
            return
        assert type(got) is list and len(got) == len(msgs)
        assert cb.pool_buf is not None
        at = 0
        spread = dict.fromkeys(TOPICS, 0)
        for m, r in zip(msgs, got, strict=True):
            # Each queue's messages take its next offsets in batch order, without gaps.
            assert r.queue_offset == next_before[(m["topic"], r.queue_id)]
            next_before[(m["topic"], r.queue_id)] += 1
            assert r.status is OK and r.physical_offset == at
            if m.get("queue_id") is None:
                assert r.queue_id == spread[m["topic"]] % QUEUES
                spread[m["topic"]] += 1
            raw = bytes(cb.pool_buf[at : at + r.size])
            want = reference_bytes(m["topic"], m["body"], m.get("tags"), m.get("keys"), r, raw)
            assert raw == want
            at += r.size
        assert len({r.store_timestamp for r in got}) == 1
        assert cb.get(c.OFF_PUBLISHED_SEQ) == len(msgs)
        for (t, q), nxt in next_before.items():  # the queue rows written back
            assert cb.qrow(lanes[t][4][q])[2] == nxt
    finally:
        app.close()


def test_put_message_leaves_unusual_types_to_the_general_path(cb: c.ControlBlock) -> None:
    app = appender(cb, lanes_of(cb))
    try:
        for args in (
            ("TopicA", bytearray(b"x"), None, None, None, None, False),
            ("TopicA", b"x", None, ["k"], None, None, False),
            ("TopicA", b"x", None, None, {"a": "b"}, None, False),
            ("TopicA", b"x", None, None, None, True, False),
            ("TopicA", b"x", None, None, None, None, 1),
            ("Unknown", b"x", None, None, None, None, False),
        ):
            assert app.put_message(*args) is None, args
        assert cb.get(c.OFF_SEQ) == 0
    finally:
        app.close()


def test_put_batch_messages_reads_any_dict_keys_alike(cb: c.ControlBlock) -> None:
    """Keys equal to the field names but other objects (not the interned names a literal
    has: the one-pass read does not apply) give the same records; an unknown key or a
    missing body leaves the batch to the general path, nothing written."""

    def fresh_key(name: str) -> str:
        k = "".join(list(name))
        assert k == name and k is not name
        return k

    literal = [{"topic": "TopicA", "body": b"ab", "tags": "TagA", "keys": "k1", "queue_id": 2}]
    built = [{fresh_key(k): v for k, v in m.items()} for m in literal]
    records = []
    for msgs in (literal, built):
        _lanes, app = fresh(cb)
        try:
            got = app.put_batch_messages(msgs, False)
            assert type(got) is list and got[0].status is OK
            assert cb.pool_buf is not None
            raw = bytearray(cb.pool_buf[: got[0].size])
            raw[20:28] = bytes(8)  # the queue offset (the queue row is not reset)
            raw[40:48] = bytes(8)  # the born time
            raw[56:64] = bytes(8)  # the store time
            records.append((bytes(raw), got[0].queue_id))
        finally:
            app.close()
    assert records[0] == records[1]
    for bad in (
        [{**literal[0], "extra": 1}],
        [{fresh_key("extra"): 1, **literal[0]}],
        [{k: v for k, v in literal[0].items() if k != "body"}],
        [{**literal[0], "topic": None}],
    ):
        _lanes, app = fresh(cb)
        try:
            assert app.put_batch_messages(bad, False) is None, bad
            assert cb.get(c.OFF_SEQ) == 0
        finally:
            app.close()


def test_put_message_leaves_the_put_when_the_client_must_check_first(cb: c.ControlBlock) -> None:
    app = appender(cb, lanes_of(cb))
    try:
        app.checked(0)  # the check is due: the client's Python path runs it
        assert app.put_message("TopicA", b"x", None, None, None, None, False) is None
        app.checked(10**12)
        assert type(app.put_message("TopicA", b"x", None, None, None, None, False)) is PutResult
    finally:
        app.close()


def test_put_message_counts_into_the_statistics_row(cb: c.ControlBlock) -> None:
    lanes = lanes_of(cb)
    app = appender(cb, lanes)
    try:
        for _ in range(300):  # past one copy into the control block (every 256)
            assert type(app.put_message("TopicA", b"xy", None, "k", None, 1, False)) is PutResult
        row = cb.client_row(0)
        assert row[c.CF_PUTS] == 256 and row[c.CF_STATUS] == 256
        assert row[c.CF_BYTES] == 256 * cb.slot(0)[3]
    finally:
        app.close()


def test_put_lock_is_a_lock() -> None:
    lock = _native.PutLock()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()


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
)
def test_publish_matches_its_python_twin(
    published: int, states: list[int], sizes: list[int], fence: int
) -> None:
    """Joined slots publish like any DONE one, and nothing at or past the fence."""
    buf = bytearray(c.SLOTS_OFF + SLOTS * c.SLOT_ROW)
    struct.pack_into("<q", buf, c.OFF_SLOT_COUNT, SLOTS)
    struct.pack_into("<q", buf, c.OFF_FENCE_SEQ, fence)
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
