"""What a put accepts (issue 14, items 3-6), through the real client attached to a real
running store: topic and group names (RocketMQ's rule), queue ids within the topic's
queues, message fields written as given (IPv6 hosts included) or refused, and wrong
Python types refused at the door with the parameter's name."""

from __future__ import annotations

import array
import asyncio
import dataclasses
import os
import subprocess
import sys
import types
from collections import UserDict, deque

import pytest

from mqstore import AsyncStoreClient, Message, PutMessageStatus, PutResult, StoreClient
from mqstore.engine import record
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.filler import filler_record
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for

ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
BAD_TOPICS = ["../escape", "a/b", "a b", "a\tb", "..", ".", "é", "t@x", "x" * 128]
BAD_GROUPS = ["../g", "a b", "a@b", "", "g" * 256]


def _mqstore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=60,
    )  # fmt: skip


def test_topic_and_group_names_outside_rocketmqs_rule_are_refused(store: Store) -> None:
    with StoreClient.attach(store.path) as client:
        for topic in BAD_TOPICS:
            r = client.put(topic, b"x", queue_id=0)
            assert r.status is ILLEGAL and "topic name" in r.reason, (topic, r)
            batch = client.put_batch([{"topic": "ok", "body": b"1"}, Message(topic, b"2")])
            assert {x.status for x in batch} == {ILLEGAL}, (topic, batch)
            assert "message 1 of the batch: topic name" in batch[0].reason
            for read in (
                lambda t: client.pull(t, 0, 0),
                lambda t: client.max_offset(t, 0),
                lambda t: client.query(t, "k"),
                lambda t: client.commit_offset("g", t, 0, 1),
                lambda t: client.committed_offset("g", t, 0),
            ):
                with pytest.raises(ValueError, match="topic name"):
                    read(topic)
        for group in BAD_GROUPS:
            with pytest.raises(ValueError, match="consumer group name"):
                client.commit_offset(group, "ok", 0, 1)
        assert client.positions()["reserved"] == 0  # nothing was written
        good = client.put("%RETRY%g|x_y-1", b"fine", queue_id=0)  # every allowed character
        assert good.ok, good
        wait_for(lambda: client.pull("%RETRY%g|x_y-1", 0, 0).found, 30, "the good put dispatched")

    async def aio() -> None:
        async with AsyncStoreClient.attach(store.path) as a:
            r = await a.put("a/b", b"x", queue_id=0)
            assert r.status is ILLEGAL and "topic name" in r.reason
            with pytest.raises(ValueError, match="topic name"):
                await a.pull("../escape", 0, 0)

    asyncio.run(aio())
    assert store.stop() == 0
    assert os.listdir(store.path / "consumequeue") == ["%RETRY%g|x_y-1"]
    assert [r.topic for r in store.read_log()] == ["%RETRY%g|x_y-1"]
    assert not (store.path / "escape").exists()


