"""The store's CPU priority (`store_nice`): its processes ahead of the producers they serve.

Every sync put needs the flusher to run twice (its round, its wake), every async put
the committer and the dispatcher to follow; on a machine whose cores the producers
saturate, each hand-off otherwise waits in the run queue behind them (profile_sync:
the flusher runnable but not running 30-75 % of the window, the dispatcher seconds
behind). The supervisor sets its own nice value before it starts the workers, which
inherit it. With autogroup scheduling (`/proc/sys/kernel/sched_autogroup_enabled`) a nice
value only ranks processes of one session against each other, so a supervisor that
leads its session (started by systemd, or `setsid`) gives its session's group the same
value. Lowering a nice value needs CAP_SYS_NICE (or RLIMIT_NICE): without it nothing
changes and `apply` says why. The processes block in fdatasync, futexes and sleeps
between their short rounds, so what they take from producers is what they use.

A nice value sets a share, not a wake-up latency. Linux's EEVDF scheduler (6.6+) lets the
running task finish its time slice (0.7-3 ms) before a woken one runs, whatever their
weights: under saturating producers a flusher woken by a sync put waited 0.1-1.4 ms in the
run queue (`bench/results/sync_disk.md`). From Linux 6.12 a task may ask for a shorter
slice (`sched_setattr`, `sched_runtime` of a SCHED_OTHER task, 100 µs to 100 ms): its
deadline comes sooner, so on wake-up it preempts a task with a longer one. `apply_slice`
asks for `store_slice_us` (the workers inherit it); no privilege is needed, and an older
kernel accepts and ignores it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from typing import Final

AUTOGROUP: Final = "/proc/self/autogroup"
# struct sched_attr (include/uapi/linux/sched/types.h, SCHED_ATTR_SIZE_VER1): size, policy,
# flags, nice, priority, runtime, deadline, period, util_min, util_max
SCHED_ATTR: Final = struct.Struct("=IIQiIQQQII")
SYS_SCHED_SETATTR: Final = {"x86_64": 314, "aarch64": 274, "arm64": 274}
SCHED_OTHER: Final = 0


def apply(nice: int) -> list[str]:
    """Set this process's nice value (and its autogroup's, when it leads its session) to
    `nice`; what was done or refused, one line each, for the log."""
    said: list[str] = []
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            said.append(f"nice {nice}")
        except OSError as e:
            said.append(f"nice {nice} not applied ({e.strerror}): the store runs at the default")
    if os.getsid(0) == os.getpid() and os.path.exists(AUTOGROUP):
        try:
            with open(AUTOGROUP, "w") as f:
                f.write(str(nice))
            said.append(f"session group nice {nice}")
        except OSError as e:
            said.append(f"session group nice {nice} not applied ({e.strerror})")
    return said


def _setattr_slice(slice_ns: int) -> int:
    """sched_setattr(0, SCHED_OTHER at the current nice, runtime=slice_ns); 0 or an errno."""
    nr = SYS_SCHED_SETATTR.get(platform.machine())
    if nr is None:
        return 38  # ENOSYS: no syscall number known for this machine
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    attr = ctypes.create_string_buffer(
        SCHED_ATTR.pack(SCHED_ATTR.size, SCHED_OTHER, 0, nice, 0, slice_ns, 0, 0, 0, 0)
    )
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, 0, attr, 0) != 0:
        return ctypes.get_errno()
    return 0


def apply_slice(us: int) -> list[str]:
    """Ask for a `us` µs scheduler slice (0: leave the kernel's default); what was done or
    refused, one line, for the log. Only a SCHED_OTHER process asks (a real-time policy
    set by its operator is kept)."""
    if us <= 0 or os.sched_getscheduler(0) != SCHED_OTHER:
        return []
    err = _setattr_slice(us * 1000)
    if err:
        return [f"time slice {us} us not applied ({os.strerror(err)}): the kernel's default"]
    return [f"time slice {us} us"]


def apply_rt(priority: int) -> list[str]:
    """Run this process SCHED_FIFO at real-time `priority` (0: leave it as it is); what was
    done or refused, one line, for the log. The flusher's, under SYNC_FLUSH
    (`flusher_rt_priority`): with SCHED_OTHER, even at nice -10 with a 100 µs slice, a
    woken flusher waited for a CPU behind the producers in 44-52 % of a 16-producer sync
    run, and those waits, not the CPU per put, bounded the rate
    (`bench/results/sync16_cpu.md`). A SCHED_FIFO task runs the moment it is woken and
    keeps the CPU until it blocks: the flusher blocks in every round (fdatasync, futex),
    and never yields to poll while real-time (`workers.flusher`); the kernel's real-time
    throttling (`sched_rt_runtime_us`) bounds it all the same."""
    if priority <= 0:
        return []
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as e:
        return [f"real-time priority {priority} not applied ({e.strerror}): SCHED_OTHER"]
    return [f"real-time priority {priority} (SCHED_FIFO)"]
