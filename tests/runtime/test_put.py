"""Puts through the public client against a real supervisor: sync, async, batches,
statuses for bad input, segment rolls, and what lands on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore import PutMessageStatus, PutResult, StoreClient
from mqstore.engine.record import Message
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, check_chain, wait_for

OK = PutMessageStatus.PUT_OK


def test_sync_put_is_flushed_when_acknowledged(store: Store) -> None:
    with StoreClient.attach(store.path) as client:
        r = client.put("orders", b"hello", tags="new", keys=["k1", "k2"], properties={"a": "b"})
        assert isinstance(r, PutResult)
        assert r.status is OK, r.reason
        assert (r.physical_offset, r.queue_offset, r.reason) == (0, 0, "")
        assert r.size > 91 and r.store_timestamp > 0 and len(r.msg_id) == 32
        assert client.positions()["flushed"] >= r.physical_offset + r.size
        r2 = client.put("orders", b"second", queue_id=r.queue_id)
        assert r2.status is OK and r2.queue_offset == 1
        assert r2.physical_offset == r.physical_offset + r.size
    assert store.stop() == 0
    recs = store.read_log()
    assert [x.body for x in recs] == [b"hello", b"second"]
    first = recs[0]
    assert first.topic == "orders" and first.tags == "new" and first.keys == "k1 k2"
    assert first.properties["a"] == "b" and first.msg_id == r.msg_id
    assert first.store_timestamp == r.store_timestamp


def test_flusher_trace_records_each_sync_round(make_store: StoreFactory, tmp_path: Path) -> None:
    """MQSTORE_FLUSH_TRACE (bench/profile_sync.py's source): one row per sync round, its
    steps in order, every acknowledged put in one round at most."""
    trace = tmp_path / "flush-trace.jsonl"
    st = make_store(env={"MQSTORE_FLUSH_TRACE": str(trace)})
    n = 0
    with StoreClient.attach(st.path) as client:
        for i in range(50):
            assert client.put("orders", b"x" * 100, keys=f"k{i}").status is OK
            n += 1
    assert st.stop() == 0
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert rows and sum(r["msgs"] for r in rows) <= n
    for r in rows:
        assert r["msgs"] >= 1 and r["bytes"] > 0
        assert r["served"] <= r["gathered"] <= r["committed"] <= r["forced"] <= r["waked"]
        assert 0 < r["fsync_ns"] <= r["forced"] - r["committed"]  # the force's fdatasync


def test_async_put_and_wait_store_false(make_store: StoreFactory) -> None:
    st = make_store({"flush_disk_type": "ASYNC_FLUSH", "flush_interval_ms": 50})
    with StoreClient.attach(st.path) as client:
        results = [client.put("t", b"x" * 100, queue_id=0) for _ in range(500)]
        assert all(r.status is OK for r in results)
        assert [r.queue_offset for r in results] == list(range(500))
        end = results[-1].physical_offset + results[-1].size
        wait_for(lambda: client.positions()["flushed"] >= end, 30, "the async flush")
    sync = make_store()
    with StoreClient.attach(sync.path) as client:
        r = client.put("t", b"no wait", wait_store=False)
        assert r.status is OK
    assert st.stop() == 0 and sync.stop() == 0
    assert len(st.read_log()) == 500 and len(sync.read_log()) == 1


def test_queue_id_none_spreads_over_topic_queues(store: Store) -> None:
    with StoreClient.attach(store.path, topic_queue_nums={"two": 2}) as client:
        four = [client.put("four", b"x").queue_id for _ in range(8)]
        two = [client.put("two", b"x").queue_id for _ in range(4)]
    assert sorted(set(four)) == [0, 1, 2, 3] and sorted(set(two)) == [0, 1]


def test_put_batch_dicts_and_messages(store: Store) -> None:
    with StoreClient.attach(store.path) as client:
        out = client.put_batch(
            [
                {"topic": "a", "body": b"1", "queue_id": 0, "tags": "t"},
                {"topic": "a", "body": b"2", "queue_id": 0},
                Message("b", b"3", {"k": "v"}, queue_id=2),
            ]
        )
        assert [r.status for r in out] == [OK] * 3
        assert [r.queue_offset for r in out] == [0, 1, 0]
        assert out[1].physical_offset == out[0].physical_offset + out[0].size
        assert len({r.store_timestamp for r in out}) == 1
        assert client.put_batch([]) == []
    assert store.stop() == 0
    assert [r.body for r in store.read_log()] == [b"1", b"2", b"3"]


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"topic": "", "body": b"x"}, PutMessageStatus.MESSAGE_ILLEGAL),
        ({"topic": "t" * 128, "body": b"x"}, PutMessageStatus.MESSAGE_ILLEGAL),
        ({"topic": "t/x", "body": b"x"}, PutMessageStatus.MESSAGE_ILLEGAL),
        ({"topic": "t", "body": b"x", "queue_id": -1}, PutMessageStatus.MESSAGE_ILLEGAL),
        ({"topic": "t", "body": b"x" * (4 * 1024 * 1024 + 1)}, PutMessageStatus.MESSAGE_ILLEGAL),
        ({"topic": "t", "body": b"x", "properties": {"k": "v" * 40000}},
         PutMessageStatus.PROPERTIES_SIZE_EXCEEDED),
        ({"topic": "t", "body": b"x", "properties": {"k\x01": "v"}},
         PutMessageStatus.MESSAGE_ILLEGAL),
        ({"topic": "t", "body": b"x" * (1 << 20)}, PutMessageStatus.MESSAGE_ILLEGAL),
    ],
)  # fmt: skip
def test_bad_input_gets_a_status_and_writes_nothing(
    store: Store, kwargs: dict[str, object], status: PutMessageStatus
) -> None:
    kwargs = dict(kwargs)
    with StoreClient.attach(store.path) as client:
        topic = kwargs.pop("topic")
        body = kwargs.pop("body")
        r = client.put(topic, body, **kwargs)  # type: ignore[arg-type]
        assert r.status is status and r.reason
        bad_batch = client.put_batch(
            [{"topic": "ok", "body": b"fine"}, {"topic": topic, "body": body, **kwargs}]
        )
        assert all(x.status is status for x in bad_batch)
        assert "message 1 of the batch" in bad_batch[0].reason
        assert client.positions()["reserved"] == 0
        after = client.put("ok", b"after")
        assert after.status is OK, after


def test_rolls_segments_with_blank_and_recycles_pool(make_store: StoreFactory) -> None:
    # A generous busy timeout: this test is about recycling, not about how fast the
    # committer frees a buffer on a loaded machine.
    st = make_store(
        {
            "segment_size_bytes": 65536,
            "transient_store_pool_size": 2,
            "os_page_cache_busy_timeout_ms": 20_000,
        }
    )
    with StoreClient.attach(st.path) as client:
        rs = [client.put("roll", os.urandom(700), queue_id=1, wait_store=False) for _ in range(600)]
        assert all(r.status is OK for r in rs), {r.reason for r in rs if r.status is not OK}
        assert rs[-1].physical_offset > 5 * 65536  # went through more segments than buffers
        for r in rs:
            assert r.physical_offset // 65536 == (r.physical_offset + r.size - 1) // 65536
        batch = client.put_batch([{"topic": "roll", "body": b"y" * 700}] * 20)
        assert [r.status for r in batch] == [OK] * 20
    assert st.stop() == 0
    recs = st.read_log(keep_fillers=True)
    assert len(recs) == 620
    check_chain(recs, 65536)


def test_pool_exhausted_returns_os_pagecache_busy(make_store: StoreFactory) -> None:
    import signal

    st = make_store(
        {
            "segment_size_bytes": 65536,
            "transient_store_pool_size": 2,
            "flush_disk_type": "ASYNC_FLUSH",
            "os_page_cache_busy_timeout_ms": 200,
        }
    )
    st.wait_workers_running()  # a committer stopped while booting is killed, not waited on
    committer = next(w for w in st.status()["workers"] if w["name"] == "committer")
    os.kill(committer["pid"], signal.SIGSTOP)
    try:
        with StoreClient.attach(st.path) as client:
            statuses = []
            for _ in range(300):
                r = client.put("busy", b"z" * 1000, wait_store=False)
                statuses.append(r.status)
                if r.status is not OK:
                    break
            assert statuses[-1] is PutMessageStatus.OS_PAGECACHE_BUSY
            assert statuses.count(OK) < 140  # two 64 KiB buffers hold about 120 of these
            doc = st.status()
            assert (doc["room_timeouts"], doc["lock_timeouts"]) == (1, 0), doc
    finally:
        os.kill(committer["pid"], signal.SIGCONT)
    with StoreClient.attach(st.path) as client:
        r = wait_for(
            lambda: (x := client.put("busy", b"again", wait_store=False)).status is OK and x,
            30,
            "the pool to drain",
        )
        assert r.status is OK
    assert st.stop() == 0
    check_chain(st.read_log(keep_fillers=True), 65536)


def test_pool_off_writes_through_the_mapping(make_store: StoreFactory) -> None:
    st = make_store({"transient_store_pool_enable": False, "segment_size_bytes": 65536})
    assert len(st.shm_leftovers()) == 1  # the control block only
    with StoreClient.attach(st.path) as client:
        rs = [client.put("nopool", b"m" * 900, queue_id=0) for _ in range(150)]
        assert all(r.status is OK for r in rs)
        rs += [client.put("nopool", b"a" * 900, queue_id=0, wait_store=False) for _ in range(50)]
        assert st.status()["pool"]["enabled"] is False
    assert st.stop() == 0
    recs = st.read_log(keep_fillers=True)
    assert len(recs) == 200
    check_chain(recs, 65536)


def test_disk_full_word_refuses_puts_until_cleared(store: Store) -> None:
    from mqstore.engine.diskguard import DISK_FULL_BIT
    from mqstore.ipc import control as c

    with StoreClient.attach(store.path) as client:
        assert client.put("d", b"before", queue_id=0).status is OK
        cb = client.live_control_block()  # stands in for the cleaner, the word's only writer
        cb.set(c.OFF_DISK_STATE, DISK_FULL_BIT | (950 << 16))
        r = client.put("d", b"refused", queue_id=0)
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk is full (95.0% used)" in r.reason
        cb.set(c.OFF_DISK_STATE, 0)
        assert client.put("d", b"after", queue_id=0).status is OK
    assert store.stop() == 0
    assert [x.body for x in store.read_log()] == [b"before", b"after"]


def test_put_batch_rejects_unknown_fields_and_oversized_batches(store: Store) -> None:
    with StoreClient.attach(store.path) as client:
        r = client.put_batch([{"topic": "a", "body": b"x"}, {"topic": "a", "body": b"y", "c": 1}])
        assert [x.status for x in r] == [PutMessageStatus.MESSAGE_ILLEGAL] * 2
        assert "unknown fields ['c']" in r[0].reason
        missing = client.put_batch([{"body": b"x"}])
        assert missing[0].status is PutMessageStatus.MESSAGE_ILLEGAL
        big = client.put_batch([{"topic": "a", "body": b""}] * 5000)
        assert big[0].status is PutMessageStatus.MESSAGE_ILLEGAL and "per batch" in big[0].reason
        assert client.positions()["reserved"] == 0


def test_client_encoding_matches_the_reference_encoder(store: Store) -> None:
    from mqstore.engine import record
    from mqstore.engine.commitlog import CommitLog

    cases = [
        ("t", None, None, None),
        ("t", "tag", None, None),
        ("t", None, "k1", None),
        ("t", "tag", "ключ-1", None),
        ("t", "tag", ["a", "b"], None),
        ("t", "tag", "k", {"x": "y"}),
        ("t", None, None, {"x": "y", "z": "w"}),
    ]
    with StoreClient.attach(store.path) as client:
        results = [
            client.put(topic, b"body-%d" % i, tags=tags, keys=keys, properties=props, queue_id=1)
            for i, (topic, tags, keys, props) in enumerate(cases)
        ]
        assert all(r.status is OK for r in results)
        bad = client.put("t", b"x", tags="tag", keys="")
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL and "KEYS" in bad.reason
        bad = client.put("t", b"x", keys="a\x02b")
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL
        bad = client.put("t", b"x", keys="k" * 40000)
        assert bad.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.stop() == 0
    cl = CommitLog.open(
        store.path / "commitlog", store.config["segment_size_bytes"], read_only=True
    )
    try:
        for i, ((topic, tags, keys, props), r) in enumerate(zip(cases, results, strict=True)):
            stored = cl.read_bytes(r.physical_offset, r.size)
            d = dict(props or {})
            if tags is not None:
                d[record.PROPERTY_TAGS] = tags
            if keys is not None:
                d[record.PROPERTY_KEYS] = keys if isinstance(keys, str) else " ".join(keys)
            assert len(r.uniq_key) == 32  # the client's message id, added last
            d[record.PROPERTY_UNIQ_KEY] = r.uniq_key
            born = cl.read(r.physical_offset).record
            assert born is not None
            want = record.encode(
                Message(topic, b"body-%d" % i, d, queue_id=1, born_timestamp=born.born_timestamp)
            )
            buf = bytearray(len(want.data))
            record.patch_append_fields(
                buf, 0, want, r.queue_offset, r.physical_offset, r.store_timestamp
            )
            assert stored == bytes(buf), (i, topic, tags, keys, props)
    finally:
        cl.close()


def test_queue_spreading_follows_the_topics_queue_count(store: Store) -> None:
    """`mqstore topic DIR set T --queues N` changes how puts without a queue id spread,
    for a client attached before the change too (config/topics.json is re-read)."""
    with StoreClient.attach(store.path) as client:
        first = [client.put("spread", b"x", wait_store=False).queue_id for _ in range(8)]
        assert sorted(set(first)) == [0, 1, 2, 3]  # the default: 4 queues
        out = subprocess.run(
            [sys.executable, "-m", "mqstore", "topic", str(store.path), "set", "spread",
             "--queues", "2"],
            capture_output=True, text=True, cwd=str(REPO), timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr

        def two_queues() -> bool:
            ids = {client.put("spread", b"y", wait_store=False).queue_id for _ in range(8)}
            return ids == {0, 1}

        wait_for(two_queues, 10, "puts to spread over the topic's 2 queues")


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_clients_in_threads_of_one_process_never_share_an_offset(
    make_store: StoreFactory, mode: str
) -> None:
    """Several StoreClients in one process (AsyncStoreClient's put threads, or a user's
    own threads) serialise their reservations against each other too: fcntl record locks
    belong to the process, so they would let two threads in at once and hand out one
    offset twice (found by test_aio: an acknowledged message missing from the log)."""
    import threading

    store = make_store({"flush_disk_type": f"{mode.upper()}_FLUSH"})
    clients = [StoreClient.attach(store.path) for _ in range(4)]
    acked: list[list[PutResult]] = [[] for _ in clients]
    go = threading.Barrier(len(clients))

    def run(k: int) -> None:
        go.wait()
        for i in range(1500):
            acked[k].append(clients[k].put("threads", f"t{k}-{i}".encode(), queue_id=k))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for cl in clients:
        cl.close()
    results = [r for rs in acked for r in rs]
    assert [r for r in results if not r.ok] == []
    offsets = [r.physical_offset for r in results]
    assert len(set(offsets)) == len(offsets), "one offset handed out twice"
    assert store.stop() == 0
    bodies = [r.body for r in store.read_log() if r.topic == "threads"]
    assert sorted(bodies) == sorted(f"t{k}-{i}".encode() for k in range(4) for i in range(1500))


def test_a_stopped_committer_holds_producers_at_the_backlog_bound(
    make_store: StoreFactory,
) -> None:
    """Flow control with the pool on (`commit_backlog_max_bytes`, no grace here): with the
    committer SIGSTOPped, async puts go on only until the log reserved past the committed
    position reaches the bound (far less than the pool of 3 MiB holds), then a put waits
    the busy timeout and is OS_PAGECACHE_BUSY naming the bound; once the committer goes on,
    puts are PUT_OK again, and the log holds every acknowledged put, in one chain."""
    import signal
    import time

    bound = 128 * 1024
    st = make_store(
        {
            "flush_disk_type": "ASYNC_FLUSH",
            "os_page_cache_busy_timeout_ms": 300,
            "commit_backlog_max_bytes": bound,
            "commit_backlog_grace_ms": 0,
        }
    )
    st.wait_workers_running()  # a committer stopped while booting is killed, not waited on
    committer = next(w for w in st.status()["workers"] if w["name"] == "committer")
    with StoreClient.attach(st.path) as client:
        first = client.put("flow", b"w" * 1000, wait_store=False)
        assert first.status is OK, first
        wait_for(lambda: client.positions()["committed"] >= first.physical_offset + first.size)
        os.kill(committer["pid"], signal.SIGSTOP)
        try:
            oks = [first]
            for _ in range(3000):  # the pool holds ~2,800 of these
                t0 = time.monotonic()
                r = client.put("flow", b"z" * 1000, wait_store=False)
                if r.status is not OK:
                    break
                oks.append(r)
            took = time.monotonic() - t0
            assert r.status is PutMessageStatus.OS_PAGECACHE_BUSY, r
            assert r.reason == (
                f"the commit backlog stayed at its bound (commit_backlog_max_bytes, {bound} "
                "bytes) and the committer did not move for 300 ms"
            )
            assert 0.25 <= took < 30, took
            pos = client.positions()
            assert bound <= pos["reserved"] - pos["committed"] < bound + oks[-1].size
            assert len(oks) < 2 * bound // 1000
            doc = st.status()
            assert (doc["room_timeouts"], doc["lock_timeouts"]) == (1, 0), doc
        finally:
            os.kill(committer["pid"], signal.SIGCONT)
        after = wait_for(
            lambda: (x := client.put("flow", b"again", wait_store=False)).status is OK and x,
            30,
            "the committer to bring the backlog under the bound",
        )
        oks.append(after)
    assert st.stop() == 0
    recs = st.read_log(keep_fillers=True)
    assert len(recs) == len(oks)
    check_chain(recs, 1 << 20)


def test_a_stopped_committer_holds_producers_at_its_drain_bytes_within_the_grace(
    make_store: StoreFactory,
) -> None:
    """The drain bound (`commit_backlog_drain_ms`, `ipc.commit_pace`): the committer
    times its commit steps and publishes what it commits in that many ms (at least
    4 MiB). With a fixed bound of 24 MiB and a grace of 10 minutes, a committer that
    stops still holds producers at its published drain bytes, not at the pool's end:
    the put that reaches them waits the busy timeout and is OS_PAGECACHE_BUSY naming
    both bounds; after SIGCONT puts go on, and the log holds every acknowledged put."""
    import signal
    import time

    from mqstore.ipc import control as c
    from mqstore.ipc.access import read_names
    from mqstore.ipc.control_views import Positions

    seg, bound = 8 << 20, 24 << 20
    st = make_store(
        {
            "flush_disk_type": "ASYNC_FLUSH",
            "segment_size_bytes": seg,
            "transient_store_pool_size": 4,
            "os_page_cache_busy_timeout_ms": 300,
            "commit_backlog_max_bytes": bound,
            "commit_backlog_grace_ms": 600_000,
            "commit_backlog_drain_ms": 1,
        }
    )
    st.wait_workers_running()
    committer = next(w for w in st.status()["workers"] if w["name"] == "committer")
    names = read_names(str(st.path))
    cb = c.ControlBlock.attach(names["ctl"], names.get("pool") or "")
    pos = Positions(cb)
    try:
        with StoreClient.attach(st.path) as client:
            oks: list[PutResult] = []

            def measured() -> bool:  # puts until the committer has timed enough steps
                for _ in range(2000):
                    r = client.put("drain", b"m" * 1000, wait_store=False)
                    assert r.status is OK, r
                    oks.append(r)
                return pos.commit_drain > 0

            wait_for(measured, 60, "the committer to publish its drain bytes")
            last = oks[-1]
            wait_for(lambda: pos.committed >= last.physical_offset + last.size)
            drain = pos.commit_drain
            assert 4 << 20 <= drain < bound, drain
            assert st.status()["commit_drain_bytes"] == drain  # `mqstore status` shows it
            os.kill(committer["pid"], signal.SIGSTOP)
            try:
                for _ in range(bound // 1000):
                    t0 = time.monotonic()
                    r = client.put("drain", b"z" * 1000, wait_store=False)
                    if r.status is not OK:
                        break
                    oks.append(r)
                took = time.monotonic() - t0
                assert r.status is PutMessageStatus.OS_PAGECACHE_BUSY, r
                assert r.reason == (
                    f"the commit backlog stayed at its bound (commit_backlog_max_bytes, {bound} "
                    "bytes, or commit_backlog_drain_ms of the committer's recent pace, "
                    f"{drain} bytes) and the committer did not move for 300 ms"
                )
                assert 0.25 <= took < 30, took
                backlog = pos.reserved - pos.committed
                assert drain <= backlog < drain + oks[-1].size, (backlog, drain)
            finally:
                os.kill(committer["pid"], signal.SIGCONT)
            after = wait_for(
                lambda: (x := client.put("drain", b"again", wait_store=False)).status is OK and x,
                30,
                "the committer to work the backlog off",
            )
            oks.append(after)
    finally:
        cb.close()
    assert st.stop() == 0
    recs = [r for r in st.read_log(keep_fillers=True) if r.topic == "drain"]
    assert len(recs) == len(oks)


def test_sync_puts_and_a_one_byte_backlog_bound_do_not_wait_on_each_other(
    make_store: StoreFactory,
) -> None:
    """Under SYNC_FLUSH a sync put's round commits what it waits for, so even a bound of
    one byte with no grace (every put waits until all before it is committed) holds no
    sync put back, and async puts between them wait only for the committer's next tick."""
    st = make_store({"commit_backlog_max_bytes": 1, "commit_backlog_grace_ms": 0})
    with StoreClient.attach(st.path) as client:
        rs = [client.put("sync", b"s" * 1000, queue_id=0) for _ in range(200)]
        rs += [client.put("sync", b"a" * 1000, queue_id=0, wait_store=False) for _ in range(50)]
        rs += [client.put("sync", b"s" * 1000, queue_id=0) for _ in range(20)]
        assert [r.status for r in rs] == [OK] * len(rs), {r.reason for r in rs}
        assert client.positions()["flushed"] >= rs[-1].physical_offset + rs[-1].size
    assert st.stop() == 0
    check_chain(st.read_log(keep_fillers=True), 1 << 20)
