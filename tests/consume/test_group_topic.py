"""`mqstore group DIR list|reset|delete`, `mqstore offsets --group` and `mqstore topic DIR
delete`, through the real commands against a real store: offsets really move, a reset
reaches a running `tail --group`, a delete of a group with a member running is refused, a
deleted topic's queues stay gone after a restart and after a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from mqstore.engine import topics
from mqstore.engine.offsets import ConsumerOffsets
from mqstore.ipc.client import StoreClient
from mqstore.ipc.commit import pid_alive
from mqstore.ipc.reads import for_client
from tests.runtime.harness import REPO, Store, sigint_ignored, wait_for


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=120,
    )  # fmt: skip


def _ok(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, p.stderr
    return p.stdout


def _rows(p: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def _put(st: Store, topic: str, n: int) -> list[int]:
    """n messages over queues 0 and 1, dispatched; their store timestamps."""
    stamps = []
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        want = (reads.max_offset(topic, 0) + (n + 1) // 2, reads.max_offset(topic, 1) + n // 2)
        for i in range(n):
            r = c.put(topic, b"m%d" % i, queue_id=i % 2)
            assert r.ok, r
            stamps.append(r.store_timestamp)
        wait_for(
            lambda: (reads.max_offset(topic, 0), reads.max_offset(topic, 1)) == want, 30, "dispatch"
        )
    return stamps


def test_group_list_reset_dry_run_earliest_latest_time_and_delete(store: Store) -> None:
    d = str(store.path)
    _put(store, "gt", 6)  # queue 0: 0..2, queue 1: 0..2
    offsets = ConsumerOffsets(store.path)
    offsets.commit_many("g", [("gt", 0, 2), ("gt", 1, 1)])
    offsets.commit("other", "gt", 0, 3)
    assert _rows(_cli("group", d, "list", "--json")) == [
        {"group": "g", "topics": "gt", "queues": 2, "lag": 3, "members": 0},
        {"group": "other", "topics": "gt", "queues": 1, "lag": 0, "members": 0},
    ]

    dry = _cli("group", d, "reset", "--group", "g", "--topic", "gt", "--to", "earliest",
               "--dry-run", "--json")  # fmt: skip
    # every queue of the topic: its 4 configured queues, two of them never committed
    assert [(r["queue_id"], r["committed"], r["new"]) for r in _rows(dry)] == [
        (0, 2, 0), (1, 1, 0), (2, None, 0), (3, None, 0)
    ]  # fmt: skip
    assert "dry run" in dry.stderr
    assert (offsets.committed("g", "gt", 0), offsets.committed("g", "gt", 1)) == (2, 1)

    # the action first, as in the issue's `mqstore group reset DIR`
    _ok(_cli("group", "reset", d, "--group", "g", "--topic", "gt", "--to", "earliest"))
    assert (offsets.committed("g", "gt", 0), offsets.committed("g", "gt", 1)) == (0, 0)

    stamps = _put(store, "gt", 4)  # queue 0: 3, 4; queue 1: 3, 4
    _ok(_cli("group", d, "reset", "--group", "g", "--topic", "gt", "--to", "latest"))
    assert (offsets.committed("g", "gt", 0), offsets.committed("g", "gt", 1)) == (5, 5)

    # the time of the second batch's message 2 (queue 0 offset 4), by RocketMQ's
    # getOffsetInQueueByTime: an exact match is the first unit stored in that millisecond,
    # else the closer of the last older and the first newer unit (a tie: the older). Queue
    # q's offsets 3 and 4 are the batch's messages q and q + 2.
    t = stamps[2]
    _ok(_cli("group", d, "reset", "--group", "g", "--topic", "gt", "--to", str(t)))

    def by_time(older: int, newer: int) -> int:
        if older == t or newer == t:
            return 3 if older == t else 4
        return 3 if t - older <= newer - t else 4

    want = [by_time(stamps[q], stamps[q + 2]) for q in (0, 1)]
    assert [offsets.committed("g", "gt", q) for q in (0, 1)] == want
    with StoreClient.attach(store.path) as c:
        got = c.pull("gt", 0, offsets.committed("g", "gt", 0), 8)
        assert [m.body for m in got.messages] == ([b"m0", b"m2"] if want[0] == 3 else [b"m2"])

    only_g = _rows(_cli("offsets", d, "--group", "g", "--json"))
    assert {(r["group"], r["queue_id"]) for r in only_g} == {("g", q) for q in range(4)}

    deleted = _cli("group", d, "delete", "--group", "g")
    assert deleted.returncode == 0 and "deleted 4 committed offset(s)" in deleted.stdout
    assert ConsumerOffsets(store.path).table() == {"other": {("gt", 0): 3}}
    assert _rows(_cli("offsets", d, "--group", "g", "--json")) == []


def test_group_reset_works_while_a_tail_of_the_group_runs_and_delete_is_refused(
    store: Store,
) -> None:
    """`mqstore tail --group G` is a member of G (docs/consumers.md): `group reset` of G
    while it runs is handed to it by the supervisor (it drops the queues and prints
    them again from the new offsets), and its acks never undo the reset; `group delete`
    is refused while it runs, and works once it left."""
    d = str(store.path)
    _put(store, "gt", 4)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    tail = subprocess.Popen(  # with SIGINT ignored, as `nohup make test &` runs it
        sigint_ignored([sys.executable, "-m", "mqstore", "tail", d, "--topic", "gt",
                        "--group", "live", "--from-beginning"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=env,
    )  # fmt: skip
    offsets = ConsumerOffsets(store.path)
    assert tail.stdout is not None
    try:
        first = [json.loads(tail.stdout.readline()) for _ in range(4)]
        assert sorted(r["body"] for r in first) == [f"m{i}" for i in range(4)]
        # both queues: the four may come in two polls, acked (and written) apart
        wait_for(
            lambda: [offsets.committed("live", "gt", q) for q in (0, 1)] == [2, 2],
            60,
            "the tail's acks",
        )
        listed = _rows(_cli("group", d, "list", "--json"))
        assert [r["members"] for r in listed if r["group"] == "live"] == [1]
        refused = _cli("group", d, "delete", "--group", "live")
        assert refused.returncode == 1, refused.stderr
        assert "has members running" in refused.stderr
        assert offsets.committed("live", "gt", 0) == 2  # nothing changed
        reset = _cli("group", d, "reset", "--group", "live", "--topic", "gt", "--to", "earliest")
        _ok(reset)
        assert "1 running member(s) told" in reset.stderr
        again = [json.loads(tail.stdout.readline()) for _ in range(4)]
        assert sorted(r["body"] for r in again) == [f"m{i}" for i in range(4)]
        wait_for(
            lambda: [offsets.committed("live", "gt", q) for q in (0, 1)] == [2, 2],
            60,
            "the tail's acks after the reset",
        )
    finally:
        tail.send_signal(signal.SIGINT)
        try:
            _out, err = tail.communicate(timeout=60)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.communicate()
    assert tail.returncode == 0, err
    _ok(_cli("group", d, "delete", "--group", "live"))
    assert offsets.committed("live", "gt", 0) == -1


def test_tail_refuses_a_queue_with_a_group(store: Store) -> None:
    bad = _cli("tail", str(store.path), "--topic", "gt", "--queue", "0", "--group", "g")
    assert bad.returncode == 2 and "--queue does not go with --group" in bad.stderr


def test_group_commands_refuse_bad_arguments(store: Store) -> None:
    d = str(store.path)
    assert _cli("group", d, "reset", "--group", "g", "--topic", "gt").returncode == 2
    bad = _cli("group", d, "delete", "--group", "../x")
    assert bad.returncode == 2 and "consumer group name '../x' is not allowed" in bad.stderr
    assert _cli("group", d, "rename", "--group", "g").returncode == 2
    nope = _cli("group", d, "reset", "--group", "g", "--topic", "none", "--to", "latest")
    assert nope.returncode == 2 and "has no queues" in nope.stderr


def _kill_supervisor(st: Store) -> None:
    assert st.proc is not None
    workers = [w["pid"] for w in st.status()["workers"]]
    st.proc.kill()
    st.proc.wait()
    st.proc = None
    st._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 30, "orphaned workers to exit")


def test_topic_delete_of_a_stopped_store_stays_deleted(store: Store) -> None:
    """(Deleting while the store runs: tests/consume/test_topic_delete_running.py.)"""
    d = str(store.path)
    _put(store, "kept", 4)
    _put(store, "gone", 6)  # the log's last records: the queues' highest offset is gone's
    ConsumerOffsets(store.path).commit("g", "gone", 0, 2)
    ConsumerOffsets(store.path).commit("g", "kept", 0, 1)
    assert (store.path / "consumequeue" / "gone").is_dir()

    assert store.stop() == 0
    done = _cli("topic", "delete", d, "gone")  # the action first works too
    assert done.returncode == 0, done.stderr
    assert not (store.path / "consumequeue" / "gone").exists()
    assert "gone" not in topics.load_topics(store.path) and "kept" in topics.load_topics(d)
    assert ConsumerOffsets(store.path).table() == {"g": {("kept", 0): 1}}
    assert _cli("get", d, "--topic", "gone", "--queue", "0", "--offset", "0").returncode == 1

    store.start()  # the dispatcher resumes below gone's records: it must skip them
    _put(store, "kept", 2)
    assert not (store.path / "consumequeue" / "gone").exists()
    with StoreClient.attach(store.path) as c:
        r = c.put("gone", b"new life", queue_id=0)
        assert r.ok and r.queue_offset == 0  # a new topic
        wait_for(lambda: c.max_offset("gone", 0) == 1, 30, "dispatch of the new message")
        assert [m.body for m in c.pull("gone", 0, 0, 8).messages] == [b"new life"]

    _kill_supervisor(store)  # abnormal recovery re-dispatches from the checkpoint
    unclean = _cli("topic", d, "delete", "kept")
    assert unclean.returncode == 1 and "recover" in unclean.stderr
    store.start()
    _put(store, "kept", 2)
    with StoreClient.attach(store.path) as c:
        assert c.max_offset("gone", 0) == 1 and c.max_offset("gone", 1) == 0
        assert [m.body for m in c.pull("gone", 0, 0, 8).messages] == [b"new life"]
        assert c.max_offset("kept", 0) == 4  # 2 + 1 + 1: the other topic is whole
