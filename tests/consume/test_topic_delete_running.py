"""`mqstore topic DIR delete T` while the store runs (issue 25, item 5), with real
processes: producers putting to T and to another topic the whole time, a reader that had
T's queue mapped, committed offsets, the index, a restart and a crash afterwards. T's
queues and offsets go; later puts to T start a new queue from offset 0; nothing else is
disturbed; bad requests are refused and leave the store writable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mqstore.engine import deleted_topics, topics
from mqstore.engine.offsets import ConsumerOffsets
from mqstore.ipc.client import StoreClient
from mqstore.ipc.commit import pid_alive
from mqstore.ipc.locks import take_store_lock
from mqstore.ipc.reads import for_client
from tests.runtime.harness import REPO, Store, wait_for

PRODUCER = """
import sys, time
from mqstore.ipc.client import StoreClient
store, stop = sys.argv[1], sys.argv[2]
import os
n = 0
with StoreClient.attach(store) as c:
    while not os.path.exists(stop):
        for topic in ("gone", "kept"):
            r = c.put(topic, b"%s-%d" % (topic.encode(), n), queue_id=n % 2, keys=f"k{n}")
            assert r.ok, r
        n += 1
        time.sleep(0.001)
print(n)
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=180, check=False,
    )  # fmt: skip


def _all(c: Any, topic: str, qid: int) -> list[Any]:
    out: list[Any] = []
    while True:
        got = c.pull(topic, qid, len(out), 256).messages
        if not got:
            return out
        out.extend(got)


def test_delete_while_producers_put_and_a_reader_has_the_queue_mapped(
    store: Store, tmp_path: Path
) -> None:
    d = str(store.path)
    stop = tmp_path / "stop"
    prod = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, d, str(stop)],
        cwd=str(REPO), stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        with StoreClient.attach(store.path) as c, for_client(c) as reads:
            wait_for(lambda: reads.max_offset("gone", 0) >= 20, 60, "puts to gone dispatched")
            before = _all(reads, "gone", 0)  # this reader now has gone's queue mapped
            assert len(before) >= 20
            old_key = before[0].keys
            ConsumerOffsets(store.path).commit("g", "gone", 0, 5)
            ConsumerOffsets(store.path).commit("g", "kept", 1, 3)

            done = _cli("topic", d, "delete", "gone")
            assert done.returncode == 0, done.stderr
            assert "(the store is running)" in done.stdout
            req = deleted_topics.read_request(d)
            assert req is not None and req.done and req.result is not None
            end = req.result.end_offset
            assert deleted_topics.load(d)["gone"] == end
            # puts go on for a while after the deletion
            wait_for(lambda: reads.max_offset("gone", 0) >= 10, 60, "new puts to gone")
            stop.touch()
            out, _err = prod.communicate(timeout=60)
            assert prod.returncode == 0
            total = int(out)
            assert total > 0

            # the reader that had the old queue mapped sees only the new topic
            wait_for(lambda: reads.dispatched() >= c.positions()["published"], 60, "dispatch")
            for q in (0, 1):
                new = _all(reads, "gone", q)
                assert new and all(m.physical_offset >= end for m in new)
                assert [m.queue_offset for m in new] == list(range(len(new)))
            # the other topic is whole: every message, dense offsets, in put order
            kept = [m for q in (0, 1) for m in _all(reads, "kept", q)]
            assert len(kept) == total
            for q in (0, 1):
                got = _all(reads, "kept", q)
                assert [m.queue_offset for m in got] == list(range(len(got)))
            assert ConsumerOffsets(store.path).table() == {"g": {("kept", 1): 3}}
            # lookups by key skip the deleted records, not the new ones
            assert all(m.physical_offset >= end for m in c.query("gone", old_key))
            # a put from a client that cached gone's rows before the deletion
            r = c.put("gone", b"after", queue_id=0)
            assert r.ok and r.physical_offset >= end
            assert r.queue_offset == reads.max_offset("gone", 0) or r.queue_offset >= 1
        assert "gone" in topics.load_topics(store.path)  # registered again by its new puts
    finally:
        stop.touch()
        if prod.poll() is None:
            prod.kill()
        prod.communicate()

    # the same after a clean restart and after a crash (abnormal recovery re-dispatches)
    def check() -> None:
        with StoreClient.attach(store.path) as c:
            for q in (0, 1):
                msgs = _all(c, "gone", q)
                assert msgs and all(m.physical_offset >= end for m in msgs)
                assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
            assert sum(len(_all(c, "kept", q)) for q in (0, 1)) == total

    assert store.stop() == 0
    store.start()
    check()
    workers = [w["pid"] for w in store.status()["workers"]]
    assert store.proc is not None
    store.proc.kill()
    store.proc.wait()
    store.proc = None
    store._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 30, "orphaned workers to exit")
    store.start()
    check()
    assert store.stop() == 0
    out = _cli("check", d)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_put_to_the_deleted_topic_starts_at_queue_offset_zero(store: Store) -> None:
    d = str(store.path)
    with StoreClient.attach(store.path) as c:
        for i in range(5):
            assert c.put("t1", b"old%d" % i, queue_id=0).ok
        wait_for(lambda: c.max_offset("t1", 0) == 5, 30, "dispatch")
        assert _cli("topic", d, "delete", "t1").returncode == 0
        r = c.put("t1", b"new", queue_id=0)  # this client cached t1's row
        assert r.ok and r.queue_offset == 0
        wait_for(lambda: c.max_offset("t1", 0) == 1, 30, "dispatch of the new message")
        assert [m.body for m in c.pull("t1", 0, 0).messages] == [b"new"]
    assert not list(store.path.glob(".mqstore-deleting-*"))


