"""Heartbeats are written and judged on CLOCK_MONOTONIC (`ipc.control.heartbeat_clock_ms`):
a step of the wall clock (NTP, `date -s`) makes neither a silence nor a beat from the
future. The wall clock is stepped in this process only (`time.time` and `time.time_ns`
replaced), where the judge runs: stepping the machine's would disturb everything else."""

from __future__ import annotations

import ast
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mqstore.ipc import control as c
from mqstore.workers import base, heartbeat, stats, supervisor
from mqstore.workers.heartbeat import HeartbeatJudge

WORKER = textwrap.dedent(
    """
    import sys, time
    from mqstore.ipc import control as c
    cb = c.ControlBlock.attach(sys.argv[1], sys.argv[2])
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    while True:  # a worker's loop: beat, wait, tick
        cb.beat(0)
        time.sleep(0.02)
    """
)


@pytest.mark.parametrize("step_s", [3600, -3600], ids=["forward", "back"])
def test_a_wall_clock_step_is_neither_silence_nor_a_fresh_beat(
    cb: c.ControlBlock, monkeypatch: pytest.MonkeyPatch, step_s: int
) -> None:
    """A worker process beats every 20 ms while the judge watches it (no silence), then
    stops (SIGSTOP). The wall clock steps by `step_s` after the stop. The judge's silence
    then follows the time since the last beat: a step forward does not make it an hour
    (the supervisor would SIGKILL every worker), a step back does not make the stopped
    worker's last beat one from the future, fresh for an hour. With the wall clock as
    the heartbeat's clock the first reads 3,600,000 ms, the second 0."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, cb.ctl_name, cb.pool_name], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        judge = HeartbeatJudge(proc.pid, started_ms=c.heartbeat_clock_ms())

        def look() -> int:
            silent, _excused = judge.silence(cb.worker(0)[2], c.heartbeat_clock_ms())
            return silent

        end = time.monotonic() + 0.5
        healthy = 0
        while time.monotonic() < end:  # the supervisor's loop, on a beating worker
            healthy = max(healthy, look())
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        last_beat = cb.worker(0)[2]
        real_ns = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: real_ns() + step_s * 1_000_000_000)
        monkeypatch.setattr(time, "time", lambda: real_ns() / 1e9 + step_s)
        worst = 0
        silent = 0
        while time.monotonic() < stopped_at + 1.5:
            silent = look()
            since_stop_ms = (time.monotonic() - stopped_at) * 1000
            worst = max(worst, int(silent - since_stop_ms))
            time.sleep(0.02)
        assert abs(time.time() - real_ns() / 1e9 - step_s) < 1  # the step held
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert healthy < 1000, healthy
    assert cb.worker(0)[2] == last_beat  # it was stopped: no beat after
    # Silent at least the 1.5 s it was stopped, less the beat interval and a look's lag.
    assert silent >= 1000, silent
    # Never more than the time since the stop plus the beat interval (and slack).
    assert worst < 500, worst


HEARTBEAT_CODE = (
    c.heartbeat_clock_ms,
    c.ControlBlock.beat,
    base.WorkerContext.beat,
    heartbeat.HeartbeatJudge,
    supervisor.Supervisor._spawn,
    supervisor.Supervisor._judge_heartbeat,
    stats.worker_docs,
)


@pytest.mark.parametrize("code", HEARTBEAT_CODE, ids=lambda f: f.__qualname__)
def test_no_heartbeat_writer_or_judge_reads_the_wall_clock(code: object) -> None:
    """Where a beat is written, judged or aged for `mqstore status`, no `time.time` or
    `time.time_ns`: only `heartbeat_clock_ms`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(code)))  # type: ignore[arg-type]
    wall = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and n.attr in ("time", "time_ns")
        and isinstance(n.value, ast.Name)
        and n.value.id == "time"
    ]
    assert wall == [], wall
