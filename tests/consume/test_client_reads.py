"""The reads on `StoreClient` itself (thin delegates to `ipc.reads.ClientReads`)."""

from __future__ import annotations

from mqstore import GetMessageStatus, StoreClient
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store, wait_for


def test_store_client_reads_and_offsets(store: Store) -> None:
    with StoreClient.attach(store.path) as c:
        rs = [c.put("sc", b"m%d" % i, tags="t", keys=[f"k{i}"], queue_id=3) for i in range(5)]
        assert all(r.ok for r in rs)
        wait_for(lambda: c.max_offset("sc", 3) == 5, 30, "dispatch")
        got = c.pull("sc", 3, 0, 32, tags="t || u")
        assert got.status is GetMessageStatus.FOUND
        assert [m.body for m in got.messages] == [b"m%d" % i for i in range(5)]
        assert c.pull("sc", 3, 5, wait_ms=20).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        assert c.min_offset("sc", 3) == 0
        assert c.get(rs[2].physical_offset).body == b"m2"  # type: ignore[union-attr]
        assert c.get_by_msg_id(rs[4].msg_id).body == b"m4"  # type: ignore[union-attr]
        assert [m.body for m in c.query("sc", "k1")] == [b"m1"]
        assert c.offset_for_time("sc", 3, 0) == 0
        c.commit_offset("g", "sc", 3, got.next_offset)
        assert c.committed_offset("g", "sc", 3) == 5


def test_reads_use_the_settings_the_supervisor_sent_not_defaults(make_store: StoreFactory) -> None:
    """With `--config` outside the store directory and a non-default consume-queue size,
    a client that read before the first consume-queue file existed guessed the default
    6_000_000 bytes and failed forever with SegmentSizeError once the files appeared."""
    store = make_store({"consume_queue_file_size_bytes": 2000}, config_outside=True)
    with StoreClient.attach(store.path) as c:
        assert c.pull("cq", 0, 0).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        assert not list(store.path.glob("consumequeue/*/*/*"))  # nothing to guess from
        assert all(c.put("cq", b"m%d" % i, queue_id=0).ok for i in range(150))
        wait_for(lambda: c.max_offset("cq", 0) == 150, 30, "dispatch")
        got = [m.body for off in (0, 32, 64, 96, 128) for m in c.pull("cq", 0, off).messages]
        assert got == [b"m%d" % i for i in range(150)]
    sizes = {p.stat().st_size for p in store.path.glob("consumequeue/cq/0/*")}
    assert sizes == {2000}  # two files of 100 units: the reads crossed a file boundary
