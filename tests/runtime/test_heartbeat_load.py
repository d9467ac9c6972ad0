"""Heartbeats under load: a worker that is merely starved of CPU is not killed.

Before, two cores busy with a Spark job made the supervisor SIGKILL a healthy committer
twice: a heartbeat older than `heartbeat_timeout_ms` was taken as death whatever the
reason. Now the time a worker spent waiting for a CPU is not held against it
(`workers.heartbeat`); a stuck worker is still killed (`test_failures`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore import PutMessageStatus, StoreClient
from mqstore.conf.settings import StoreSettings
from mqstore.ipc.control import heartbeat_clock_ms
from mqstore.workers.heartbeat import WATCH_GAP_MS, HeartbeatJudge, runqueue_wait_ns
from tests.runtime.harness import Store, wait_for

SPIN = """import os, sys
os.nice(int(sys.argv[1]))
print("spinning", flush=True)
while True:
    pass
"""


@contextlib.contextmanager
def _spinners(n: int, nice: int = 0, cpu: int | None = None) -> Iterator[list[int]]:
    """`n` processes that only burn CPU (pinned to `cpu` when given), each spinning at
    its nice value when this yields; killed on exit. (Before, a measurement began while
    they still started: on a loaded machine the starved one's interpreter start, its
    imports read from a busy disk, is time neither spent spinning nor waiting for a CPU.)"""
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(n):
            p = subprocess.Popen(
                [sys.executable, "-c", SPIN, str(nice)], stdout=subprocess.PIPE, text=True
            )
            procs.append(p)
        for p in procs:  # started where there was room, then pinned
            assert p.stdout is not None and p.stdout.readline() == "spinning\n"
            if cpu is not None:
                os.sched_setaffinity(p.pid, {cpu})
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="no schedstat")
def test_a_starved_process_is_judged_on_the_time_it_had() -> None:
    """A process that never beats, pinned to one CPU with two spinners niced above it:
    its silence is nearly all run-queue wait, so the judge holds almost none of it
    against it."""
    with _spinners(2, nice=-10, cpu=0), _spinners(1, cpu=0) as (starved,):
        judge = HeartbeatJudge(starved)
        beat = heartbeat_clock_ms()
        judge.silence(beat, beat)
        t0 = time.monotonic()
        wait_for(lambda: runqueue_wait_ns(starved) > 0, 10, "schedstat to move")
        time.sleep(1.5)  # the starvation being measured: nothing to wait for but time
        # the kernel adds a wait to schedstat when the task gets the CPU back, so the
        # wait under way now is not in it yet (most of a second at load 40): look right
        # after the starved process ran again
        waited = runqueue_wait_ns(starved)
        wait_for(lambda: runqueue_wait_ns(starved) != waited, 30, "the starved one to run")
        silent, starved_ms = judge.silence(beat, heartbeat_clock_ms())
        wall_ms = (time.monotonic() - t0) * 1000
    assert starved_ms > 0.8 * wall_ms, (silent, starved_ms, wall_ms)
    assert silent < 0.3 * wall_ms, (silent, starved_ms, wall_ms)


@pytest.mark.slow
def test_busy_cores_do_not_get_workers_killed(tmp_path: os.PathLike[str]) -> None:
    """Every core spun by processes niced above the store's (as a batch job's executors
    may be), for longer than the default heartbeat timeout, with puts going on: no
    worker is killed or restarted, and every put is answered."""
    timeout_s = StoreSettings().heartbeat_timeout_ms / 1000
    st = Store(tmp_path / "store")  # type: ignore[operator]
    st.start()
    try:
        st.wait_workers_running()
        with StoreClient.attach(st.path) as client, _spinners(2 * (os.cpu_count() or 2), -10):
            end = time.monotonic() + timeout_s * 1.6
            while time.monotonic() < end:
                r = client.put("busy", b"x" * 200)
                assert r.status is PutMessageStatus.PUT_OK, r
        rows = {w["name"]: (w["state"], w["restarts"]) for w in st.status()["workers"]}
        assert set(rows.values()) == {("running", 0)}, (rows, st.output()[-3000:])
        assert "killing it" not in st.output()
        assert st.stop() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            if st.proc is not None:
                os.kill(st.proc.pid, signal.SIGTERM)
        st.stop()
    assert st.shm_leftovers() == []


def test_a_worker_that_never_beat_is_silent_since_it_was_spawned() -> None:
    now = heartbeat_clock_ms()
    judge = HeartbeatJudge(os.getpid(), started_ms=now - 250)
    silent, starved = judge.silence(0, now)  # no beat yet: the control block holds 0
    assert 0 <= silent + starved <= 250
    assert judge.silence(now - 40, now)[0] <= 40  # a beat after the spawn counts from the beat


# The parent of a vfork() waits in the kernel, in uninterruptible sleep (state D, as a
# process blocked on a busy disk is), until the child execs or exits; here the child
# sleeps for the seconds given first. A real D state, not a simulated one.
VFORK_WAIT_C = r"""
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    unsigned s = argc > 1 ? (unsigned)atoi(argv[1]) : 3;
    pid_t pid = vfork();
    if (pid == 0) { sleep(s); _exit(0); }
    return pid < 0;
}
"""


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3].decode()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
def test_a_process_blocked_in_the_kernel_is_not_held_silent(tmp_path: os.PathLike[str]) -> None:
    """Blocked in uninterruptible sleep (D), as a worker is in a page fault or an fsync
    on a disk other jobs keep busy, for a second and a half: the judge, looking every
    50 ms as the supervisor's loop does, excuses nearly all of it; a SIGSTOPped process
    (T) beside it is excused nothing."""
    src, exe = Path(tmp_path) / "vfork_wait.c", Path(tmp_path) / "vfork_wait"
    src.write_text(VFORK_WAIT_C)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True, timeout=120)
    blocked = subprocess.Popen([str(exe), "30"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_for(lambda: _state(blocked.pid) == "D", 30, "the vfork parent to block")
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_for(lambda: _state(stopped.pid) == "T", 30, "the stop")
        beat = heartbeat_clock_ms()
        judges = {p.pid: HeartbeatJudge(p.pid) for p in (blocked, stopped)}
        for j in judges.values():
            j.silence(beat, beat)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # the supervisor's loop
            now = heartbeat_clock_ms()
            got = {pid: j.silence(beat, now) for pid, j in judges.items()}
            time.sleep(0.05)
        wall = heartbeat_clock_ms() - beat
    finally:
        children = Path(f"/proc/{blocked.pid}/task/{blocked.pid}/children").read_text().split()
        for child in children:  # the vfork child, asleep: not left behind
            os.kill(int(child), signal.SIGKILL)
        for p in (blocked, stopped):
            p.kill()
            p.wait()
    silent, excused = got[blocked.pid]
    assert excused > 0.8 * wall and silent < 0.3 * wall, (silent, excused, wall)
    silent, excused = got[stopped.pid]
    # nothing excused for its state; only a stall of this loop itself over WATCH_GAP_MS
    # (judges.unwatched_ms, 0 unless the machine stalled the test) would be
    unwatched = judges[stopped.pid].unwatched_ms
    assert excused == unwatched and silent > 0.8 * wall - unwatched, (silent, excused, wall)


IDLE_SPIN = """import os, sys
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
print("spinning", flush=True)
while True:
    pass
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="no schedstat")
def test_a_wait_for_a_cpu_still_under_way_is_not_held_silent() -> None:
    """A process that never beats and waits for a CPU in pieces of about a second (it is
    SCHED_IDLE, pinned to one CPU beside a spinner): the kernel adds each wait to
    schedstat only when it ends, and the judge, looking every 50 ms as the supervisor's
    loop does, saw most of each wait as silence (941 ms at worst in 3 s before; a worker
    behind a vCPU the host took away waits so). Runnable at two looks, its run time
    still, it waited between them: at no look is much of its silence held against it."""
    with _spinners(1, cpu=0):
        starved = subprocess.Popen(
            [sys.executable, "-c", IDLE_SPIN], stdout=subprocess.PIPE, text=True
        )
        try:
            assert starved.stdout is not None and starved.stdout.readline() == "spinning\n"
            os.sched_setaffinity(starved.pid, {0})
            judge = HeartbeatJudge(starved.pid)
            beat = heartbeat_clock_ms()
            judge.silence(beat, beat)
            worst = (0, 0, 0)
            end = time.monotonic() + 4.0
            while time.monotonic() < end:  # the supervisor's loop
                time.sleep(0.05)
                now = heartbeat_clock_ms()
                silent, excused = judge.silence(beat, now)
                worst = max(worst, (silent, excused, now - beat))
        finally:
            starved.kill()
            starved.wait()
            assert starved.stdout is not None
            starved.stdout.close()
    wall = heartbeat_clock_ms() - beat
    assert worst[0] < 0.1 * wall, (worst, wall)


