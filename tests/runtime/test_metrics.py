"""Prometheus metrics served by a real supervisor: scraped twice around a load from producer
processes (and a killed worker), every counter moves; no listener unless a port is set."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

import mqstore
from mqstore import StoreClient
from mqstore.workers.dispatcher import MAX_RECORDS_PER_ROUND
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for

PRODUCER = """
import sys
from mqstore import StoreClient
store, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = b"x" * 1000
with StoreClient.attach(store) as c:
    for k in range(n):
        r = c.put("metrics", body, queue_id=k % 4)
        assert r.ok, r
    assert c.put("not a topic", body).status.name == "MESSAGE_ILLEGAL"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(port: int, host: str = "127.0.0.1") -> Samples:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def _v(s: Samples, name: str, **labels: str) -> float:
    return s[(name, tuple(sorted(labels.items())))]


def _producers(store: Store, count: int, n: int) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, str(store.path), f"p{i}", str(n)],
            env=env,
            cwd=str(REPO),
        )
        for i in range(count)
    ]


def test_every_metric_moves_under_load(make_store: StoreFactory) -> None:
    port = _free_port()
    store = make_store({"metrics_port": port})
    store.wait_workers_running()
    assert f"metrics on http://127.0.0.1:{port}/metrics" in store.output()
    procs = _producers(store, 3, 2000)
    try:
        wait_for(lambda: _v(_scrape(port), "mqstore_puts_total", status="PUT_OK") > 0, 60, "puts")
        first = _scrape(port)
        victim = next(w for w in store.status()["workers"] if w["name"] == "dispatcher")
        os.kill(victim["pid"], signal.SIGKILL)
        for p in procs:
            assert p.wait(120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    wait_for(
        lambda: _v(_scrape(port), "mqstore_worker_restarts_total", worker="dispatcher") >= 1,
        60,
        "the dispatcher's restart",
    )
    wait_for(
        lambda: _v(_scrape(port), "mqstore_dispatched_records_total") > 0,
        60,
        "the restarted dispatcher to dispatch",
    )
    second = _scrape(port)
    moving = [
        ("mqstore_puts_total", {"status": "PUT_OK"}),
        ("mqstore_sync_puts_total", {}),
        ("mqstore_appended_bytes_total", {}),
        ("mqstore_fsyncs_total", {}),
        ("mqstore_fsync_seconds_total", {}),
        ("mqstore_group_commit_messages_count", {}),
        ("mqstore_group_commit_messages_sum", {}),
        ("mqstore_fsync_latency_seconds_count", {}),
        ("mqstore_fsync_latency_seconds_sum", {}),
        ("mqstore_segments_allocated_total", {}),
        ("mqstore_worker_restarts_total", {"worker": "dispatcher"}),
        ("mqstore_put_latency_seconds_count", {}),
        ("mqstore_put_latency_seconds_sum", {}),
        ("mqstore_store_size_bytes", {}),
        ("mqstore_dispatch_lag_seconds_count", {}),
    ]
    for name, labels in moving:
        assert _v(second, name, **labels) > _v(first, name, **labels), name
    # the first batch of each new queue is the Python path's; the restarted dispatcher
    # goes on from the count the killed one left (it only grows)
    batches = _v(second, "mqstore_dispatch_python_batches_total")
    assert batches >= max(1, _v(first, "mqstore_dispatch_python_batches_total")), batches
    assert _v(second, "mqstore_puts_total", status="PUT_OK") == 6000
    assert _v(second, "mqstore_puts_total", status="MESSAGE_ILLEGAL") == 3  # one per producer
    for st in ("FLUSH_DISK_TIMEOUT", "FLUSH_DISK_FAILED", "SERVICE_NOT_AVAILABLE"):
        assert _v(second, "mqstore_puts_total", status=st) == 0, st
    # by phase: every put took the lock and appended; each sync put waited for its flush
    # (lock_wait sums only waits, none if no put found the lock held:
    # tests/native/test_put_message.py checks that a wait is summed)
    for phase in ("lock_wait", "append", "flush_wait"):
        assert _v(second, "mqstore_put_phase_seconds_count", phase=phase) == 6000, phase
        if phase != "lock_wait":
            assert _v(second, "mqstore_put_phase_seconds_sum", phase=phase) > 0, phase
    total = _v(second, "mqstore_put_latency_seconds_sum")
    phases = sum(
        _v(second, "mqstore_put_phase_seconds_sum", phase=p)
        for p in ("lock_wait", "append", "flush_wait")
    )
    assert 0 < phases <= total, (phases, total)
    assert _v(second, "mqstore_put_latency_seconds_bucket", le="+Inf") == 6003
    fsyncs = _v(second, "mqstore_fsyncs_total")
    assert _v(second, "mqstore_fsync_latency_seconds_count") == fsyncs
    assert _v(second, "mqstore_group_commit_messages_count") == fsyncs
    assert _v(second, "mqstore_group_commit_messages_sum") >= 6000  # + the worker's fillers
    # every record is dispatched and lands in the lag histogram, which is never reset,
    # but for the round the killed dispatcher was in (written at the end of each round;
    # its successor resumes after the units that round already wrote)
    wait_for(
        lambda: (
            _v(_scrape(port), "mqstore_dispatch_lag_seconds_bucket", le="+Inf")
            >= 6000 - MAX_RECORDS_PER_ROUND
        ),
        60,
        "the records in the dispatch-lag histogram",
    )
    for gauge in (
        "mqstore_commit_behind_bytes",
        "mqstore_flush_behind_bytes",
        "mqstore_dispatch_behind_bytes",
        "mqstore_pool_free_buffers",
        "mqstore_oldest_message_age_seconds",
        "mqstore_last_dispatched_age_seconds",
    ):
        assert _v(second, gauge) >= 0, gauge
    assert _v(second, "mqstore_flag", flag="running") == 1
    assert _v(second, "mqstore_flag", flag="stopped") == 0
    assert ("mqstore_segments_deleted_total", ()) in second
    wait_for(lambda: ("mqstore_disk_used_ratio", ()) in _scrape(port), 60, "the disk check")
    third = _scrape(port)
    assert 0 < _v(third, "mqstore_disk_used_ratio") <= 1
    _docs_list_exactly(third)
    assert store.stop() == 0
    try:
        _scrape(port)
    except (urllib.error.URLError, ConnectionError):
        pass
    else:
        raise AssertionError("the metrics listener outlived the supervisor")


def _docs_list_exactly(samples: Samples) -> None:
    """docs/metrics.md lists every mqstore_ metric a scrape serves, and nothing else."""
    served = set()
    for name, _labels in samples:
        if not name.startswith("mqstore_"):
            continue  # prometheus_client's process_* (docs/metrics.md names them as a group)
        for suffix in ("_bucket", "_count", "_sum", "_created"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        served.add(name)
    doc = (REPO / "docs" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(mqstore_[a-z_]+)` \|", doc, flags=re.M))
    assert served - listed == set(), "served but not in docs/metrics.md"
    assert listed - served == set(), "in docs/metrics.md but not served"


def test_metrics_off_by_default(store: Store) -> None:
    store.wait_workers_running()
    assert "metrics on" not in store.output()
    pid = store.status()["supervisor_pid"]
    listening = [
        conn
        for conn in psutil.Process(pid).net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    ]
    assert listening == []


def test_metrics_bind_to_the_configured_address_only(make_store: StoreFactory) -> None:
    """The endpoint was always on 127.0.0.1; `metrics_host` chooses the interface
    (another loopback address here, so the test stays on this machine)."""
    port = _free_port()
    store = make_store({"metrics_port": port, "metrics_host": "127.0.0.2"})
    store.wait_workers_running()
    assert f"metrics on http://127.0.0.2:{port}/metrics" in store.output()
    assert "mqstore_build_info" in {name for name, _ in _scrape(port, "127.0.0.2")}
    with pytest.raises(urllib.error.URLError):
        _scrape(port, "127.0.0.1")  # nothing listens there


def test_oldest_message_age_is_the_age_of_the_first_message(make_store: StoreFactory) -> None:
    """It read SYSFLAG and STORETIMESTAMP 4 bytes early (at 32 and 52, not 36 and 56),
    so the gauge showed about 1.8e9 seconds for a store a second old."""
    port = _free_port()
    store = make_store({"metrics_port": port})
    t0 = time.time()
    with StoreClient.attach(store.path) as c:
        assert c.put("age", b"first").ok  # SYNC_FLUSH: in the file when acknowledged

    def age() -> float | None:
        key = ("mqstore_oldest_message_age_seconds", ())
        return _scrape(port).get(key)

    got = wait_for(age, 60, "the oldest-message gauge")  # a float > 0 once served
    assert 0 < got <= time.time() - t0 + 1, got


def test_build_info_process_metrics_and_an_idle_store_is_not_behind(
    make_store: StoreFactory,
) -> None:
    port = _free_port()
    store = make_store({"metrics_port": port})
    store.wait_workers_running()
    with StoreClient.attach(store.path) as c:
        for i in range(20):
            assert c.put("idle", b"%d" % i).ok
    wait_for(lambda: _v(_scrape(port), "mqstore_dispatch_behind_bytes") == 0, 60, "dispatch")

    # idle now: the age of the last dispatched record grows, the lag behind does not
    def aged() -> Samples | None:
        s = _scrape(port)
        return s if _v(s, "mqstore_last_dispatched_age_seconds") >= 2 else None

    got = wait_for(aged, 60, "the last dispatched record to age")
    assert _v(got, "mqstore_dispatch_behind_seconds") == 0

    info = [labels for (name, labels) in got if name == "mqstore_build_info"]
    assert len(info) == 1 and _v(got, "mqstore_build_info", **dict(info[0])) == 1
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    assert dict(info[0])["version"] == mqstore.__version__
    assert dict(info[0])["commit"].removesuffix("-dirty") == (head or "unknown")

    sup = psutil.Process(store.status()["supervisor_pid"])
    assert abs(_v(got, "process_start_time_seconds") - sup.create_time()) < 2  # the supervisor
    assert _v(got, "process_resident_memory_bytes") > 0
    assert _v(got, "process_cpu_seconds_total") > 0


def test_dispatch_behind_is_how_long_the_oldest_waiting_record_waited(
    make_store: StoreFactory,
) -> None:
    """`mqstore_dispatch_behind_seconds` is the age of the oldest record the dispatcher
    could dispatch and has not: after an idle spell, a new record waiting is as old as
    it is, not as old as the idle spell (it was now minus the store time of the last
    record dispatched: the whole idle time at the first put after it). The dispatcher is
    held with SIGSTOP while the record waits."""
    port = _free_port()
    st = make_store({"metrics_port": port, "heartbeat_timeout_ms": 60_000})
    st.wait_workers_running()
    pid = next(w["pid"] for w in st.status()["workers"] if w["name"] == "dispatcher")
    with StoreClient.attach(st.path) as c:
        assert c.put("lag", b"first").ok
        age = ("mqstore_last_dispatched_age_seconds", ())  # there once a record was
        wait_for(lambda: _scrape(port).get(age, 0.0) >= 2, 60,
                 "an idle spell of 2 s after the first record was dispatched")  # fmt: skip
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.time()
            assert c.put("lag", b"second").ok  # SYNC_FLUSH: flushed, so dispatchable

            def waiting() -> Samples | None:
                s = _scrape(port)
                return s if _v(s, "mqstore_dispatch_behind_bytes") > 0 else None

            got = wait_for(waiting, 30, "the second record to wait for the dispatcher")
            behind = _v(got, "mqstore_dispatch_behind_seconds")
            assert 0 <= behind <= time.time() - t0 + 0.01, behind  # not the idle 2 s
            wait_for(lambda: _v(_scrape(port), "mqstore_dispatch_behind_seconds") >= 1, 30,
                     "the waiting record to age")  # fmt: skip
        finally:
            os.kill(pid, signal.SIGCONT)
    wait_for(lambda: _v(_scrape(port), "mqstore_dispatch_behind_seconds") == 0, 60,
             "the dispatcher to catch up")  # fmt: skip
