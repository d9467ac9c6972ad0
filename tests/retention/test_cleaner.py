"""The cleaner: `mqstore clean` offline, the request file of a running store, and the
worker process on a real control block."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.engine.checkpoint import StoreCheckpoint
from mqstore.engine.diskguard import DiskState, DiskVerdict, refusal_from_state
from mqstore.engine.offsets import load_consumer_offsets
from mqstore.engine.segment import SegmentSizeError
from mqstore.engine.storedir import FLUSHED_OFFSET_FILE, write_flushed_offset
from mqstore.ipc import control as c
from mqstore.ipc.locks import take_store_lock
from mqstore.workers.cleaner import (
    REQUEST_FILE,
    STATUS_FILE,
    Cleaner,
    Protection,
    clean_once,
    decode_disk_state,
    encode_disk_state,
    read_status,
    run_cleaner,
    status_doc,
)
from tests.retention.helpers import HOUR_MS, SEG, Clock, Probe, build_log, set_mtime

REPO = Path(__file__).resolve().parents[2]
S = StoreSettings(segment_size_bytes=SEG)


def _old_store(store: Path, segments: int = 5) -> list[str]:
    clock = Clock()
    log = build_log(store, clock, segments)
    paths = [s.path for s in log.queue.segments]
    log.close()
    for p in paths:
        set_mtime(p, clock.ms - 100 * HOUR_MS)
    (store / "mqstore.toml").write_text(f"[store]\nsegment_size_bytes = {SEG}\n")
    return paths


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cli_clean_now_offline(tmp_path: Path) -> None:
    paths = _old_store(tmp_path)
    res = _cli("clean", str(tmp_path), "--now", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["trigger"]["manual"] is True
    assert [d["path"] for d in doc["deleted"]] == paths[:-1]
    assert all(d["reason"] == "EXPIRED" for d in doc["deleted"])
    assert doc["bytes_deleted"] == SEG * (len(paths) - 1)
    assert [os.path.exists(p) for p in paths] == [False] * (len(paths) - 1) + [True]
    st = read_status(str(tmp_path))
    assert st is not None and st["totals"]["files_deleted"] == len(paths) - 1
    text = _cli("clean", str(tmp_path), "--now")
    assert text.returncode == 0 and "0 files, 0 bytes deleted" in text.stdout
    assert _cli("clean", str(tmp_path / "nope")).returncode == 2


def test_offline_clean_respects_flushed_offset_and_checkpoint(tmp_path: Path) -> None:
    paths = _old_store(tmp_path, 6)
    path = tmp_path / FLUSHED_OFFSET_FILE
    fd = fileio.open_file(path, create=True)
    write_flushed_offset(fd, 3 * SEG + 10, str(path))
    fileio.close(fd, str(path))
    r = clean_once(tmp_path, S, now=True, sleep_ms=lambda ms: None)
    assert [d.path for d in r.deleted] == paths[:3]
    assert r.keep_from_offset == 3 * SEG + 10
    # A checkpoint whose timestamps are older than segment 4's first record: abnormal
    # recovery would start at segment 3, so segment 3 stays although it is flushed.
    os.unlink(path)
    with StoreCheckpoint(tmp_path / "checkpoint") as cp:
        cp.physic_msg_timestamp = cp.logics_msg_timestamp = 1  # before every record
        cp.flush()
    r = clean_once(tmp_path, S, now=True, sleep_ms=lambda ms: None)
    assert r.files_deleted == 0 and r.keep_from_offset == 3 * SEG
    with StoreCheckpoint(tmp_path / "checkpoint") as cp:
        cp.physic_msg_timestamp = cp.logics_msg_timestamp = time.time_ns() // 1_000_000 + 10**6
        cp.flush()
    r = clean_once(tmp_path, S, now=True, sleep_ms=lambda ms: None)
    assert [d.path for d in r.deleted] == paths[3:5]


def test_not_manual_and_not_due_deletes_nothing(tmp_path: Path) -> None:
    paths = _old_store(tmp_path)
    hour = (time.localtime().tm_hour + 12) % 24
    r = clean_once(tmp_path, S.replace(delete_when=(hour,)), probe=Probe(0.5))
    assert r.files_deleted == 0 and all(os.path.exists(p) for p in paths)
    r = clean_once(tmp_path, S.replace(delete_when=(hour,)), probe=Probe(0.8))
    assert r.files_deleted == len(paths) - 1  # disk over 75 %


def test_running_store_is_not_cleaned_offline_and_answers_a_request(tmp_path: Path) -> None:
    paths = _old_store(tmp_path)
    fd = take_store_lock(str(tmp_path))  # as a running supervisor holds it
    try:
        with pytest.raises(RuntimeError, match="running"):
            clean_once(tmp_path, S, now=True)
        cleaner = Cleaner(
            str(tmp_path),
            S,
            protection=lambda q: Protection(None, None, None),
            sleep_ms=lambda ms: None,
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore", "clean", str(tmp_path), "--now", "--json"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                cleaner.tick()
                time.sleep(0.05)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert [d["path"] for d in json.loads(out)["deleted"]] == paths[:-1]
        assert not (tmp_path / REQUEST_FILE).exists()
    finally:
        os.close(fd)


def test_disk_state_word_round_trips() -> None:
    v = DiskVerdict(DiskState.DISK_FULL, 0.934, True, True, True, True, "x")
    assert decode_disk_state(encode_disk_state(v)) == (True, True, 0.934)
    v = DiskVerdict(DiskState.OK, -1.0, False, False, True, False, "unknown")
    assert decode_disk_state(encode_disk_state(v)) == (False, False, 0.0)


def test_worker_process_publishes_disk_state_cleans_on_request_and_stops(
    tmp_path: Path,
) -> None:
    paths = _old_store(tmp_path, 4)
    cb = c.ControlBlock.create(
        tmp_path, os.getpid() % 100000, c.Geometry(SEG, 0, slot_count=64, qtable_capacity=64)
    )
    proc = None
    try:
        cb.set(c.OFF_FLUSHED, 2 * SEG)  # segments 0 and 1 are flushed
        cb.set(c.OFF_DISPATCHED, 2 * SEG)  # ...and dispatched
        (tmp_path / REQUEST_FILE).touch()
        argv = [sys.executable, "-m", "mqstore.workers.worker_main", "cleaner", "0", str(tmp_path)]
        argv += [cb.ctl_name, cb.pool_name, "mqstore.workers.cleaner:main"]
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        st = None
        while time.monotonic() < deadline:
            st = read_status(str(tmp_path))
            if st and st.get("last_clean") and cb.get(c.OFF_DISK_STATE):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        assert st is not None and st["last_clean"] is not None, "the cleaner never reported"
        assert [d["path"] for d in st["last_clean"]["deleted"]] == paths[:2]
        full, _, ratio = decode_disk_state(cb.get(c.OFF_DISK_STATE))
        assert not full and 0 < ratio < 1
        assert os.path.exists(tmp_path / STATUS_FILE)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert err.decode().count("mqstore cleaner: deleted ") == 2
        assert "EXPIRED" in err.decode()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc is not None:
            proc.communicate()
        cb.close()


def test_refusal_reason_from_the_shared_state_word() -> None:
    v = DiskVerdict(DiskState.DISK_FULL, 0.934, True, True, True, True, "x")
    why = refusal_from_state(encode_disk_state(v), S)
    assert "DISK_FULL" in why and "93.4%" in why and "85%" in why
    ok = DiskVerdict(DiskState.OK, 0.5, False, False, False, True, "x")
    assert refusal_from_state(encode_disk_state(ok), S) == ""
    doc = status_doc("/nonexistent", encode_disk_state(v))
    assert doc["disk"] == {"disk_full": True, "clean_immediately": True, "ratio": 0.934}
    assert doc["status_file"] is None


def test_unconsumed_bytes_from_rocketmqs_consumer_offset_file(tmp_path: Path) -> None:
    paths = _old_store(tmp_path, 4)
    (tmp_path / "config").mkdir()
    # fastjson's form: queue ids unquoted. Group G consumed T/0 up to offset 3.
    (tmp_path / "config" / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"T@G":{0:3,1:0},\n\t\t"Other@G":{0:9}\n\t}\n}'
    )
    offsets = load_consumer_offsets(tmp_path)
    assert offsets == {"G": {("T", 0): 3, ("T", 1): 0, ("Other", 0): 9}}
    r = clean_once(tmp_path, S, now=True, sleep_ms=lambda ms: None)
    assert [d.path for d in r.deleted] == paths[:3]
    rec = 1000 + 91 + 1
    total_records = 3 * ((SEG - 8) // rec)
    assert r.unconsumed_bytes_deleted == (total_records - 3) * rec
    (tmp_path / "config" / "consumerOffset.json").write_text("not json")
    assert load_consumer_offsets(tmp_path) is None


def test_a_failing_clean_is_not_retried_at_once(tmp_path: Path) -> None:
    _old_store(tmp_path, 3)
    (tmp_path / "commitlog" / f"{3 * SEG:020d}").write_bytes(b"short")  # not a segment
    (tmp_path / "commitlog" / f"{4 * SEG:020d}").write_bytes(bytes(SEG))
    cleaner = Cleaner(
        str(tmp_path), S, protection=lambda q: Protection(None, None, None), first_clean_s=0
    )
    with pytest.raises(SegmentSizeError):
        cleaner.tick()
    cleaner.tick()  # does not raise: the failed clean is due again an interval later
    assert cleaner.guard.last is not None  # while the disk check keeps running


def test_run_cleaner_loop_in_a_thread_until_stopped(tmp_path: Path) -> None:
    paths = _old_store(tmp_path, 3)
    cleaner = Cleaner(
        str(tmp_path),
        S,
        protection=lambda q: Protection(None, None, None),
        sleep_ms=lambda ms: None,
        first_clean_s=0,
    )
    cleaner.request_manual()
    stop = threading.Event()
    t = threading.Thread(target=run_cleaner, args=(str(tmp_path), cleaner, stop))
    t.start()
    try:
        deadline = time.monotonic() + 30
        while cleaner.last_report is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert cleaner.last_report is not None
    assert [d.path for d in cleaner.last_report.deleted] == paths[:2]


def test_checkpoint_protection_physic_live_and_logics_only_with_queues(tmp_path: Path) -> None:
    from mqstore.workers.cleaner import checkpoint_protection, open_log_view

    _old_store(tmp_path, 4)
    queue = open_log_view(str(tmp_path), S, Clock())
    try:
        assert checkpoint_protection(str(tmp_path), queue) is None  # no checkpoint file
        future = time.time_ns() // 1_000_000 + 10**6
        with StoreCheckpoint(tmp_path / "checkpoint") as cp:
            cp.physic_msg_timestamp = future  # the supervisor writes only physic
            cp.flush()
        assert checkpoint_protection(str(tmp_path), queue) == 3 * SEG  # not pinned at 0
        # The runtime's live flushed timestamp overrides the file's.
        assert checkpoint_protection(str(tmp_path), queue, live_physic_ms=1) == 0
        with StoreCheckpoint(tmp_path / "checkpoint") as cp:
            cp.logics_msg_timestamp = 1
            cp.flush()
        assert checkpoint_protection(str(tmp_path), queue) == 3 * SEG  # no queues: ignored
        (tmp_path / "consumequeue" / "T" / "0").mkdir(parents=True)
        assert checkpoint_protection(str(tmp_path), queue) == 0  # with queues it counts
    finally:
        queue.close()
