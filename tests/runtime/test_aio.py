"""The asyncio client against a real supervisor: concurrent awaits beside blocking
producers in other processes, exactly-once in the log, a loop that keeps running while
puts wait for their fsync, batches, pulls, statuses, and a failed fsync."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from mqstore import AsyncStoreClient, PutMessageStatus
from mqstore.engine.reader import GetResult
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store

OK = PutMessageStatus.PUT_OK

CHILD = """
import json, sys
from mqstore import StoreClient
store, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
acked, bad = [], []
with StoreClient.attach(store) as c:
    for k in range(n):
        body = f"{tag}-{k}".encode()
        r = c.put("mixed", body, queue_id=k % 2)
        (acked if r.ok else bad).append(body.decode() if r.ok else r.status.name)
print(json.dumps({"acked": acked, "bad": bad}))
"""


def _children(store: Store, count: int, n: int) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(store.path), f"blocking{i}", str(n)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("loop_waits", [True, False], ids=["loop-waits", "thread-waits"])
def test_concurrent_awaits_beside_blocking_producers_exactly_once(
    store: Store, loop_waits: bool
) -> None:
    procs = _children(store, 2, 300)  # blocking producers in other processes
    in_flight = 0
    ticks_while_waiting = 0
    not_covered: list[int] = []

    async def main() -> list[tuple[str, PutMessageStatus]]:
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks_while_waiting
            while not stop.is_set():
                if in_flight:
                    ticks_while_waiting += 1
                await asyncio.sleep(0)

        async with AsyncStoreClient.attach(store.path, loop_waits=loop_waits) as aio:

            async def one(i: int) -> tuple[str, PutMessageStatus]:
                nonlocal in_flight
                body = f"aio-{i}"
                in_flight += 1
                try:
                    r = await aio.put("mixed", body.encode(), queue_id=i % 3)
                finally:
                    in_flight -= 1
                if r.ok and (await aio.positions())["flushed"] < r.physical_offset + r.size:
                    not_covered.append(i)
                return body, r.status

            tick = asyncio.create_task(ticker())
            out: list[tuple[str, PutMessageStatus]] = []
            for wave in range(4):  # 4 waves of 150 concurrent awaits
                out += await asyncio.gather(*(one(wave * 150 + i) for i in range(150)))
            stop.set()
            await tick
            return out

    results = asyncio.run(main())
    child_docs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert [s for _b, s in results if s is not OK] == []
    assert all(d["bad"] == [] for d in child_docs), child_docs
    assert not_covered == [], "acknowledged before the flushed offset covered the record"
    # The loop ran while puts waited: a put that blocked the loop could never be seen
    # in flight by the ticker.
    assert ticks_while_waiting >= len(results)
    acked = [b for b, _s in results] + [b for d in child_docs for b in d["acked"]]
    assert store.stop() == 0
    in_log = Counter(r.body.decode() for r in store.read_log() if r.topic == "mixed")
    assert len(acked) == 600 + 600
    assert [b for b in acked if in_log[b] != 1] == []
    assert sum(in_log.values()) == len(acked)


def test_one_thread_many_awaits_share_fsyncs_when_waits_are_on_the_loop(store: Store) -> None:
    """With the flush wait on the loop, one put thread serves any number of concurrent
    sync awaits, and they share fsyncs; waits held on that one thread could not (one
    fsync per put)."""
    n = 150

    async def main() -> tuple[bool, list[PutMessageStatus]]:
        async with AsyncStoreClient.attach(store.path, concurrency=1) as aio:
            rs = await asyncio.gather(*(aio.put("g", b"%d" % i, queue_id=0) for i in range(n)))
            return aio.waits_on_loop, [r.status for r in rs]

    before = store.status()["fsync"]["total"]
    on_loop, statuses = asyncio.run(main())
    if not on_loop:
        pytest.skip("this runtime's flusher answers no datagrams: waits run on threads")
    assert statuses == [OK] * n
    fsyncs = store.status()["fsync"]["total"] - before
    assert fsyncs < n // 2, f"{fsyncs} fsyncs for {n} concurrent sync puts"


async def _pull_until(
    aio: AsyncStoreClient, topic: str, queue_id: int, offset: int, count: int
) -> GetResult:
    """Pull until `count` messages come back (a dispatcher, when the store runs one,
    and the flusher, for wait_store=False, make them readable a moment later)."""
    for _ in range(3000):
        got = await aio.pull(topic, queue_id, offset, count)
        if len(got.messages) >= count:
            return got
        await asyncio.sleep(0.01)
    raise AssertionError(f"{topic}/{queue_id}@{offset}: {count} messages never came: {got}")


def test_batch_pull_and_statuses(store: Store) -> None:
    async def main() -> None:
        aio = await AsyncStoreClient.attach(store.path)
        try:
            rs = await aio.put_batch(
                [{"topic": "b", "body": f"m{i}".encode(), "queue_id": 1} for i in range(5)]
            )
            assert [r.status for r in rs] == [OK] * 5
            assert [r.queue_offset for r in rs] == list(range(5))
            r = await aio.put("b", b"tagged", tags="t1", keys=["k"], queue_id=1)
            assert r.ok and r.queue_offset == 5
            bad = await aio.put("b", b"x", queue_id=99)  # the topic has 4 queues
            assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL
            nowait = await aio.put("b", b"no wait", queue_id=1, wait_store=False)
            assert nowait.ok
            got = await _pull_until(aio, "b", 1, 0, 4)
            assert got.status.name == "FOUND"
            assert [m.body for m in got.messages] == [b"m0", b"m1", b"m2", b"m3"]
            assert got.next_offset == 4
            rest = await _pull_until(aio, "b", 1, got.next_offset, 2)
            assert [m.body for m in rest.messages][:2] == [b"m4", b"tagged"]
            assert rest.messages[1].tags == "t1" and rest.messages[1].keys == "k"
            last = await _pull_until(aio, "b", 1, 6, 1)
            assert [m.body for m in last.messages] == [b"no wait"]
            assert (await aio.pull("b", 1, 7, 1)).status.name == "OFFSET_OVERFLOW_ONE"
            none = await aio.pull("nope", 0, 0, 1)
            assert none.status.name == "NO_MATCHED_LOGIC_QUEUE"
        finally:
            await aio.close()
        closed = await aio.close()  # idempotent
        assert closed is None

    asyncio.run(main())


def test_failed_fsync_settles_awaits_with_flush_disk_failed(make_store: StoreFactory) -> None:
    st = make_store(env={"MQSTORE_FAULTS": "fdatasync:EIO", "MQSTORE_FAULTS_FOR": "flusher"})

    async def main() -> list[PutMessageStatus]:
        async with AsyncStoreClient.attach(st.path) as aio:
            rs = await asyncio.gather(*(aio.put("t", b"x", queue_id=0) for _ in range(20)))
            after = await aio.put("t", b"refused", queue_id=0)
            return [r.status for r in rs] + [after.status]

    statuses = asyncio.run(main())
    # the first fsync fails every put waiting for it; puts reserved after that are refused
    assert PutMessageStatus.FLUSH_DISK_FAILED in statuses[:-1]
    assert set(statuses[:-1]) <= {
        PutMessageStatus.FLUSH_DISK_FAILED,
        PutMessageStatus.SERVICE_NOT_AVAILABLE,
    }
    assert statuses[-1] is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert st.stop() == 5


def test_pull_through_consume_queues(store: Store) -> None:
    """Pulls go through engine.reader over consume queues
    (written by the store's dispatcher worker, or here by the engine's dispatcher when
    the store runs none), limited to the flushed offset."""
    from mqstore import StoreClient
    from mqstore.conf.settings import StoreSettings
    from mqstore.engine.dispatch import Dispatcher
    from mqstore.engine.reader import Geometry

    with StoreClient.attach(store.path) as client:
        rs = [client.put("cq", f"m{i}".encode(), queue_id=2) for i in range(10)]
        assert all(r.ok for r in rs)
        flushed = client.positions()["flushed"]
    if not any(w["name"] == "dispatcher" for w in store.status()["workers"]):
        d = Dispatcher.open(store.path, Geometry.of(store.path, StoreSettings()))
        try:
            assert d.dispatch(0, flushed).records == 10
        finally:
            d.close()

    async def main() -> None:
        async with AsyncStoreClient.attach(store.path) as aio:
            await _pull_until(aio, "cq", 2, 9, 1)  # the store's dispatcher, if it runs one
            got = await aio.pull("cq", 2, 3, 4)
            assert got.status.name == "FOUND" and got.max_offset == 10
            assert [m.body for m in got.messages] == [b"m3", b"m4", b"m5", b"m6"]
            assert (await aio.pull("cq", 2, 10, 4)).status.name == "OFFSET_OVERFLOW_ONE"

    asyncio.run(main())
