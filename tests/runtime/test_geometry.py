"""The geometry belongs to the store (issue 24): a restart without the settings that set
a 1 MiB segment used to serve with the 64 MiB default, grow the 1 MiB segment, make 64
MiB files beside it and lose thousands of acknowledged messages. The store now records
its geometry at creation (`engine.geometry`) and refuses a start with other values,
naming both; RocketMQ stores (no record) are checked against their files and get the
record at their first start; the offline tools read with the recorded geometry."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from mqstore import StoreClient
from mqstore.engine.geometry import RECORD_FILE
from mqstore.workers.base import ExitCode
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for, write_config


def _mqstore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=120,
    )  # fmt: skip


def _start_refused(store: Store, *config: str) -> subprocess.CompletedProcess[str]:
    got = _mqstore("start", str(store.path), *config)
    assert got.returncode == ExitCode.CONFIG_ERROR, got.stdout + got.stderr
    assert "Traceback" not in got.stdout + got.stderr
    assert store.shm_leftovers() == []
    return got


def test_a_start_with_another_segment_size_is_refused(make_store: StoreFactory) -> None:
    store = make_store({"segment_size_bytes": 1 << 20}, config_outside=True)
    with StoreClient.attach(store.path) as client:
        acked = [client.put("t", b"m%05d" % i + bytes(400), queue_id=0) for i in range(3000)]
    assert all(r.ok for r in acked)
    assert store.stop() == 0
    recorded = json.loads((store.path / RECORD_FILE).read_text())
    assert recorded["segment_size_bytes"] == 1 << 20
    sizes = sorted({p.stat().st_size for p in (store.path / "commitlog").iterdir()})
    # without --config: the 64 MiB default
    got = _start_refused(store)
    out = got.stdout + got.stderr
    assert "segment_size_bytes" in out and "1048576" in out and "67108864" in out, out
    # the files are as they were: nothing grew, no 64 MiB file appeared
    assert sorted({p.stat().st_size for p in (store.path / "commitlog").iterdir()}) == sizes
    # the offline tools read with the recorded geometry, settings or not
    check = _mqstore("check", str(store.path))
    assert check.returncode == 0 and "of 1048576 bytes" in check.stdout, check.stdout
    # with its settings, the store serves every acknowledged message
    store.start()
    assert store.stop() == 0
    bodies = [r.body[:6] for r in store.read_log() if r.topic == "t"]
    assert bodies == [b"m%05d" % i for i in range(3000)]


def test_a_rocketmq_store_gets_the_record_at_its_first_start(
    real_stores_dir: Path, tmp_path: Path
) -> None:
    """A RocketMQ 4.2 store (8 KiB segments, 200-byte queue files, no record): the
    default settings are refused by its files, its broker.conf starts it and records
    the geometry, and from then on a start without the settings is refused by the
    record."""
    path = tmp_path / "rocketmq"
    shutil.copytree(real_stores_dir / "broker-4.2-unit-store", path)
    (path / "lock").unlink()
    conf = REPO / "tests" / "data" / "broker-conf" / "broker-4.2-unit-store.conf"
    store = Store(path, config_outside=True)
    store.config_path = None
    got = _start_refused(store)
    assert "the store's files are 8192" in got.stdout + got.stderr
    assert not (path / RECORD_FILE).exists()
    store.config_path = conf
    store.start()
    assert store.stop() == 0
    assert json.loads((path / RECORD_FILE).read_text()) == {
        "segment_size_bytes": 8192,
        "consume_queue_file_size_bytes": 200,
        "max_hash_slot_num": 500_000,
        "max_index_num": 2_000_000,
    }
    store.config_path = None
    got = _start_refused(store)
    assert "records (in config/geometry.json) 8192" in got.stdout + got.stderr


def test_a_damaged_record_refuses_the_start_cleanly(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.stop() == 0
    (store.path / RECORD_FILE).write_text('{"segment_size_bytes": -1}')
    got = _mqstore("start", str(store.path))
    assert got.returncode == ExitCode.BOOT_ERROR, got.stdout + got.stderr
    assert "not a geometry record" in got.stdout + got.stderr
    assert "Traceback" not in got.stdout + got.stderr
    assert store.shm_leftovers() == []
    assert not (store.path / "abort").exists()


def test_a_worker_restarted_after_the_config_changed_keeps_the_geometry(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    store.wait_workers_running()
    write_config(store.path, {**store.config, "segment_size_bytes": 2 << 20})
    (cleaner,) = [w for w in store.status()["workers"] if w["name"] == "cleaner"]
    os.kill(cleaner["pid"], signal.SIGKILL)
    wait_for(lambda: "this run keeps the store's" in store.output(), 60, "the warning")
    store.wait_workers_running()
    with StoreClient.attach(store.path) as client:
        assert client.put("t", b"after", queue_id=0).ok
    assert store.status()["flags"] == ["running"]
    assert "segment_size_bytes: the store records (in config/geometry.json) 1048576" in (
        store.output()
    )
    assert store.stop() == 0
