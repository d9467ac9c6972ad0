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
"""

from __future__ import annotations

import os
from typing import Final

AUTOGROUP: Final = "/proc/self/autogroup"


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
