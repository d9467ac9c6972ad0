"""`mqstore topic DIR delete T` on a running store while a group consumes T
(`workers.group_coord._topic_deleted`): the members' grants of T end, the offsets they
kept in memory are never committed again, and T's new queues are consumed from their
first message."""

from __future__ import annotations

import subprocess
import sys

from mqstore import StoreClient
from mqstore.engine.offsets import ConsumerOffsets
from tests.groups.helpers import info
from tests.runtime.harness import REPO, Store, wait_for


def test_a_deleted_topics_grants_end_and_its_old_offsets_are_never_committed_again(
    make_store: object,
) -> None:
    store: Store = make_store({"default_topic_queue_nums": 2})  # type: ignore[operator]
    offsets = ConsumerOffsets(store.path)
    with StoreClient.attach(store.path) as client:
        for i in range(40):
            assert client.put("t", b"old-%d" % i, queue_id=i % 2).ok
        c = client.consumer("g", "t", retry=False)
        got = []
        while len(got) < 40:
            got += c.poll(64, 1.0)
        # queue 0's last message is delivered, and acked only after the deletion; the
        # order of delivery across queues is not fixed, so it is picked by place
        held = next(m for m in got if m.queue_id == 0 and m.queue_offset == 19)
        for m in got:
            if m is not held:
                assert c.ack(m)
        wait_for(lambda: offsets.committed("g", "t", 0) == 19, 10, "offsets persisted")
        rebalances = c.rebalances
        run = subprocess.run(
            [sys.executable, "-m", "mqstore", "topic", str(store.path), "delete", "t"],
            capture_output=True, text=True, cwd=str(REPO), timeout=120, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        # the member's grants of t end (cancelled): the ack of a message of the deleted
        # topic no longer counts, and nothing of it reaches the offsets again
        wait_for(lambda: c.rebalances > rebalances, 10, "the member to drop t's grants")
        assert not c.ack(held)
        for i in range(6):  # the new t: queue offsets from 0
            assert client.put("t", b"new-%d" % i, queue_id=i % 2).ok
        new = []
        wait_for(lambda: bool(new.extend(c.poll(64, 0.2))) or len(new) >= 6, 20, "new t")
        assert sorted(m.body for m in new) == [b"new-%d" % i for i in range(6)]
        assert c.ack_many(new) == 6
        wait_for(
            lambda: {q["offset"] for q in info(store.path, "g")["queues"]} == {3},
            10,
            "the new queues' offsets",
        )
        c.close()
    assert store.stop() == 0
    assert {offsets.committed("g", "t", q) for q in (0, 1)} == {3}
