"""Nothing acknowledged is lost on a bad day (issue 24): fencing, batches all or nothing,
the store's lock, and a scribbled control block, with real processes.

A producer SIGSTOPs itself in the middle of the real C copy (the crash points,
docs/crash-points.md), sleeps through a stop and start or a SIGKILL of the supervisor
and a restart, then resumes: its put must not be PUT_OK, and what it writes with its
stale mappings must not cost any acknowledged message. Each test ends with a SIGKILL of
the supervisor and an abnormal recovery (which checks every record's CRC), so a torn
record in the log would cut it there and lose what follows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mqstore import PutMessageStatus, StoreClient
from mqstore.ipc import control as c
from mqstore.ipc.commit import pid_alive
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, check_chain, wait_for

OK = PutMessageStatus.PUT_OK


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _producer(store: Store, mode: str, point: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MQSTORE_CRASHPOINT": point}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.helpers_child", mode, str(store.path)],
        stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
    )  # fmt: skip


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Producers the test starts: killed (and reaped) whatever happens."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def _stopped_in_copy(store: Store, children: list[subprocess.Popen[str]], mode: str) -> int:
    """A producer stopped by itself halfway through the body of its second record copy
    (its first is the warm-up put)."""
    child = _producer(store, mode, "copy-half:stop:2")
    children.append(child)
    wait_for(lambda: _state(child.pid) == "T", 60, "the producer to stop itself")
    return child.pid


def _resume(child: subprocess.Popen[str]) -> list[str]:
    """SIGCONT, wait for the exit, its printed statuses."""
    os.kill(child.pid, signal.SIGCONT)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, (child.returncode, out)
    return out.split()


def _put(client: StoreClient, prefix: str, n: int, *, wait: bool = True) -> list[bytes]:
    bodies = [b"%s-%d" % (prefix.encode(), i) for i in range(n)]
    for i, body in enumerate(bodies):
        r = client.put("acked", body, queue_id=i % 2, wait_store=wait)
        assert r.status is OK, (body, r.status, r.reason)
    return bodies


def _kill_supervisor(store: Store) -> None:
    """SIGKILL the supervisor and wait for its workers to drain and exit."""
    workers = [w["pid"] for w in store.status()["workers"]]
    assert store.proc is not None
    store.proc.kill()
    store.proc.wait()
    store.proc = None
    store._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 60, "the orphaned workers to exit")


def _readable(store: Store) -> list[bytes]:
    """Every record body after an abnormal recovery (the store stopped by a SIGKILL and
    started again, which validates every record's CRC), then a clean stop."""
    store.start()
    _kill_supervisor(store)
    store.start()
    assert store.stop() == 0
    recs = store.read_log()
    check_chain(store.read_log(keep_fillers=True), store.config["segment_size_bytes"])
    return [r.body for r in recs]


@pytest.mark.slow
@pytest.mark.parametrize("pool", [True, False], ids=["pool", "no-pool"])
@pytest.mark.parametrize("restart", ["stop", "kill"])
def test_a_producer_that_sleeps_through_a_restart_is_fenced(
    make_store: StoreFactory, children: list[subprocess.Popen[str]], pool: bool, restart: str
) -> None:
    """Stopped mid-copy, resumed after `mqstore stop` + start, or after a SIGKILL of the
    supervisor + start: its put is SERVICE_NOT_AVAILABLE (the filler or the fence had
    its slot), its record is never read, and every acknowledged message survives its
    stale mapping (pool off: the files it maps are unlinked inodes by then)."""
    store = make_store({"transient_store_pool_enable": pool, "segment_size_bytes": 1 << 18})
    with StoreClient.attach(store.path) as client:
        acked = _put(client, "before", 40)
        pid = _stopped_in_copy(store, children, "put-twice")
        if restart == "stop":
            # no-wait puts: in the pool or the page cache behind the stopped one; the
            # stop fills its slot and flushes them
            acked += _put(client, "behind", 20, wait=False)
            assert store.stop() == 0
        else:
            _kill_supervisor(store)
        store.start()
        acked += _put(client, "after", 200)  # over where the sleeper writes, for no-pool
        assert _state(pid) == "T"
        statuses = _resume(children[0])
        assert statuses == ["PUT_OK", "SERVICE_NOT_AVAILABLE"], statuses
        acked += _put(client, "later", 20)
    assert store.stop() == 0
    bodies = _readable(store)
    assert b"crash" not in bodies
    missing = [b for b in acked if b not in set(bodies)]
    assert missing == [], f"{len(missing)} of {len(acked)} acknowledged lost: {missing[:5]}"


@pytest.mark.slow
def test_a_batch_that_sleeps_through_a_restart_is_fenced_whole(
    make_store: StoreFactory, children: list[subprocess.Popen[str]]
) -> None:
    """A batch stopped in the copy of its first message, resumed after a stop and a
    start: all eight answer SERVICE_NOT_AVAILABLE and none of them is read (the stop
    filled them together)."""
    store = make_store()
    with StoreClient.attach(store.path) as client:
        acked = _put(client, "before", 10)
        _stopped_in_copy(store, children, "batch")
        assert store.stop() == 0
        store.start()
        acked += _put(client, "after", 10)
        statuses = _resume(children[0])
        assert statuses[0] == "PUT_OK" and set(statuses[1:]) == {"SERVICE_NOT_AVAILABLE"}
    assert store.stop() == 0
    bodies = _readable(store)
    assert [b for b in bodies if b.startswith(b"batch-")] == []
    assert [b for b in acked if b not in set(bodies)] == []


@pytest.mark.slow
@pytest.mark.parametrize("nth", [3, 6, 9])
def test_a_batch_is_all_or_nothing_when_its_producer_dies_in_it(
    make_store: StoreFactory, nth: int
) -> None:
    """SIGKILLed halfway through the copy of the 2nd, 5th or 8th message of a batch of
    eight (the C put): the committer fills all eight, none is read, and the queue's
    offsets go on after them."""
    store = make_store()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MQSTORE_CRASHPOINT": f"copy-half:kill:{nth}"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.runtime.helpers_child", "batch", str(store.path)],
        capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    with StoreClient.attach(store.path) as client:
        wait_for(lambda: store.status()["fillers"] == 8, 30, "the batch's fillers")
        r = client.put("batch", b"next", queue_id=0)
        assert r.status is OK and r.queue_offset == 9, (r.status, r.reason, r.queue_offset)
    assert store.stop() == 0
    recs = store.read_log(keep_fillers=True)
    check_chain(recs, store.config["segment_size_bytes"])
    assert [x.body for x in store.read_log()] == [b"warm", b"next"]


