"""A Spark standalone cluster, one master and one worker, from pip's pyspark.

`--master spark://HOST:PORT` needs a cluster, and pip's pyspark ships no
`sbin/start-master.sh` or `start-worker.sh`; it ships `bin/spark-class`, which runs the
same daemons in the foreground:

    spark-class org.apache.spark.deploy.master.Master --host H --port P
    spark-class org.apache.spark.deploy.worker.Worker --host H --work-dir D spark://H:P

`commands()` builds those two lines; `Cluster` runs them (`mqstore pipeline cluster`).
A worker left to its default work directory writes every application's files into
pyspark's own folder in site-packages, so a work directory is always given.

Who may call: the `pipeline cluster` command and tests. Cost: two JVMs (~1 GiB together
before any executor; each executor takes `--memory`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
MASTER_STARTED = re.compile(r"Starting Spark master at (spark://\S+:\d+)")
WORKER_REGISTERED = re.compile(r"Successfully registered with master")
STOP_TIMEOUT_S = 60.0


class ClusterError(RuntimeError):
    """A daemon exited or never became ready; the message names its log."""


def spark_class() -> Path:
    """The installed pyspark's `bin/spark-class` (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("No module named 'pyspark'", name="pyspark")
    return Path(spec.origin).parent / "bin" / "spark-class"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    host: str = "127.0.0.1"
    port: int = 7077  # 0: any free port (the master logs which)
    webui_port: int = 8080  # the master's; the worker's web UI takes any free port
    cores: int | None = None  # None: all of the machine's
    memory: str | None = None  # None: the machine's memory less 1 GiB
    cluster_dir: Path = Path("spark-cluster")  # logs, and the executors' work dirs

    def master_command(self) -> list[str]:
        return [
            str(spark_class()), MASTER_CLASS, "--host", self.host,
            "--port", str(self.port), "--webui-port", str(self.webui_port),
        ]  # fmt: skip

    def worker_command(self, master_url: str) -> list[str]:
        cmd = [str(spark_class()), WORKER_CLASS, "--host", self.host, "--webui-port", "0"]
        if self.cores is not None:
            cmd += ["--cores", str(self.cores)]
        if self.memory is not None:
            cmd += ["--memory", self.memory]
        return [*cmd, "--work-dir", str(self.cluster_dir.resolve() / "work"), master_url]


class Cluster:
    """A master and a worker, each a `spark-class` process in a session of its own (so a
    Ctrl-C meant for the caller reaches them only through `stop`), logging to
    `cluster_dir/master.log` and `cluster_dir/worker.log` (replaced at each start)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.master_url = ""
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, timeout_s: float = 120.0, stopping: Callable[[], bool] = lambda: False) -> str:
        """Start the master, then the worker once the master listens; return the master's
        URL once the worker has registered. Raises ClusterError (both stopped) if either
        exits, is not ready within `timeout_s`, or `stopping()` turns true first."""
        self.spec.cluster_dir.mkdir(parents=True, exist_ok=True)
        try:
            master_log = self._spawn("master.log", self.spec.master_command())
            m = self._wait_for(master_log, MASTER_STARTED, timeout_s, stopping)
            self.master_url = m.group(1)
            worker_log = self._spawn("worker.log", self.spec.worker_command(self.master_url))
            self._wait_for(worker_log, WORKER_REGISTERED, timeout_s, stopping)
        except BaseException:
            self.stop()
            raise
        return self.master_url

    def exited(self) -> str | None:
        """Which daemon has exited, if one has (a worker stops when its master does)."""
        for proc, log in self._procs:
            if proc.poll() is not None:
                return f"{log.stem} exited with {proc.returncode} (its log: {log})"
        return None

    def stop(self) -> None:
        """SIGTERM the worker, then the master (each with its executors), SIGKILL what is
        left after STOP_TIMEOUT_S. Idempotent."""
        while self._procs:
            proc, _log = self._procs.pop()
            _stop_group(proc)

    def _spawn(self, log_name: str, cmd: list[str]) -> Path:
        log = self.spec.cluster_dir / log_name
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.spec.cluster_dir, start_new_session=True,
            )  # fmt: skip
        self._procs.append((proc, log))
        return log

    def _wait_for(
        self, log: Path, pattern: re.Pattern[str], timeout_s: float, stopping: Callable[[], bool]
    ) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = pattern.search(log.read_text(errors="replace"))
            if m:
                return m
            gone = self.exited()
            if gone is not None:
                raise ClusterError(gone)
            if stopping():
                raise ClusterError(f"stopped before {log.stem} was ready")
            time.sleep(0.2)
        raise ClusterError(f"{log.stem} not ready within {timeout_s:.0f} s (its log: {log})")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def write_commands(spec: ClusterSpec, out: IO[str]) -> None:
    """The two command lines, for running the daemons yourself (a service manager, or the
    worker on another machine with its own --host and the master's URL)."""
    url = f"spark://{spec.host}:{spec.port}"
    out.write(" ".join(spec.master_command()) + "\n")
    out.write(" ".join(spec.worker_command(url)) + "\n")
