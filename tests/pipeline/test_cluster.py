"""The jobs on a Spark standalone cluster: a master and a worker on 127.0.0.1, started
here from the installed pyspark (`spark-class`), so cluster mode is shown, not assumed.

The job runs as `mqstore pipeline ... --master spark://127.0.0.1:PORT` in a fresh
process: its executor is a separate JVM that imports `engine` and `pipeline` only from
the zip the session ships, and reaches the store by its file URI.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.pipeline import storegen

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen[bytes]) -> re.Match[str]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        m = re.search(pattern, text)
        if m:
            return m
        if proc.poll() is not None:
            pytest.fail(f"{log.name}: exited {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"{log.name}: no {pattern!r} within {START_TIMEOUT_S} s")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """End the process group this test started (the daemon and its executors)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == proc.pid]
        if not left:
            return
        time.sleep(0.2)
    for p in left:
        p.kill()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOG_DIR"] = str(tmp_path / "logs")
    started: list[subprocess.Popen[bytes]] = []

    def start(log_name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / log_name
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(_spark_class()), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp_path,
                start_new_session=True,
            )
        started.append(proc)
        return proc, log

    try:
        master, master_log = start(
            "master.log", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
        )  # fmt: skip
        url = _wait_for(master_log, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", master)
        worker, worker_log = start(
            "worker.log", "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0",
            "--work-dir", str(tmp_path / "work"), url.group(1),
        )  # fmt: skip
        _wait_for(worker_log, r"Successfully registered with master", worker)
        yield url.group(1)
    finally:
        for proc in reversed(started):
            _stop_group(proc)


# Runs the four CLI jobs one after another in one driver process (one JVM gateway, a new
# application each), each job's stdout and exit code saved for the test to check.
DRIVER = """
import contextlib, io, json, sys
from mqstore.workers import cli
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(argv)
    out[name] = [code, buf.getvalue()]
print(json.dumps(out))
"""


def test_four_jobs_run_on_a_loopback_standalone_cluster(
    standalone_cluster: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    offsets = storegen.write_store(root, storegen.mixed_messages(300), segment_bytes=16384)
    out = tmp_path / "exported"
    master = ["--master", standalone_cluster]
    commands = {
        "stats": ["pipeline", "stats", root.as_uri(), "--json", *master],
        "query": ["pipeline", "query", str(root), "--topic", "payments", "--limit", "5", *master],
        "audit": ["pipeline", "audit", str(root), "--json", *master],
        "export": ["pipeline", "export", str(root), "--to", str(out), *master],
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(commands)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    done = json.loads(res.stdout.splitlines()[-1])
    assert {name: code for name, (code, _out) in done.items()} == dict.fromkeys(commands, 0)
    stats = json.loads(done["stats"][1])
    assert stats["records"] == 300
    assert {q["topic"] for q in stats["queues"]} == {"orders", "payments", "audit-log", "tópico"}
    hits = [json.loads(line) for line in done["query"][1].splitlines()]
    assert [h["physical_offset"] for h in hits] == offsets[1:20:4]  # payments: i % 4 == 1
    audit = json.loads(done["audit"][1])
    assert audit["ok"] and audit["records_checked"] == 300
    assert "exported 300 records" in done["export"][1]
    assert sorted(p.name for p in out.iterdir() if p.is_dir())[0] == "topic=audit-log"
    # executors ran in the worker's work dir, one application per job: the jobs left the driver
    assert len(list((tmp_path / "work").glob("app-*"))) == 4