@pytest.mark.slow
def test_deleting_the_lock_file_does_not_let_a_second_supervisor_in(
    make_store: StoreFactory,
) -> None:
    """`rm lock` while the store runs, then `mqstore start`: refused (the lock is the
    store directory's own flock), and the running store goes on losing nothing."""
    store = make_store()
    with StoreClient.attach(store.path) as client:
        acked = _put(client, "before", 50)
        os.unlink(store.path / "lock")
        second = subprocess.Popen(
            [sys.executable, "-m", "mqstore", "start", str(store.path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO),
        )  # fmt: skip
        try:
            out, _ = second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            second.kill()
            out, _ = second.communicate()
            raise AssertionError(f"a second supervisor runs the store: {out}") from None
        assert second.returncode == 4, out
        assert "locked by another supervisor" in out, out
        acked += _put(client, "after", 50)
    assert store.stop() == 0
    bodies = store.read_log()
    assert [r.body for r in bodies] == acked


_PUT_ONE = """
import sys
from mqstore import StoreClient
with StoreClient.attach(sys.argv[1], timeout_s=5) as c:
    r = c.put("t", b"x", queue_id=0)
    print(r.status.name, r.reason)
"""


def _put_in_child(store: Store) -> subprocess.CompletedProcess[str]:
    """A put in its own process: a signal would kill it, not the test."""
    return subprocess.run(
        [sys.executable, "-c", _PUT_ONE, str(store.path)],
        capture_output=True, text=True, cwd=str(REPO), timeout=120,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "field",
    ["reserved-negative", "cs-seq-huge", "slot-count-zero", "pool-buffers-zero", "published-ahead"],
)
def test_a_scribbled_control_block_gives_read_only_never_a_signal(
    make_store: StoreFactory, field: str
) -> None:
    """Same-user writes into the control block (outside the trust model): no process
    dies by a signal, the store turns read-only naming the damage, puts get a status,
    and after a restart every message acknowledged before is readable."""
    store = make_store()
    store.wait_workers_running()  # a worker that boots on a damaged block halts the store
    with StoreClient.attach(store.path) as client:
        acked = _put(client, "before", 30)
        cb = client.live_control_block()
        if field == "reserved-negative":
            cb.set(c.OFF_RESERVED, -4096)
        elif field == "cs-seq-huge":
            cb.set(c.OFF_CS_SEQ, -(1 << 40))
            cb.set(c.OFF_CS_PID, 1)
        elif field == "slot-count-zero":
            cb.set(c.OFF_SLOT_COUNT, 0)
        elif field == "pool-buffers-zero":
            cb.set(c.OFF_POOL_BUFFERS, 0)
        else:
            cb.set(c.OFF_PUBLISHED, cb.get(c.OFF_PUBLISHED) + (1 << 20))
        if field == "cs-seq-huge":  # repaired by the next locker: the store is fine
            got = _put_in_child(store)
            assert got.returncode == 0 and got.stdout.startswith("PUT_OK"), got
        else:
            wait_for(lambda: store.status().get("read_only"), 10, "the store to be read-only")
            reason = store.status()["read_only_reason"]
            assert "control block was overwritten" in reason, reason
            got = _put_in_child(store)  # refused, or its attach refuses the block
            assert got.returncode in (0, 1) and not got.stdout.startswith("PUT_OK"), got
        r = client.put("acked", b"after", queue_id=0)
        assert (r.status is OK) == (field == "cs-seq-huge"), (r.status, r.reason)
        time.sleep(0.5)  # the workers' next rounds over the damaged block
        exits = {w["name"]: w["last_exit"] for w in store.status()["workers"]}
        assert all(code is None or code >= 0 for code in exits.values()), exits
        assert store.proc is not None and store.proc.poll() is None
    store.stop()
    store.start()
    assert store.stop() == 0
    bodies = [r.body for r in store.read_log()]
    assert [b for b in acked if b not in set(bodies)] == []
