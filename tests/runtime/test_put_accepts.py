"""What a put accepts (issue 14, items 3-6), through the real client attached to a real
running store: topic and group names (RocketMQ's rule), queue ids within the topic's
queues, message fields written as given (IPv6 hosts included) or refused, and wrong
Python types refused at the door with the parameter's name."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from mqstore import AsyncStoreClient, Message, PutMessageStatus, StoreClient
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