def test_the_supervisors_own_gap_is_not_held_against_a_worker() -> None:
    """The supervisor looks every loop; when it got no CPU itself for seconds (or the
    machine was paused), the gap between two looks is not the worker's silence past
    WATCH_GAP_MS: an idle cleaner, asleep between its ticks, was SIGKILLed at load 30
    for 8.9 s of silence. A sleeping process is still held silent for all the time the
    judge watches it, so a deadlocked worker is still killed."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_for(lambda: _state(sleeper.pid) == "S", 30, "the sleeper to sleep")
        judge = HeartbeatJudge(sleeper.pid)
        beat = heartbeat_clock_ms()
        judge.silence(beat, beat)
        gap_ms = WATCH_GAP_MS + 1500
        time.sleep(gap_ms / 1000)  # the stalled supervisor: nothing to wait for but time
        now = heartbeat_clock_ms()
        silent, excused = judge.silence(beat, now)
        assert (silent, excused) == (WATCH_GAP_MS, now - beat - WATCH_GAP_MS), now - beat
        t0, before, unwatched = now, silent, judge.unwatched_ms
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # then watched, every 50 ms: all of it is held
            time.sleep(0.05)
            now = heartbeat_clock_ms()
            silent, _excused = judge.silence(beat, now)
        # (less only a stall of this loop itself over WATCH_GAP_MS, 0 unless the machine
        # stalled the test)
        watched = now - t0 - (judge.unwatched_ms - unwatched)
        assert silent - before == watched, (silent, before, now - t0, judge.unwatched_ms)
    finally:
        sleeper.kill()
        sleeper.wait()
