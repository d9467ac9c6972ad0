"""The jobs on a Spark standalone cluster: a master and a worker on 127.0.0.1, started
by the documented recipe, `mqstore pipeline cluster` (pip's pyspark has no
`sbin/start-master.sh`; the command runs `spark-class ...Master` and `...Worker`), so
cluster mode is shown, not assumed.

The job runs as `mqstore pipeline ... --master spark://127.0.0.1:PORT` in a fresh
process: its executor is a separate JVM that imports `engine` and `pipeline` only from
the zip the session ships, and reaches the store by its file URI. SIGTERM to the
cluster command stops both daemons and their executors.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.pipeline import storegen

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 150.0


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _wait_for_url(out: Path, proc: subprocess.Popen[bytes], err: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        m = re.search(r"^(spark://127\.0\.0\.1:\d+)$", out.read_text(), re.MULTILINE)
        if m:
            return m.group(1)
        if proc.poll() is not None:
            pytest.fail(f"pipeline cluster exited {proc.returncode}:\n{err.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"pipeline cluster printed no master URL within {START_TIMEOUT_S} s")


def _daemons(proc: subprocess.Popen[bytes]) -> dict[psutil.Process, str]:
    """The processes under the cluster command, with their command lines (one that has
    just exited, like spark-class's launcher step, is left out)."""
    found = {}
    for p in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # ZombieProcess is one
            found[p] = " ".join(p.cmdline())
    return found


def _kill_left(procs: Iterable[psutil.Process]) -> None:
    """Kill what is still running of `procs`: a failed test leaves no JVM behind."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    return tmp_path / "cluster"


@pytest.fixture
def standalone_cluster(tmp_path: Path, cluster_dir: Path) -> Iterator[str]:
    out, err = tmp_path / "cluster.out", tmp_path / "cluster.err"
    cmd = [
        sys.executable, "-m", "mqstore", "pipeline", "cluster", "--port", "0",
        "--webui-port", "0", "--cores", "1", "--memory", "1g", "--dir", str(cluster_dir),
    ]  # fmt: skip
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=_clean_env(), cwd=tmp_path)
    daemons: dict[psutil.Process, str] = {}
    try:
        url = _wait_for_url(out, proc, err)
        daemons = _daemons(proc)
        started = " ".join(daemons.values())
        assert "deploy.master.Master" in started and "deploy.worker.Worker" in started
        yield url
        daemons = _daemons(proc)  # with the executors the jobs started, if still running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0, err.read_text()[-3000:]
        _gone, alive = psutil.wait_procs(list(daemons), timeout=STOP_TIMEOUT_S)
        assert alive == [], f"left running after SIGTERM: {alive}"
    finally:
        if proc.poll() is None:
            daemons.update(_daemons(proc))
            proc.kill()
            proc.wait(timeout=60)
        _kill_left(daemons)


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
    standalone_cluster: str, tmp_path: Path, cluster_dir: Path
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
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(commands)],
        env=_clean_env(),
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
    assert len(list((cluster_dir / "work").glob("app-*"))) == 4
