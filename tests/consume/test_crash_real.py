"""Crashes and real stores through `pull`: kill -9 of the whole store under sync load, then
every acknowledged message exactly once; RocketMQ 4.2's own store after abnormal
recovery."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from mqstore.ipc.client import StoreClient
from mqstore.ipc.commit import pid_alive
from mqstore.ipc.reads import for_client
from tests.consume.helpers import acked, pull_all, start_producer
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store, wait_for


def _caught_up(st: Store) -> bool:
    pos = st.status()["positions"]
    return bool(pos["dispatched"] == pos["flushed"] == pos["reserved"])


@pytest.mark.slow
def test_kill_9_under_sync_load_then_every_ack_exactly_once(make_store: StoreFactory) -> None:
    st = make_store()
    st.wait_workers_running()
    procs = [start_producer(st.path, "crash", f"p{k}", 0) for k in range(3)]
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        wait_for(lambda: reads.max_offset("crash", 0) > 40, 60, "some load to be dispatched")
        committed = reads.pull("crash", 0, 0, 16).next_offset
        reads.commit_offset("g", "crash", 0, committed)
    assert st.proc is not None
    group = [st.proc.pid] + [w["pid"] for w in st.status()["workers"] if w["pid"]]
    for pid in group:  # the supervisor and its workers die at once, as kill -9 of the group
        os.kill(pid, signal.SIGKILL)
    for p in procs:
        p.kill()
    outs = [p.communicate(timeout=60)[0] for p in procs]
    st.proc.wait()
    st.proc = None
    st._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in group), 30, "the store's processes to die")
    acks = [a for out in outs for a in acked(out)]
    assert len(acks) > 40
    st.start()
    st.wait_workers_running()
    assert json.loads((st.path / "recovery.json").read_text())["mode"] == "abnormal"
    wait_for(lambda: _caught_up(st), 60, "the dispatcher to catch up after recovery")
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        assert reads.committed_offset("g", "crash", 0) == committed
        bodies: list[str] = []
        for q in range(4):
            got = pull_all(reads, "crash", q)
            assert [m.queue_offset for m in got] == list(range(len(got)))
            bodies += [m.body.decode() for m in got]
            by_body = {m.body.decode(): m for m in got}
            for qid, qo, phys, body in acks:
                if qid == q:
                    m = by_body[body]
                    assert (m.queue_offset, m.physical_offset) == (qo, phys)
        assert len(bodies) == len(set(bodies))  # nothing twice
        assert {a[3] for a in acks} <= set(bodies)  # every acknowledged message


def test_real_rocketmq_42_store_pulls_its_179_messages(
    make_store: StoreFactory, real_store_copy: Callable[[str], Path]
) -> None:
    d = real_store_copy("broker-4.2-unit-store")
    st = Store(
        d,
        {
            "segment_size_bytes": 8192,
            "consume_queue_file_size_bytes": 200,
            "transient_store_pool_enable": False,
        },
    )
    try:
        st.start()
        st.wait_workers_running()
        report = json.loads((d / "recovery.json").read_text())
        assert report["mode"] == "abnormal"
        with StoreClient.attach(d) as c, for_client(c) as reads:
            wait_for(lambda: reads.max_offset("abc", 0) == 179, 60, "179 messages pullable")
            got = pull_all(reads, "abc", 0)
            assert [m.queue_offset for m in got] == list(range(179))
            assert all(m.topic == "abc" and m.queue_id == 0 for m in got)
            phys = [m.physical_offset for m in got]
            assert phys == sorted(phys)
            assert reads.get_by_msg_id(got[100].msg_id) is not None
        assert st.stop() == 0
    finally:
        st.stop()
    assert st.shm_leftovers() == []
