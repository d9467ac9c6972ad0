"""Where the CPU of an async put goes, over every process: producers and the store's own.

    python -m bench.profile_put_scaling [--producers 1 2 4] [--batch K] [--pool on|off]
                                        [--duration 3] [--save PATH]

For each producer count it starts a fresh store (as `bench put` does), runs the same
producers as the put benchmark (`bench.bench_put`: 1 KiB body, tags, a unique key per
message) for `--duration` seconds, and reads the CPU time (user + system) that each
process used meanwhile: the producers (the parent's reaped children, `os.times`) and
every process of the store's tree (psutil, by process name: supervisor, committer,
flusher, dispatcher, ...), counted from when they are done starting. It prints msgs/s
and CPU µs per message per process, their sum, and the rate that sum allows on this
machine's cores (cores / CPU per message): if that bound is below a goal, the goal is
out of reach on this machine whatever the producers do. The machine's load average is
printed with it (other work adds noise).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.bench_put import run_puts
from bench.report import command_line, run_meta, text_head
from bench.store_run import running_store


def _tree_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per process name in the tree under `pid` (threads in)."""
    out: dict[str, float] = {}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
            name = _name(p)
        except psutil.NoSuchProcess:
            continue
        out[f"{name}[{p.pid}]"] = t.user + t.system
    return out


def _name(p: psutil.Process) -> str:
    cmd = p.cmdline()
    for i, a in enumerate(cmd):
        if a == "mqstore.workers.worker_main" and i + 1 < len(cmd):
            return cmd[i + 1]
    if "start" in cmd:
        return "supervisor"
    return " ".join(cmd)[-40:]


def _settle(store_pid: int, timeout: float = 20.0) -> None:
    """Wait until the store's processes are done starting (importing, mapping, recovering):
    their CPU over half a second under a quarter of a core, as when idle."""
    deadline = time.monotonic() + timeout
    last = sum(_tree_cpu(store_pid).values())
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = sum(_tree_cpu(store_pid).values())
        if now - last < 0.125:
            return
        last = now


def measure(root: Path, producers: int, duration: float, pool: bool, batch: int) -> dict[str, Any]:
    name = f"scaling-{'batch' if batch else 'async'}-{producers}"
    with running_store(root, name, sync=False, pool=pool) as store:
        _settle(store.proc.pid)
        before = _tree_cpu(store.proc.pid)
        t0 = os.times()
        wall0 = time.monotonic()
        r = run_puts(store, name, producers=producers, duration_s=duration, batch=batch)
        wall = time.monotonic() - wall0
        t1 = os.times()
        after = _tree_cpu(store.proc.pid)
    msgs = r.messages
    reaped = (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)
    cpu = {"producers": reaped}
    for k, v in after.items():
        cpu[k] = v - before.get(k, 0.0)
    return {
        "producers": producers,
        "msgs": msgs,
        "msgs_per_s": r.msgs_per_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "load": os.getloadavg(),
    }


def report(res: dict[str, Any], cores: int) -> str:
    msgs = max(1, res["msgs"])
    lines = [
        f"producers {res['producers']}: {res['msgs_per_s']:,.0f} msgs/s "
        f"({res['msgs']:,} msgs, {res['wall_s']:.2f} s incl. setup), "
        f"load {' '.join(f'{x:.2f}' for x in res['load'])}"
    ]
    total = 0.0
    for k, v in sorted(res["cpu_s"].items(), key=lambda kv: -kv[1]):
        if v < 0.005:
            continue
        total += v
        lines.append(f"  {k:28} {v:7.2f} CPU s  {v / msgs * 1e6:6.2f} µs/msg")
    per = total / msgs
    lines.append(
        f"  {'sum':28} {total:7.2f} CPU s  {per * 1e6:6.2f} µs/msg -> at most "
        f"{cores / per:,.0f} msgs/s on {cores} cores"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_put_scaling", description=__doc__)
    ap.add_argument("--producers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--pool", choices=("on", "off"), default="on")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--save", default=None)
    a = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    head = text_head(run_meta(command_line("bench.profile_put_scaling", argv)))
    print("\n".join(head), flush=True)
    out = list(head)
    with tempfile.TemporaryDirectory(prefix="mqs-scaling-") as tmp:
        for n in a.producers:
            res = measure(Path(tmp), n, a.duration, a.pool == "on", a.batch)
            text = report(res, cores)
            print(text, flush=True)
            out.append(text)
    if a.save:
        Path(a.save).write_text("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
