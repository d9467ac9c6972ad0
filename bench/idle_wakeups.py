"""What an idle store costs: each process's wake-ups and CPU per second with no puts.

    python -m bench.idle_wakeups [--seconds 5] [--sync] [--pool off]

Starts a fresh store (`bench.store_run.running_store`), makes one put so that every
worker has seen the log move, waits a second, then reads each of the supervisor's and
its workers' `/proc/PID/status` (voluntary and involuntary context switches) and
`/proc/PID/schedstat` (CPU ns) over `--seconds`, summed over the process's threads.
A worker that polls shows about one voluntary switch per wait; one that sleeps on a
futex until work arrives shows its timeout's rate.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import psutil

from bench.store_run import client_api, running_store


def _sample(pid: int) -> tuple[int, int]:
    """(context switches, CPU ns) of every thread of `pid`."""
    switches = cpu = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            cpu += int(f.read().split()[0])
    return switches, cpu


def _name(p: psutil.Process) -> str:
    cmd = p.cmdline()
    if "mqstore.workers.worker_main" in cmd:
        return cmd[cmd.index("mqstore.workers.worker_main") + 1]
    return "supervisor" if p.children() else f"pid {p.pid}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.idle_wakeups")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sync", action="store_true", help="SYNC_FLUSH (default ASYNC_FLUSH)")
    ap.add_argument("--pool", choices=("on", "off"), default="on")
    args = ap.parse_args(argv)
    store_client, _ = client_api()
    with (
        tempfile.TemporaryDirectory(prefix="mqs-idle-") as tmp,
        running_store(Path(tmp), "store", sync=args.sync, pool=args.pool == "on") as run,
    ):
        with store_client.attach(str(run.store_dir)) as c:
            c.put("idle", b"x" * 1024)
        time.sleep(1.0)  # the workers' back-off reaches its longest wait
        top = psutil.Process(run.proc.pid)
        procs = {_name(p): p.pid for p in [top, *top.children(recursive=True)]}
        before = {n: _sample(pid) for n, pid in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.seconds)
        after = {n: _sample(pid) for n, pid in procs.items()}
        wall = time.monotonic() - t0
    print(f"idle {wall:.1f} s, {'SYNC' if args.sync else 'ASYNC'}_FLUSH, pool {args.pool}")
    total_sw = total_cpu = 0.0
    for n in sorted(procs):
        sw = (after[n][0] - before[n][0]) / wall
        cpu = (after[n][1] - before[n][1]) / wall / 1e6
        total_sw, total_cpu = total_sw + sw, total_cpu + cpu
        print(f"  {n:12s} {sw:8.1f} wake-ups/s  {cpu:7.2f} ms CPU/s")
    print(f"  {'all':12s} {total_sw:8.1f} wake-ups/s  {total_cpu:7.2f} ms CPU/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
