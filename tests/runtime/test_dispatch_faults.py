"""A roll of the dispatcher process's C round fails -- the next consume-queue or index
file cannot be renamed into place (`MQSTORE_FAULTS=rename:...` for the dispatcher only,
the one fault seam, `engine.fileio`) -- in a real store under a producer; then the
store is restarted without the fault (the disk replaced, space freed) and recovery
re-dispatches what the queues and the index lack.

EIO turns the store read-only; ENOSPC is waited out (the dispatcher says so once, puts
go on) until the restart. Either way, after it every acknowledged message is pulled
exactly once from its queue, at dense queue offsets, and found by every one of its keys.
Small files (queue files of 32 units, index files of 127 keys, a message's 2-3 keys
straddling two of them) make the rolls the C round takes (`engine.dispatch`) frequent.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from mqstore import PutMessageStatus, StoreClient
from mqstore.engine.indexservice import IndexService
from mqstore.ipc.commit import pid_alive
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store, wait_for

CONFIG: dict[str, Any] = {
    "consume_queue_file_size_bytes": 20 * 32,
    "max_hash_slot_num": 64,
    "max_index_num": 128,
    "heartbeat_timeout_ms": 20_000,  # a busy CI machine is not what this tests
}
QUEUES = [("ta", 0), ("ta", 1), ("tb", 0)]


class Producer:
    """Puts with keys over QUEUES, keeping every acknowledged put and its keys."""

    def __init__(self, client: StoreClient) -> None:
        self.client = client
        self.acked: list[tuple[str, int, int, int, list[str]]] = []  # topic, q, qo, phys
        self.n = 0

    def put(self) -> Any:
        i = self.n
        self.n += 1
        topic, q = QUEUES[i % 7 % 3]
        keys = [f"k{i}", f"j{i}"][: 1 + i % 2]
        r = self.client.put(topic, b"%d:" % i + b"m" * (i % 90), keys=keys, queue_id=q)
        if r.status is PutMessageStatus.PUT_OK:
            self.acked.append((topic, q, r.queue_offset, r.physical_offset, keys))
        return r


def _caught_up(st: Store) -> bool:
    pos = st.status()["positions"]
    return bool(pos["dispatched"] == pos["flushed"] == pos["reserved"])


def _check_every_ack(st: Store, acked: list[tuple[str, int, int, int, list[str]]]) -> None:
    with StoreClient.attach(st.path) as client:
        for topic, q in QUEUES:
            want = [(qo, phys) for t, qq, qo, phys, _k in acked if (t, qq) == (topic, q)]
            got: list[tuple[int, int]] = []
            offset = 0
            while True:
                res = client.pull(topic, q, offset, 32)
                if not res.messages:
                    break
                got.extend((m.queue_offset, m.physical_offset) for m in res.messages)
                offset = res.next_offset
            # every put written was acknowledged (SYNC_FLUSH; a refused put writes
            # nothing): the queue holds exactly the acknowledged puts, in order
            assert got == want, (topic, q, len(got), len(want))
            assert [qo for qo, _p in got] == list(range(len(got))), (topic, q)
        for topic, _q, _qo, phys, keys in acked:
            for k in keys:
                found = [m.physical_offset for m in client.query(topic, k, max_count=64)]
                assert found.count(phys) == 1, (topic, k, phys, found)


@pytest.mark.parametrize(
    ("err", "after"),
    [
        ("EIO", 12),
        ("ENOSPC", 12),
        pytest.param("EIO", 30, marks=pytest.mark.slow),
        pytest.param("ENOSPC", 30, marks=pytest.mark.slow),
    ],
)
def test_a_failed_roll_loses_no_acknowledged_message(
    make_store: StoreFactory, err: str, after: int
) -> None:
    env = {
        "MQSTORE_FAULTS": f"rename:{err}",
        "MQSTORE_FAULTS_AFTER": str(after),  # the queues' first files, then rolls
        "MQSTORE_FAULTS_FOR": "dispatcher",
    }
    st = make_store(CONFIG, env=env)
    with StoreClient.attach(st.path) as client:
        prod = Producer(client)

        def failed() -> str | None:
            for _ in range(20):
                prod.put()
            doc = st.status()
            if err == "EIO":
                ro = doc.get("read_only")
                return None if not ro else str(ro["message"])
            waits = [ln for ln in st.output().splitlines() if "for space on the disk" in ln]
            return waits[0] if waits else None

        said: str = wait_for(failed, 120, f"the dispatcher's rename to fail with {err}")
        # a roll's file (a queue's next file, the next index file), not topics.json
        assert "/consumequeue/" in said or "/index/" in said, said
        for _ in range(100):  # and more puts while it is failed
            prod.put()
    assert prod.acked
    st.stop()
    st.start()  # without the fault: recovery re-dispatches what is missing
    wait_for(lambda: _caught_up(st), 60, "the dispatcher to catch up after the restart")
    _check_every_ack(st, prod.acked)
    with StoreClient.attach(st.path) as client:  # and the store takes puts again
        prod.client = client
        for _ in range(50):
            assert prod.put().status is PutMessageStatus.PUT_OK
    wait_for(lambda: _caught_up(st), 60, "the dispatcher to catch up")
    _check_every_ack(st, prod.acked)
    assert st.stop() == 0


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


def _kill_whole_store(st: Store) -> None:
    """SIGKILL to the supervisor and every worker at once, as kill -9 of the group."""
    assert st.proc is not None
    group = [st.proc.pid] + [w["pid"] for w in st.status()["workers"] if w["pid"]]
    for pid in group:
        os.kill(pid, signal.SIGKILL)
    st.proc.wait()
    st.proc = None
    st._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in group), 30, "the store's processes to die")


@pytest.mark.parametrize(
    ("point", "nth"), [("index-roll", 2), ("index-roll", 3), ("index-roll-made", 2)]
)
def test_a_store_killed_inside_an_index_roll_loses_no_key(
    make_store: StoreFactory, point: str, nth: int
) -> None:
    """The whole store SIGKILLed while its dispatcher is inside an index roll
    (`MQSTORE_CRASHPOINT=<point>:stop:<nth>`, the real roll of `IndexService._last_file`:
    `index-roll` with the full file's last record's keys only partly in it and no next
    file; `index-roll-made` with the next file made and empty), with puts acknowledged
    after it. The next start is an abnormal recovery: every acknowledged put is pulled
    exactly once and found by every one of its keys. Rolls 2 and 3 split a record (127
    keys a file, 2 and 3 keys a put in turn; roll 1 falls between two records).

    At roll 3 the record roll 2 split has its last keys in the newest file, which
    recovery destroys (newer than the checkpoint, which the flushed second file's end
    reached), and its first keys at the kept second file's end: before recovery cut
    them (`recovery.load_store`), the record counted as indexed and lost its last keys
    (j101 or k101)."""
    st = make_store(CONFIG, env={"MQSTORE_CRASHPOINT": f"{point}:stop:{nth}"})
    disp = next(w["pid"] for w in st.status()["workers"] if w["name"] == "dispatcher")
    with StoreClient.attach(st.path) as client:
        prod = Producer(client)

        def in_roll() -> bool:
            for _ in range(10):
                prod.put()
            return _stopped(disp)

        wait_for(in_roll, 120, f"the dispatcher to stop at {point} #{nth}")
        for _ in range(50):  # acknowledged after the roll began: the flusher goes on
            assert prod.put().status is PutMessageStatus.PUT_OK
    _kill_whole_store(st)
    # what the kill left: a full index file whose last record has keys it lacks
    idx = IndexService(st.path, CONFIG["max_hash_slot_num"], CONFIG["max_index_num"],
                       read_only=True)  # fmt: skip
    idx.load()
    try:
        files = idx.files
        if point == "index-roll-made":
            assert files[-1].index_count == 1, files
            files = files[:-1]
        assert len(files) == nth and files[-1].is_write_full(), files
        split = files[-1].end_phy_offset
        keys = next(k for _t, _q, _qo, phys, k in prod.acked if phys == split)
        put = sum(phys == split for _n, _h, phys, _d, _p in files[-1].entries())
        assert 0 < put < len(keys) + 1, (put, keys)  # its UNIQ_KEY, then its keys
    finally:
        idx.close()
    st.start()  # without the crash point
    assert json.loads((st.path / "recovery.json").read_text())["mode"] == "abnormal"
    wait_for(lambda: _caught_up(st), 60, "the dispatcher to catch up after recovery")
    _check_every_ack(st, prod.acked)
    assert st.stop() == 0