def test_cli_commands_refuse_bad_topic_and_group_names(store: Store) -> None:
    d = str(store.path)
    for args in (
        ("topic", d, "set", "a b", "--queues", "2"),
        ("topic", d, "set", "../escape", "--queues", "2"),
        ("get", d, "--topic", "a/b", "--queue", "0", "--offset", "0"),
        ("query", d, "--topic", "a\tb", "--key", "k"),
        ("tail", d, "--topic", "..", "--from-beginning"),
        ("tail", d, "--topic", "ok", "--group", "a@b"),
        ("pipeline", "query", d, "--topic", "a b"),
        ("demo", d, "--topic", "a/b"),
    ):
        out = _mqstore(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "name" in out.stderr and "not allowed" in out.stderr, (args, out.stderr)
    assert not (store.path / "config" / "topics.json").exists()


def test_queue_ids_outside_the_topics_queues_are_refused(store: Store) -> None:
    """A put to queue 70000, or to queue 4 of a 4-queue topic, was acknowledged and made
    `consumequeue/T/70000`, which no consumer reads and no topic config can name (the
    dispatcher could not register the topic after a restart)."""
    with StoreClient.attach(store.path, topic_queue_nums={"wide": 6}) as client:
        for qid in (4, 70000, 2**31 - 1, -1):
            r = client.put("T", b"x", queue_id=qid)
            assert r.status is ILLEGAL and "queues (0..3)" in r.reason, (qid, r)
            batch = client.put_batch([Message("T", b"x", queue_id=qid)])
            assert batch[0].status is ILLEGAL, (qid, batch)
        assert client.put("T", b"last", queue_id=3).ok
        # a client-side spread wider than the topic is refused too, not moved to another queue
        spread = [client.put("wide", b"x") for _ in range(6)]
        assert [r.status for r in spread] == [PutMessageStatus.PUT_OK] * 4 + [ILLEGAL] * 2
        assert "topic 'wide'" in spread[4].reason
        out = _mqstore("topic", str(store.path), "set", "T", "--queues", "8")
        assert out.returncode == 0, out.stderr
        wait_for(lambda: client.put("T", b"grown", queue_id=7).ok, 10, "queue 7 after set")
    assert store.stop() == 0
    assert sorted(os.listdir(store.path / "consumequeue" / "T")) == ["3", "7"]
    store.start()  # the dispatcher registers what it finds after a restart
    out = _mqstore("topic", str(store.path), "list")
    assert out.returncode == 0 and "cannot register" not in store.output(), store.output()
    assert [r.body for r in store.read_log() if r.topic == "T"] == [b"last", b"grown"]


def _stored_bytes(store: Store, r: PutResult) -> bytes:
    cl = CommitLog.open(
        store.path / "commitlog", store.config["segment_size_bytes"], read_only=True
    )
    try:
        return cl.read_bytes(r.physical_offset, r.size)
    finally:
        cl.close()


def _reference(m: Message, r: PutResult) -> bytes:
    """What engine.record's encoder writes for `m` at the place the put went to (with the
    UNIQ_KEY the put added last, unless `m` has one)."""
    if record.PROPERTY_UNIQ_KEY not in m.properties:
        assert len(r.uniq_key) == 32, r
        m = dataclasses.replace(
            m, properties={**m.properties, record.PROPERTY_UNIQ_KEY: r.uniq_key}
        )
    want = record.encode(m)
    assert want.status is record.EncodeStatus.OK, want
    buf = bytearray(len(want.data))
    record.patch_append_fields(buf, 0, want, r.queue_offset, r.physical_offset, r.store_timestamp)
    return bytes(buf)


@pytest.mark.parametrize("store_host", ["127.0.0.1:10911", "[fd00::7]:10911"])
def test_message_fields_are_written_as_given(make_store: StoreFactory, store_host: str) -> None:
    """born_host (IPv6 too), born_timestamp and sys_flag were replaced by 127.0.0.1:0, the
    current time and cleared host bits; a store with an IPv6 store_host refused attach."""
    st = make_store({"store_host": store_host})
    given = [
        Message("T", b"v6", {"a": "b"}, queue_id=1, born_host="[::1]:5555", born_timestamp=42),
        Message("T", b"v4", born_host="10.1.2.3:77", born_timestamp=43, flag=7,
                sys_flag=int(record.SysFlag.TRANSACTION_COMMIT), reconsume_times=2),
        Message("T", b"own store host", born_host="[::1]:1", store_host=store_host,
                born_timestamp=44, sys_flag=0x10 | (0x20 if "[" in store_host else 0)),
    ]  # fmt: skip
    with StoreClient.attach(st.path) as client:
        rs = client.put_batch(given)
        assert [r.status for r in rs] == [PutMessageStatus.PUT_OK] * 3, rs
        single = client.put("T", b"plain", queue_id=0)
        assert single.ok, single
        got = client.get_by_msg_id(single.msg_id)
        assert got is not None and got.body == b"plain" and got.store_host == store_host
    assert st.stop() == 0
    for m, r in zip(given, rs, strict=True):
        assert _stored_bytes(st, r) == _reference(dataclasses.replace(m, store_host=store_host), r)
    recs = {r.body: r for r in st.read_log()}
    assert recs[b"v6"].born_host == "[::1]:5555" and recs[b"v6"].born_timestamp == 42
    assert recs[b"v6"].sys_flag & 0x30 == (0x30 if "[" in store_host else 0x10)
    assert recs[b"v4"].born_host == "10.1.2.3:77" and recs[b"v4"].reconsume_times == 2
    plain = recs[b"plain"]
    assert plain.born_host == "127.0.0.1:0" and plain.store_host == store_host
    assert abs(plain.born_timestamp - plain.store_timestamp) < 60_000  # unset: now


def test_message_fields_that_cannot_be_written_as_given_are_refused(store: Store) -> None:
    refused = {
        "is not this store's": Message("T", b"x", store_host="10.9.9.9:10911"),
        "bad host": Message("T", b"x", born_host="nonsense"),
        "host bits": Message("T", b"x", sys_flag=0x10),  # IPv6 bit, IPv4 born host
        "flag": Message("T", b"x", flag=2**40),
        "born_timestamp": Message("T", b"x", born_timestamp=2**63),
        "reconsume_times": Message("T", b"x", reconsume_times=-(2**31) - 1),
    }
    with StoreClient.attach(store.path) as client:
        for why, m in refused.items():
            rs = client.put_batch([Message("T", b"fine"), m])
            assert {r.status for r in rs} == {ILLEGAL}, (why, rs)
            assert why in rs[0].reason and "message 1 of the batch" in rs[0].reason, (why, rs)
        assert client.positions()["reserved"] == 0
        assert client.put("T", b"after", queue_id=0).ok


@pytest.mark.parametrize("store_host", ["127.0.0.1:10911", "[fd00::7]:10911"])
def test_a_dead_producers_filler_fits_its_reservation_with_either_store_host(
    store_host: str,
) -> None:
    """The committer fills a dead producer's reservation; with an IPv6 store host the
    filler came out 12 bytes too long and could not be made."""
    smallest = record.record_length(0, 1, 0, store_v6="[" in store_host)  # an empty put
    for size in (smallest, smallest + 1, 500):
        rec = filler_record(size, "T", 0, store_host)
        assert len(rec.data) == size
        assert record.check_record(rec.data, 0).status is record.CheckStatus.OK


def test_wrong_python_types_raise_type_error_naming_the_parameter(store: Store) -> None:
    """`keys=123` raised "TypeError: can only join an iterable" from deep inside; every
    public method now checks its arguments' types at the door."""
    with StoreClient.attach(store.path) as client:
        calls = {
            "put() argument 'keys'": lambda: client.put("T", b"x", keys=123),
            "put() argument 'keys'[1]": lambda: client.put("T", b"x", keys=["a", 2]),
            "put() argument 'body'": lambda: client.put("T", "text"),
            "put() argument 'topic'": lambda: client.put(b"T", b"x"),
            "put() argument 'tags'": lambda: client.put("T", b"x", tags=1),
            "put() argument 'properties'['k']": lambda: client.put("T", b"x", properties={"k": 1}),
            "put() argument 'queue_id'": lambda: client.put("T", b"x", queue_id="1"),
            "put() argument 'wait_store'": lambda: client.put("T", b"x", wait_store=None),
            "put_batch() argument 'messages'": lambda: client.put_batch(5),
            "put_batch() messages[1]": lambda: client.put_batch([{"topic": "T", "body": b""}, 7]),
            "put_batch() messages[0]['keys']": lambda: client.put_batch(
                [{"topic": "T", "body": b"x", "keys": 123}]
            ),
            "put_batch() messages[0].born_host": lambda: client.put_batch(
                [Message("T", b"x", born_host=None)]
            ),
            "put_batch() messages[0].flag": lambda: client.put_batch(
                [Message("T", b"x", flag="1")]
            ),
            "pull() argument 'queue_id'": lambda: client.pull("T", "0", 0),
            "query() argument 'key'": lambda: client.query("T", 5),
            "get() argument 'physical_offset'": lambda: client.get("0"),
            "commit_offset() argument 'offset'": lambda: client.commit_offset("g", "T", 0, 1.5),
            "attach() argument 'timeout_s'": lambda: StoreClient.attach(store.path, timeout_s="1"),
        }
        for name, call in calls.items():
            with pytest.raises(TypeError) as got:
                call()
            assert str(got.value).startswith(f"{name} must be "), (name, got.value)
        # content problems stay statuses
        assert client.put("T", b"x", keys="").status is ILLEGAL
        assert client.put("T", b"x", properties={"k": ""}).status is ILLEGAL
        assert client.put_batch([{"body": b"x"}])[0].status is ILLEGAL  # missing topic
        assert client.positions()["reserved"] == 0
        assert client.put("T", bytearray(b"still writable"), keys=("a", "b"), queue_id=0).ok

    async def aio() -> None:
        async with AsyncStoreClient.attach(store.path) as a:
            with pytest.raises(TypeError, match=r"^put\(\) argument 'keys' must be"):
                await a.put("T", b"x", keys=123)
            with pytest.raises(TypeError, match=r"^pull\(\) argument 'offset' must be"):
                await a.pull("T", 0, None)
            with pytest.raises(TypeError, match=r"^put_batch\(\) messages\[0\]\['body'\]"):
                await a.put_batch([{"topic": "T", "body": "text"}])

    asyncio.run(aio())
    assert store.stop() == 0
    assert [r.body for r in store.read_log()] == [b"still writable"]


def test_keys_are_indexed_as_given_or_refused(store: Store) -> None:
    """RocketMQ's KEYS property separates keys with a space: `keys=["a b"]` was indexed as
    the two keys `a` and `b`, and `keys=` silently replaced `properties["KEYS"]`. A key
    with whitespace, an empty key, and a property given twice are refused by name."""
    with StoreClient.attach(store.path) as client:
        for kwargs, reason in (
            ({"keys": ["a b"]}, "keys[0] 'a b' contains whitespace"),
            ({"keys": ("ok", "tab\there")}, "keys[1] 'tab\\there' contains whitespace"),
            ({"keys": ["ok", ""]}, "keys[1] is empty"),
            ({"keys": ["k1"], "properties": {"KEYS": "k2"}}, "keys= and properties['KEYS']"),
            ({"tags": "t", "properties": {"TAGS": "u"}}, "tags= and properties['TAGS']"),
        ):
            r = client.put("T", b"x", **kwargs)  # type: ignore[arg-type]
            assert r.status is ILLEGAL and r.reason.startswith(reason), (kwargs, r)
            (b,) = client.put_batch([{"topic": "T", "body": b"x", **kwargs}])
            assert b.status is ILLEGAL and reason in b.reason, (kwargs, b)
        assert client.positions()["reserved"] == 0  # nothing was written
        ok = client.put("T", b"two keys", keys=["o-1", "o-2"], properties={"src": "web"})
        assert ok.ok, ok
        for key in ("o-1", "o-2"):
            found = wait_for(lambda k=key: client.query("T", k), 30, f"key {key} indexed")
            assert [m.body for m in found] == [b"two keys"]
            assert found[0].keys == "o-1 o-2" and found[0].properties["src"] == "web"
        assert client.query("T", "o-1 o-2") == []


def test_every_documented_shape_is_stored_as_given(store: Store) -> None:
    """Every shape `put` and `put_batch` document goes through the one C put (sequences
    and mappings of any kind, str and bytes subclasses, bytearray and memoryview bodies,
    generators of Mappings and Messages), and reads back as given."""

    class Topic(str):
        pass

    view = memoryview(array.array("i", [1, 2]))
    with StoreClient.attach(store.path) as client:
        rs = [
            client.put(Topic("S"), b"a", keys=deque(["k1", "k2"])),
            client.put("S", view, properties=types.MappingProxyType({"p": "v"})),
            client.put("S", memoryview(b"abcdef")[::2], tags="t", properties=UserDict({"q": "w"})),
            client.put("S", bytearray(b"ba"), keys=("k3",)),
            *client.put_batch(
                m
                for m in (
                    types.MappingProxyType({"topic": "S", "body": b"m", "keys": deque(["k4"])}),
                    Message("S", b"n", properties=types.MappingProxyType({"x": "y"})),
                )
            ),
        ]
        assert all(r.ok for r in rs), rs
        got = [client.get(r.physical_offset) for r in rs]
    assert [(m.body, m.keys, m.tags) for m in got if m is not None] == [
        (b"a", "k1 k2", None), (view.tobytes(), None, None), (b"ace", None, "t"),
        (b"ba", "k3", None), (b"m", "k4", None), (b"n", None, None),
    ]  # fmt: skip
    assert got[1] is not None and got[1].properties == {"p": "v", "UNIQ_KEY": rs[1].uniq_key}
