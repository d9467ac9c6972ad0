"""Reads of a running store (`ipc.reads.ClientReads`): pull under load from several
producer processes, tags, long polling, get / get_by_msg_id / query / offset_for_time,
consumer offsets across a restart."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from mqstore.ipc.client import StoreClient
from mqstore.ipc.read_results import GetMessageStatus, PullResult
from mqstore.ipc.reads import ClientReads, for_client
from tests.consume.helpers import acked, pull_all, start_producer
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store, wait_for

S = GetMessageStatus


@pytest.fixture
def client(store: Store) -> Iterator[StoreClient]:
    store.wait_workers_running()
    with StoreClient.attach(store.path) as c:
        yield c


@pytest.fixture
def reads(client: StoreClient) -> Iterator[ClientReads]:
    with for_client(client) as r:
        yield r


def _all_dispatched(st: Store) -> bool:
    pos = st.status()["positions"]
    return bool(pos["dispatched"] == pos["flushed"] == pos["reserved"])


def test_every_acknowledged_message_pulled_once_in_order(store: Store, reads: ClientReads) -> None:
    procs = [start_producer(store.path, "load", f"p{k}", 250) for k in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    acks = [a for out in outs for a in acked(out)]
    assert len(acks) == 750, [ln for out in outs for ln in out.splitlines() if "failed" in ln]
    wait_for(lambda: _all_dispatched(store), 60, "the dispatcher to catch up")
    seen: list[str] = []
    for q in range(4):
        got = pull_all(reads, "load", q)
        assert [m.queue_offset for m in got] == list(range(len(got)))
        want = sorted((a for a in acks if a[0] == q), key=lambda a: a[1])
        assert [(m.queue_offset, m.physical_offset, m.body.decode()) for m in got] == [
            (a[1], a[2], a[3]) for a in want
        ]
        for name in ("p0", "p1", "p2"):  # each producer's messages keep their order
            mine = [int(m.body.decode().split("-")[1]) for m in got if m.tags == name]
            assert mine == sorted(mine)
        seen += [m.body.decode() for m in got]
    assert sorted(seen) == sorted(a[3] for a in acks)


def test_tags_filter(client: StoreClient, reads: ClientReads, store: Store) -> None:
    tags = ["a", "b", "c", "b", "a", "c", "b"]
    for i, t in enumerate(tags):
        assert client.put("tags", b"m%d" % i, tags=t, queue_id=0).ok
    wait_for(lambda: reads.max_offset("tags", 0) == len(tags), 30, "dispatch")
    r = reads.pull("tags", 0, 0, 32, tags="a || c")
    assert r.status is S.FOUND
    assert [(m.body, m.tags) for m in r.messages] == [
        (b"m0", "a"), (b"m2", "c"), (b"m4", "a"), (b"m5", "c")
    ]  # fmt: skip
    assert r.next_offset == 7  # as RocketMQ: every scanned unit is consumed, matching or not
    r = reads.pull("tags", 0, 6, 32, tags="a")
    assert r.status is S.NO_MATCHED_MESSAGE and r.next_offset == 7
    assert len(reads.pull("tags", 0, 0, 32, tags="*").messages) == len(tags)


def test_statuses(client: StoreClient, reads: ClientReads) -> None:
    assert reads.pull("nothing", 0, 0).status is S.NO_MATCHED_LOGIC_QUEUE
    for i in range(3):
        assert client.put("st", b"%d" % i, queue_id=1).ok
    wait_for(lambda: reads.max_offset("st", 1) == 3, 30, "dispatch")
    r = reads.pull("st", 1, 3)
    assert (r.status, r.next_offset, r.min_offset, r.max_offset) == (S.OFFSET_OVERFLOW_ONE, 3, 0, 3)
    assert reads.pull("st", 1, 9).status is S.OFFSET_OVERFLOW_BADLY
    r = reads.pull("st", 1, 1, 1)
    assert r.found and [m.body for m in r.messages] == [b"1"] and r.next_offset == 2
    assert reads.min_offset("st", 1) == 0
    with pytest.raises(ValueError):
        reads.pull("st", 1, 0, 0)


def test_long_polling_wakes_when_a_message_arrives(client: StoreClient, store: Store) -> None:
    assert client.put("lp", b"first", queue_id=0).ok
    with for_client(client) as reads:
        wait_for(lambda: reads.max_offset("lp", 0) == 1, 30, "dispatch")
        r = reads.pull("lp", 0, 1, wait_ms=50)  # nothing comes: it gives up
        assert r.status is S.OFFSET_OVERFLOW_ONE
    got: list[PullResult] = []
    started = threading.Event()

    def consumer() -> None:
        with StoreClient.attach(store.path) as c2, for_client(c2) as r2:
            started.set()
            got.append(r2.pull("lp", 0, 1, wait_ms=60_000))

    t = threading.Thread(target=consumer)
    t.start()
    started.wait(30)
    assert client.put("lp", b"second", queue_id=0).ok
    t.join(90)
    assert not t.is_alive()
    assert got[0].status is S.FOUND and [m.body for m in got[0].messages] == [b"second"]


def test_get_msg_id_query_and_time(client: StoreClient, reads: ClientReads) -> None:
    rs = [client.put("q", b"v%d" % i, keys=[f"k{i % 5}", "all"], queue_id=i % 2) for i in range(20)]
    assert all(r.ok for r in rs)
    wait_for(lambda: reads.max_offset("q", 0) + reads.max_offset("q", 1) == 20, 30, "dispatch")
    for i in (0, 7, 19):
        r = rs[i]
        m = reads.get(r.physical_offset)
        assert m is not None and m.msg_id == r.msg_id and m.body == b"v%d" % i
        m = reads.get_by_msg_id(r.msg_id)
        assert m is not None and m.physical_offset == r.physical_offset and m.body == b"v%d" % i
    assert reads.get(rs[-1].physical_offset + rs[-1].size + 10**9) is None
    assert [m.body for m in reads.query("q", "k3")] == [b"v3", b"v8", b"v13", b"v18"]
    assert len(reads.query("q", "all", max_count=7)) == 7
    assert reads.query("q", "k3", end_ms=rs[0].store_timestamp - 1) == []
    assert reads.query("other", "k3") == []
    m = rs[10]
    qo = reads.offset_for_time("q", m.queue_id, m.store_timestamp)
    assert qo <= m.queue_offset
    first = reads.pull("q", m.queue_id, qo, 1).messages[0]
    assert first.store_timestamp >= m.store_timestamp or first.queue_offset == 0


def test_consumer_offsets_survive_a_restart(make_store: StoreFactory) -> None:
    st = make_store()
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        for i in range(10):
            assert c.put("co", b"%d" % i, queue_id=2).ok
        wait_for(lambda: reads.max_offset("co", 2) == 10, 30, "dispatch")
        got = reads.pull("co", 2, 0, 4)
        reads.commit_offset("grp", "co", 2, got.next_offset)
        assert reads.committed_offset("grp", "co", 2) == 4
        assert reads.committed_offset("grp", "co", 3) == -1
    assert st.stop() == 0
    st.start()
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        start = reads.committed_offset("grp", "co", 2)
        assert start == 4
        rest = pull_all(reads, "co", 2, start)
        assert [m.body for m in rest] == [b"%d" % i for i in range(4, 10)]


def test_reads_follow_new_segments_and_queue_files(make_store: StoreFactory) -> None:
    st = make_store(
        {
            "segment_size_bytes": 32768,
            "consume_queue_file_size_bytes": 20 * 50,
            "transient_store_pool_size": 2,
        }
    )
    st.wait_workers_running()
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        assert reads.pull("roll", 0, 0).status is S.NO_MATCHED_LOGIC_QUEUE  # maps opened now
        body = b"r" * 500
        rs = [c.put("roll", body + b"%d" % i, queue_id=0) for i in range(300)]
        assert all(r.ok for r in rs)
        assert rs[-1].physical_offset > 4 * 32768  # several segments, six queue files
        wait_for(lambda: reads.max_offset("roll", 0) == 300, 60, "dispatch")
        got = pull_all(reads, "roll", 0)
        assert [m.physical_offset for m in got] == [r.physical_offset for r in rs]
        last = reads.get_by_msg_id(rs[-1].msg_id)
        assert last is not None and last.body == body + b"299"


def test_one_reader_across_a_restart(make_store: StoreFactory) -> None:
    st = make_store()
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        assert c.put("rs", b"before", queue_id=0).ok
        wait_for(lambda: reads.max_offset("rs", 0) == 1, 30, "dispatch")
        assert st.stop() == 0
        st.start()
        st.wait_workers_running()
        assert c.put("rs", b"after", queue_id=0).ok  # the client re-attaches
        wait_for(lambda: reads.max_offset("rs", 0) == 2, 30, "dispatch after the restart")
        assert [m.body for m in pull_all(reads, "rs", 0)] == [b"before", b"after"]
