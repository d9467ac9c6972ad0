"""A real supervisor in a subprocess on a temporary store, for the runtime and load suites.

`Store.start()` runs `python -m mqstore start DIR` and waits (polling, generous
timeout) until it answers a status request; `stop()` sends SIGTERM and returns the exit
code. `shm_leftovers()` lists this store's shared-memory names. Reading helpers decode
the whole log with the engine's read side.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mqstore.engine.commitlog import CommitLog
from mqstore.engine.filler import is_filler
from mqstore.engine.record import DecodedRecord
from mqstore.ipc import channel
from mqstore.ipc.control import leftover_shm

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_CONFIG: dict[str, Any] = {
    "segment_size_bytes": 1 << 20,
    "transient_store_pool_size": 3,
    "flush_disk_type": "SYNC_FLUSH",
    "sync_flush_timeout_ms": 20000,  # the disk is shared with other jobs: be generous
    "heartbeat_interval_ms": 100,
    "restart_backoff_initial_ms": 50,
    # The disk the tests' stores live on is shared with other jobs, and how full they make
    # it is not the test's: at RocketMQ's 90% (warning) the cleaner refuses every put with
    # "the disk is full", at 85% it deletes the oldest segments. The tests of that guard
    # (tests/retention) set these on a filesystem of their own.
    "disk_space_warning_level_ratio": 1.0,
    "disk_space_clean_forcibly_ratio": 1.0,
}


def wait_for(cond: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition") -> Any:
    """Poll `cond` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


_IGNORE_SIGINT_THEN_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@contextmanager
def racing_writer(
    code: str, *args: str, timeout_s: float = 120
) -> Iterator[subprocess.Popen[bytes]]:
    """A process running `python -c code args` that prints "ready" once set up and then
    writes shared memory or a shared file, for a test that reads it meanwhile. Yields it
    running; at the end of the block it must have exited 0 within `timeout_s`. Killed if
    the block fails."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc
        assert proc.wait(timeout=timeout_s) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def sigint_ignored(argv: list[str]) -> list[str]:
    """`argv` (a program path first) run with SIGINT ignored, as a job started with `&`
    from a script inherits it (an exec keeps an ignored disposition): a command that waits
    must stop on SIGINT however the suite, or its user, launched it."""
    return [sys.executable, "-c", _IGNORE_SIGINT_THEN_EXEC, *argv]


def config_toml(config: Mapping[str, Any]) -> str:
    """`config` as a TOML `[store]` table."""
    lines = ["[store]"]
    for k, v in config.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, str):
            lines.append(f'{k} = "{v}"')
        else:
            lines.append(f"{k} = {v}")
    return "\n".join(lines) + "\n"


def write_config(store_dir: Path, config: Mapping[str, Any]) -> None:
    (store_dir / "mqstore.toml").write_text(config_toml(config))


class Store:
    """`config_outside`: the settings go to `<path>.toml` beside the store directory and
    the supervisor is started with `--config` (as `/etc/mqstore/x.conf` is), so nothing
    in the store directory tells a client the settings. `log_path`: where the supervisor's
    output goes (default beside the store; a full-disk test keeps it off the full disk)."""

    def __init__(
        self,
        path: Path,
        config: Mapping[str, Any] | None = None,
        *,
        config_outside: bool = False,
        log_path: Path | None = None,
    ) -> None:
        self.path = path
        self.config = {**DEFAULT_CONFIG, **(config or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = log_path or path.parent / f"{path.name}-supervisor.log"
        path.mkdir(parents=True, exist_ok=True)
        self.config_path = path.parent / f"{path.name}.toml" if config_outside else None
        if self.config_path is None:
            write_config(path, self.config)
        else:
            self.config_path.write_text(config_toml(self.config))

    def start(
        self, env: Mapping[str, str] | None = None, *, wait: bool = True, write_path: bool = True
    ) -> None:
        """Start the supervisor; with `wait`, until it answers status and (`write_path`)
        its write path runs (`wait_write_path`). A test of boot itself (a worker held or
        crashing at start) passes `write_path=False`."""
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore", "start", str(self.path)]
            + (["--config", str(self.config_path)] if self.config_path else []),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=str(REPO),
        )
        if wait:
            wait_for(self._up, 60, "the supervisor to answer")
            if write_path:
                self.wait_write_path()

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"supervisor exited with {self.proc.returncode}: {self.output()}")
        try:
            self.status()
        except channel.SupervisorUnavailable:
            return False
        return True

    def wait_write_path(self, timeout_s: float = 120.0) -> None:
        """Until the workers a put waits on run (allocator, committer; the flusher under
        SYNC_FLUSH), one of them is halted or restarted (a test of that), or the store
        is read-only. An attach waits for the same at the supervisor, but only up to its
        own timeout (10 s): a boot under load took 9.7 s for the flusher once, and a test
        that is not about boot got WorkersNotUp. So a start waits here, generously."""
        names = {"allocator", "committer"}
        if self.config.get("flush_disk_type", "SYNC_FLUSH") == "SYNC_FLUSH":
            names.add("flusher")

        def up() -> bool:
            if not self._up():  # raises if the supervisor exited
                return False
            try:
                doc = self.status()
            except channel.SupervisorUnavailable:
                return False
            rows = [w for w in doc["workers"] if w["name"] in names]
            if doc.get("read_only") or any(w["state"] == "halted" or w["restarts"] for w in rows):
                return True
            return all(w["state"] == "running" for w in rows)

        wait_for(up, timeout_s, f"the write path ({', '.join(sorted(names))}) to run")

    def wait_workers_running(self, timeout_s: float = 60.0) -> None:
        """Until every worker has booted (settings loaded, control block mapped)."""

        def up() -> bool:
            return all(w["state"] == "running" for w in self.status()["workers"])

        wait_for(up, timeout_s, "every worker to be running")

    def status(self) -> dict[str, Any]:
        return channel.request(self.path, {"op": "status"})

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM the supervisor and return its exit code (None-safe, idempotent)."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"supervisor did not stop in {timeout_s} s") from None
        self.proc = None
        self._log.close()
        return code

    def shm_leftovers(self) -> list[str]:
        return leftover_shm(self.path)

    def read_log(self, *, keep_fillers: bool = False) -> list[DecodedRecord]:
        cl = CommitLog.open(
            self.path / "commitlog", int(self.config["segment_size_bytes"]), read_only=True
        )
        try:
            recs = list(cl.iter_records())
        finally:
            cl.close()
        return recs if keep_fillers else [r for r in recs if not is_filler(r)]


def check_chain(records: list[DecodedRecord], segment_size: int) -> None:
    """Physical offsets chain without gaps (a BLANK may end a segment) and queue
    offsets are dense from 0 per (topic, queue)."""
    expect = None
    seen: dict[tuple[str, int], int] = {}
    for r in records:
        if expect is not None and r.physical_offset != expect:
            seg_end = (expect // segment_size + 1) * segment_size
            assert r.physical_offset == seg_end, (
                f"gap: record at {r.physical_offset}, expected {expect} or {seg_end}"
            )
        expect = r.physical_offset + r.size
        key = (r.topic, r.queue_id)
        want = seen.get(key, 0)
        assert r.queue_offset == want, f"{key}: queue offset {r.queue_offset}, expected {want}"
        seen[key] = want + 1
