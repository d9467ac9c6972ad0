"""When a silent worker is dead: heartbeats judged on the time the worker had, not on
the time the machine took from it.

A worker beats once per loop (`WorkerContext.beat`), and a beat costs microseconds, so a
live worker misses `heartbeat_timeout_ms` only when one tick runs long or when it gets
no CPU at all: two cores busy with a Spark job, a boot under load. Killing a worker that
is merely starved restarts it into the same starvation and loses its progress.

So the supervisor holds against a worker only its silence minus the time it spent
runnable but waiting for a CPU since its last beat: the second field of
`/proc/PID/schedstat` (run-queue wait, ns, kept by the scheduler for every task). A
worker that is stuck (a deadlock: asleep; a livelock: running) accumulates no such wait
and is killed after the timeout, as before; one that is starved is not. Where schedstat
cannot be read (another OS, a kernel without it) the wait counts as 0: plain wall time.

The wait is sampled by the supervisor's loop whenever it sees a new beat, so it is
attributed to the right beat within one supervisor loop (a few ms).
"""

from __future__ import annotations

from dataclasses import dataclass


def runqueue_wait_ns(pid: int) -> int:
    """Nanoseconds `pid`'s main thread has spent runnable but waiting for a CPU, or 0."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class HeartbeatJudge:
    """One worker process's heartbeat as the supervisor follows it. Supervisor only;
    a new one per spawned process."""

    pid: int
    beat_ms: int = -1  # the last beat seen
    wait_at_beat_ns: int = 0  # the worker's run-queue wait when that beat was seen
    killed: bool = False  # the supervisor sent SIGKILL (and said so)
    started_ms: int = 0  # wall ms at spawn: a worker that never beat is silent since then

    def silence(self, beat_ms: int, now_ms: int) -> tuple[int, int]:
        """`(silent_ms, starved_ms)`: how long the worker has been silent, less the time
        it waited for a CPU since its last beat; and that time."""
        waited = runqueue_wait_ns(self.pid)
        if beat_ms != self.beat_ms:
            self.beat_ms, self.wait_at_beat_ns = beat_ms, waited
        starved_ms = max(0, waited - self.wait_at_beat_ns) // 1_000_000
        age_ms = max(0, now_ms - max(beat_ms, self.started_ms))
        return max(0, age_ms - starved_ms), starved_ms
