"""`mqstore demo` against a running store, and `make run`'s demo (workers.demo_run) in a
bounded run: the store checks out afterwards, nothing is left in /dev/shm or running."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from mqstore.ipc.control import leftover_shm
from mqstore.workers.commands.demo import percentile
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _processes_mentioning(path: Path) -> list[str]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(path) in cmd:
            out.append(f"{p.info['pid']}: {cmd}")
    return out


def test_percentile_of_buckets() -> None:
    from collections import Counter

    from mqstore.workers.commands.demo import _bucket

    hist = Counter(_bucket(us) for us in [10.0] * 99 + [1000.0])
    assert 10 <= percentile(hist, 0.5) <= 10.5
    assert 10 <= percentile(hist, 0.99) <= 10.5
    assert 1000 <= percentile(hist, 1.0) <= 1050
    assert percentile(Counter(), 0.99) == 0.0


def test_demo_command_against_a_running_store(store: Store) -> None:
    """The consumer reads the consume queues through engine.reader."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "mqstore", "demo", str(store.path), "--producers", "1",
            "--sync-producers", "2", "--messages", "3000", "--body-bytes", "100",
            "--consumer", "--json",
        ],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=str(REPO),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["good"] and doc["puts"] == doc["ok"] == 3000 and doc["failed"] == 0
    assert doc["statuses"] == {"PUT_OK": 3000}
    assert doc["latency_us"]["sync"]["count"] == 2000
    assert doc["latency_us"]["async"]["count"] == 1000
    assert doc["consumer"] == {
        "read": 3000, "expected": 3000, "duplicates": 0, "missing": 0, "complete": True,
    }  # fmt: skip
    assert store.stop() == 0
    bodies = [r.body for r in store.read_log() if r.topic == "demo"]
    assert len(bodies) == 3000 and len(set(bodies)) == 3000
    assert all(len(b) == 100 for b in bodies)


def test_demo_command_without_a_store(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mqstore", "demo", str(tmp_path), "--messages", "10"],
        capture_output=True, text=True, timeout=60, env=_env(), cwd=str(REPO),
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no supervisor" in proc.stderr


@pytest.mark.slow
def test_make_run_bounded_demo_stops_cleanly_and_checks_out(tmp_path: Path) -> None:
    store = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable, "-m", "mqstore.workers.demo_run", str(store), "--seconds", "6",
            "--load-seconds", "2", "--producers", "1", "--sync-producers", "1", "--json",
        ],
        capture_output=True, text=True, timeout=180, env=_env(), cwd=str(REPO),
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "consumer: read" in out and "0 duplicates, 0 missing" in out
    assert "status: reserved" in out  # the live status while the store keeps running
    assert "$ mqstore start " in out and " --create " in out  # make run creates its store
    shown = [ln for ln in proc.stdout.splitlines() if ln.startswith("status: ")]
    assert all(a != b for a, b in itertools.pairwise(shown)), shown  # only changes, piped
    assert "supervisor exited with 0; shared memory left: none" in out
    demo = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith('{"demo"')))
    assert demo["demo"]["good"] and demo["demo"]["ok"] > 0
    assert leftover_shm(store) == []
    assert _processes_mentioning(store) == []
    assert not (store / "abort").exists()
    check = subprocess.run(
        [sys.executable, "-m", "mqstore", "check", str(store)],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=str(REPO),
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr


def test_demo_exits_non_zero_when_puts_fail(make_store: StoreFactory) -> None:
    st = make_store(env={"MQSTORE_FAULTS": "fdatasync:EIO", "MQSTORE_FAULTS_FOR": "flusher"})
    proc = subprocess.run(
        [
            sys.executable, "-m", "mqstore", "demo", str(st.path), "--producers", "0",
            "--sync-producers", "1", "--messages", "50", "--json",
        ],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=str(REPO),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert not doc["good"] and doc["failed"] == 50 and doc["ok"] == 0
    assert doc["statuses"]["FLUSH_DISK_FAILED"] >= 1
    assert set(doc["statuses"]) <= {"FLUSH_DISK_FAILED", "SERVICE_NOT_AVAILABLE"}
    assert st.stop() == 5
