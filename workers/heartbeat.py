"""When a silent worker is dead: heartbeats judged on the time the worker had, not on
the time the machine took from it.

A worker beats once per loop (`WorkerContext.beat`), and a beat costs microseconds, so a
live worker misses `heartbeat_timeout_ms` only when one tick runs long or when it gets
no CPU at all: two cores busy with a Spark job, a boot under load. Killing a worker that
is merely starved restarts it into the same starvation and loses its progress.

So the supervisor holds against a worker only its silence minus the time the kernel
shows it could not run:

- runnable but waiting for a CPU since its last beat: the second field of
  `/proc/PID/schedstat` (run-queue wait, ns, kept by the scheduler for every task).
  The kernel adds a wait to it only when the wait ends (the task gets a CPU), so a wait
  still under way is seen another way: a task runnable (`R` in `/proc/PID/stat`) at two
  looks in a row whose run time and run-queue wait (schedstat's first two fields) did not
  move between them has not run in between: it waited for a CPU all that time. Seen at
  load: a worker queued behind a vCPU the host took away, or one niced far below its
  neighbours, waits a second and more in one piece, and the supervisor looked while it
  still waited;
- blocked in the kernel on I/O (state `D` in `/proc/PID/stat`: a page fault or an
  fsync on a disk other jobs keep busy; the allocator warming a segment). The kernel
  keeps no total of this without delay accounting, so the judge samples the state each
  time it looks (every supervisor loop, a few ms) and counts the time since its last
  look while the worker is in `D`. A SIGKILL would not act before the I/O ends anyway;
- time the supervisor did not watch: it looks every loop (50 ms at most); a gap of over
  `WATCH_GAP_MS` between two looks (the supervisor itself got no CPU, or the whole
  machine was paused) is time nobody could tell the worker's silence from the machine's,
  and beyond `WATCH_GAP_MS` it is not held against the worker either (less what the
  rules above already excused of it). Before, an idle cleaner was SIGKILLed at load 30
  for a silence that grew by seconds between two of the supervisor's looks.

A worker that is stuck is killed after the timeout of watched time, as before: a
deadlock sleeps (`S`), a livelock runs (`R`, its run time moving), a SIGSTOPped one is
stopped (`T`), and none of these is excused. Where /proc cannot be read (another OS, a
kernel without schedstat) only the supervisor's own gaps are excused.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Final

WATCH_GAP_MS: Final = 1000  # a longer gap between two looks is the supervisor's, not the worker's


def _schedstat_run_wait(raw: bytes) -> tuple[int, int]:
    """(run time, run-queue wait), ns, from `/proc/PID/schedstat`; (-1, 0) unreadable."""
    try:
        run, wait = raw.split()[:2]
        return int(run), int(wait)
    except ValueError:
        return -1, 0


def _stat_state(stat: bytes) -> bytes:
    end = stat.rfind(b")")  # the command name may hold spaces and parentheses
    return stat[end + 2 : end + 3] if end >= 0 else b""


def runqueue_wait_ns(pid: int) -> int:
    """Nanoseconds `pid`'s main thread has spent runnable but waiting for a CPU, or 0."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return _schedstat_run_wait(f.read())[1]
    except OSError:
        return 0


class ProcFiles:
    """`/proc/PID/schedstat` and `/proc/PID/stat` of one process, each opened once and
    read again with one pread: the supervisor looks at every worker every loop (about 20
    times a second each), and an open, read and close of a /proc file cost 4-5 times a
    pread of one held open (9.2 against 2.0 µs of CPU here). A descriptor names the process, not
    the pid: once it exited, reads fail (ESRCH) and answer as a missing file did."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fds: dict[str, int] = {}

    def read(self, name: str) -> bytes | None:
        fd = self._fds.get(name)
        try:
            if fd is None:
                fd = self._fds[name] = os.open(
                    f"/proc/{self.pid}/{name}", os.O_RDONLY | os.O_CLOEXEC
                )
            return os.pread(fd, 1024, 0)
        except OSError:
            return None

    def sched(self) -> tuple[int, int, bytes]:
        """(run time ns, run-queue wait ns, state letter) now; (-1, 0, b"") unreadable."""
        raw = self.read("schedstat")
        run, wait = (-1, 0) if raw is None else _schedstat_run_wait(raw)
        stat = self.read("stat")
        return run, wait, b"" if stat is None else _stat_state(stat)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


@dataclass
class HeartbeatJudge:
    """One worker process's heartbeat as the supervisor follows it. Supervisor only;
    a new one per spawned process."""

    pid: int
    beat_ms: int = -1  # the last beat seen
    wait_at_beat_ns: int = 0  # the worker's run-queue wait when that beat was seen
    killed: bool = False  # the supervisor sent SIGKILL (and said so)
    started_ms: int = 0  # at spawn: a worker that never beat is silent since then
    blocked_ms: int = 0  # time seen blocked on I/O since the last beat
    queued_ms: int = 0  # a run-queue wait still under way, not yet in schedstat
    unwatched_ms: int = 0  # the supervisor's own gaps since the last beat, past WATCH_GAP_MS
    looked_ms: int = -1  # when the judge last looked
    seen: tuple[int, int, bytes] = (-1, 0, b"")  # (run ns, wait ns, state) at that look
    proc: ProcFiles = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.proc = ProcFiles(self.pid)

    def silence(self, beat_ms: int, now_ms: int) -> tuple[int, int]:
        """`(silent_ms, excused_ms)`: how long the worker has been silent, less the time
        it waited for a CPU or was blocked on I/O since its last beat, or the supervisor
        did not look (past `WATCH_GAP_MS`); and that time. Every ms here (`beat_ms`,
        `now_ms`, `started_ms`) is on `ipc.control.heartbeat_clock_ms`, CLOCK_MONOTONIC,
        which a step of the wall clock does not move."""
        run, waited, state = now = self.proc.sched()
        if beat_ms != self.beat_ms:
            self.beat_ms, self.wait_at_beat_ns = beat_ms, waited
            self.blocked_ms = self.queued_ms = self.unwatched_ms = 0
        elif self.looked_ms >= 0:
            gap = max(0, now_ms - self.looked_ms)
            was_run, was_waited, was_state = self.seen
            seen = 0  # of the gap, what the states show it could not run
            if waited != was_waited:  # a wait ended: schedstat has it now, in full
                self.queued_ms = 0
            if state == b"D":
                self.blocked_ms += gap
                seen = gap
            elif waited == was_waited and state == was_state == b"R" and run == was_run >= 0:
                self.queued_ms += gap  # runnable at both looks and never ran between
                seen = gap
            waited_in_gap = max(0, waited - was_waited) // 1_000_000
            self.unwatched_ms += max(0, gap - WATCH_GAP_MS - seen - waited_in_gap)
        self.looked_ms, self.seen = now_ms, now
        starved_ms = max(0, waited - self.wait_at_beat_ns) // 1_000_000
        age_ms = max(0, now_ms - max(beat_ms, self.started_ms))
        excused = starved_ms + self.blocked_ms + self.queued_ms + self.unwatched_ms
        excused_ms = min(age_ms, excused)
        return age_ms - excused_ms, excused_ms

    def close(self) -> None:
        """Close the /proc files (the process exited, or the supervisor stops)."""
        self.proc.close()
