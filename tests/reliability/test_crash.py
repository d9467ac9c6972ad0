"""Crash suite: under mixed sync/async load (single puts and batches, several topics and
queues), SIGKILL a producer mid-append, each worker, the supervisor or the whole process
group at a random point; restart when the supervisor does not recover by itself; stop,
then check every invariant (tests/reliability/verify.py) after every cycle.

Sizes: one cycle per kind by default, 25 per kind (200 in all) under
MQSTORE_RELIABILITY_FULL=1. Failures name the seed (MQSTORE_RELIABILITY_SEED=<seed>
replays the same kill points)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from mqstore.ipc.commit import pid_alive
from tests.reliability.conftest import FIGURES, sized
from tests.reliability.verify import verify, verify_queues
from tests.reliability.workload import Acks
from tests.runtime.harness import REPO, Store, wait_for

WORKERS = ("committer", "flusher", "allocator", "dispatcher", "cleaner", "scheduler")
KINDS = ("client", *WORKERS, "supervisor", "group")


class GroupStore(Store):
    """A Store whose supervisor leads its own process group (so it can be killed whole)."""

    def start(self, env: Mapping[str, str] | None = None, *, wait: bool = True) -> None:
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore", "start", str(self.path)],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO),
            start_new_session=True,
        )  # fmt: skip
        if wait:
            wait_for(self._up, 60, "the supervisor to answer")

    def forget_proc(self) -> None:
        assert self.proc is not None
        self.proc.wait(60)
        self.proc = None
        self._log.close()


class Producer:
    """A workload child whose acknowledgements are read by a thread into `acks`."""

    def __init__(self, store: Store, tag: str, seed: int) -> None:
        self.tag = tag
        self.acks = Acks()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.workload", str(store.path), tag, str(seed)],
            stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
        )  # fmt: skip
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.acks.feed(line)

    def wait_acks(self, n: int, what: str) -> None:
        def enough() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"producer {self.tag} exited with {self.proc.returncode}")
            return self.acks.count >= n

        wait_for(enough, 120, what)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._t.join(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def group_store(tmp_path: Path) -> Iterator[GroupStore]:
    st = GroupStore(tmp_path / "store")
    st.start()
    yield st
    if st.proc is not None and st.proc.poll() is None:
        st.stop()
    elif st.proc is not None:
        st.forget_proc()
    assert st.shm_leftovers() == [], "shared memory left behind"


def _worker(st: Store, name: str) -> dict[str, int]:
    w: dict[str, int] = next(w for w in st.status()["workers"] if w["name"] == name)
    return w


def crash_once(st: GroupStore, kind: str, rng: random.Random, tag: str, why: str) -> Acks:
    """One cycle: load, kill `kind`, recover, load again, kill the producer. Returns the
    producer's acknowledgements."""
    prod = Producer(st, tag, rng.randrange(1 << 30))
    try:
        prod.wait_acks(rng.randint(1, 80), f"first acks {why}")
        if kind == "client":
            return prod.acks
        assert st.proc is not None
        if kind in WORKERS:
            st.wait_workers_running()
            before = _worker(st, kind)
            os.kill(before["pid"], signal.SIGKILL)

            def restarted() -> bool:
                w = _worker(st, kind)
                return w["restarts"] > before["restarts"] and w["pid"] not in (0, before["pid"])

            wait_for(restarted, 60, f"{kind} to be restarted {why}")
        else:
            workers = [w["pid"] for w in st.status()["workers"]]
            if kind == "supervisor":
                st.proc.kill()
            else:
                os.killpg(st.proc.pid, signal.SIGKILL)
            st.forget_proc()
            wait_for(lambda: not any(pid_alive(p) for p in workers), 60, f"workers gone {why}")
            st.start()
        st.wait_workers_running()
        n = prod.acks.count
        prod.wait_acks(n + rng.randint(1, 40), f"acks after the {kind} crash {why}")
        return prod.acks
    finally:
        prod.kill()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_crash_cycles(group_store: GroupStore, kind: str, seed: int) -> None:
    cycles = int(os.environ.get("MQSTORE_RELIABILITY_CYCLES", 0)) or sized(1, 25)
    rng = random.Random(f"{seed}-{kind}")
    acks: dict[str, Acks] = {}
    for cycle in range(cycles):
        why = f"(kind {kind}, cycle {cycle}, seed {seed})"
        tag = f"{kind}{cycle}"
        acks[tag] = crash_once(group_store, kind, rng, tag, why)
        code = group_store.stop()
        assert code == 0, f"supervisor exited {code} {why}: {group_store.output()[-2000:]}"
        o = verify(group_store, acks, async_loss_allowed=kind == "group")
        assert not o.sync_lost, f"SYNC-acknowledged messages lost {why}: {o.sync_lost[:10]}"
        assert not o.problems, f"{why}: {o.problems[:10]}"
        group_store.start()
        queues = verify_queues(group_store)
        assert not queues, f"{why}: {queues[:10]}"
        FIGURES[f"crashes survived: {kind}"] += 1
        FIGURES["acknowledged messages checked (sync)"] += len(acks[tag].sync)
        FIGURES["acknowledged messages checked (async)"] += len(acks[tag].asyn)
        FIGURES["acknowledged messages lost (sync)"] += len(o.sync_lost)
        if cycle == cycles - 1:
            FIGURES[f"async-acknowledged lost after {kind} kills (allowed)"] += o.async_lost


def test_put_soon_after_a_refused_put_returns_a_status(group_store: GroupStore) -> None:
    from mqstore import PutMessageStatus, StoreClient

    with StoreClient.attach(group_store.path) as client:
        assert client.put("t", b"up").ok
        assert group_store.stop() == 0
        first = client.put("t", b"down")
        assert first.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        second = client.put("t", b"down again")  # raises AttributeError: '_buf'
        assert second.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