def test_bad_and_concurrent_requests_are_refused_and_the_store_stays_writable(
    store: Store,
) -> None:
    d = str(store.path)
    with StoreClient.attach(store.path) as c:
        assert c.put("t2", b"x", queue_id=0).ok
        wait_for(lambda: c.max_offset("t2", 0) == 1, 30, "dispatch")
    for bad in ("../etc", "a b", "x" * 300, ""):
        got = _cli("topic", d, "delete", bad)
        assert got.returncode == 2, (bad, got.stderr)
    # a hostile request file: said once by the dispatcher, nothing deleted, store writable
    path = Path(deleted_topics.request_path(d))
    path.write_text(json.dumps({"id": 1, "topic": "../../x", "done": False}))
    with StoreClient.attach(store.path) as c:
        wait_for(lambda: "topic deletion request refused" in store.output(), 30, "the warning")
        assert c.put("t2", b"y", queue_id=0).ok
        wait_for(lambda: c.max_offset("t2", 0) == 2, 30, "dispatch")
    assert "read_only" not in store.status()
    path.unlink()

    # one at a time: while the store is held but no dispatcher serves the request (a
    # supervisor between generations), the first waits and says so, the second is refused
    assert store.stop() == 0
    held = take_store_lock(d)
    try:
        first = _cli("topic", d, "delete", "t2", "--timeout", "0.5")
        assert first.returncode == 1 and "did not delete" in first.stderr, first.stderr
        second = _cli("topic", d, "delete", "t2")
        assert second.returncode == 1 and "still in progress" in second.stderr, second.stderr
        pending = deleted_topics.read_request(d)
        assert pending is not None and not pending.done and pending.topic == "t2"
    finally:
        os.close(held)
    store.start()  # its dispatcher serves the pending request
    wait_for(lambda: (r := deleted_topics.read_request(d)) is not None and r.done, 60, "served")
    with StoreClient.attach(store.path) as c:
        assert c.max_offset("t2", 0) == 0
        assert c.put("t2", b"z", queue_id=0).queue_offset == 0
