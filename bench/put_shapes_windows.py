"""What each shape's timed window in `../shared/perf/put_shapes.py` shares its two CPUs
with: the store's catch-up on the shapes before it.

    python -m bench.put_shapes_windows [--n 60000] [--rounds 2] [--order str_key,readme,...]
        [--settle 0] [--pool-off] [--set KEY=JSON ...] [--runs 1] [--dir DIR]

One ASYNC_FLUSH store with 1 GiB segments, one producer running that check's sequence
(2,000 warm-up puts, then each round every shape's `--n` puts in `--order`, on one
store). At each window's start and end the producer reads the control block's positions
and the CPU time of itself and of every store process (`/proc/<pid>/task/*/schedstat`);
the parent samples the positions every millisecond meanwhile. Per window it prints:

* the rate;
* `at start`: the bytes published but not yet committed (pool on), and committed but
  not yet dispatched, when the window opened: its predecessor's backlog;
* `caught at`: when, in ms from the window's start, the committer and the dispatcher
  reached where the log stood at that start (0 or so: no backlog);
* the committer's and dispatcher's CPU in the window, in ms; the committer's also per KiB
  it had to copy (a record taken as `RECORD_KIB`): about 0.5 us on memory the VM has
  not given back to its host, 2-12 on memory it has (docs/tuning.md, "The committer's
  copy and the VM");
* the producer's CPU per put and its time waiting in a run queue (schedstat): the
  producer's CPU per put stays put, the wait is what moves its rate.

`--settle S` waits S seconds between windows (the backlog drains first); `--order`
changes which shape goes first. With `--settle` every window starts on an idle store;
if a shape's ratio to `str_key` recovers with it, the check's gap is the predecessor's
backlog, not the shape. The check's best-of-rounds ratios are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.callgrind_put_shapes import SHAPES_SRC
from bench.commit_first_touch import reported_kib
from bench.put_procs_cpu import proc_name
from bench.store_run import running_store

CLIENT = (
    r"""
import json, os, sys, time
from mqstore import StoreClient
from mqstore.ipc import control as ctl
from mqstore.ipc.access import read_names
from mqstore.ipc.control_views import Positions
store, n, rounds, order, settle, pids, out = sys.argv[1:8]
n, rounds, settle = int(n), int(rounds), float(settle)
order, pids = order.split(","), json.loads(pids)
pids["producer"] = os.getpid()
count = n
"""
    + SHAPES_SRC
    + r"""
def cpu(pid):
    # (ns on a CPU, ns waiting in a run queue), summed over the threads
    ns = wait = 0
    base = "/proc/%d/task" % pid
    for tid in os.listdir(base):
        try:
            with open("%s/%s/schedstat" % (base, tid)) as f:
                run, q = f.read().split()[:2]
            ns += int(run); wait += int(q)
        except OSError:
            pass
    return ns, wait
names = read_names(store)
cb = ctl.ControlBlock.attach(names["ctl"], names.get("pool") or "")
pos = Positions(cb)
def snap():
    return {"t": time.time(), "pub": pos.published, "com": pos.committed,
            "dis": pos.dispatched, "cpu": {k: cpu(v) for k, v in pids.items()}}
rows = []
with StoreClient.attach(store) as c:
    for i in range(2000):
        c.put("warm", pad)
    time.sleep(1.0)
    for rnd in range(rounds):
        for name in order:
            if settle:
                time.sleep(settle)
            f = shapes[name]
            a = snap()
            t0 = time.perf_counter()
            bad = 0
            for i in range(n):
                if f(c, i).status.name != "PUT_OK":
                    bad += 1
            dt = time.perf_counter() - t0
            b = snap()
            rows.append({"shape": name, "round": rnd, "dt": dt, "bad": bad, "a": a, "b": b})
cb.close()
with open(out, "w") as fh:
    json.dump(rows, fh)
"""
)


Sample = tuple[float, int, int, int]  # wall time, published, committed, dispatched


def _sampler(store_dir: Path, samples: list[Sample], stop: threading.Event) -> None:
    """Append the positions to `samples` every millisecond until `stop` is set."""
    from mqstore.ipc import control as c
    from mqstore.ipc.access import read_names
    from mqstore.ipc.control_views import Positions

    names = read_names(str(store_dir))
    cb = c.ControlBlock.attach(names["ctl"], names.get("pool") or "")
    pos = Positions(cb)
    try:
        while not stop.is_set():
            samples.append((time.time(), pos.published, pos.committed, pos.dispatched))
            time.sleep(0.001)
    finally:
        del pos
        cb.close()


def _caught(samples: list[Sample], t0: float, col: int, target: int) -> float:
    """ms from t0 until column `col` of the samples reached `target` (inf: never seen)."""
    for s in samples:
        if s[0] >= t0 and s[col] >= target:
            return (s[0] - t0) * 1000
    return float("inf")


def one_run(a: argparse.Namespace, extra: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """The producer's windows, and the store's start (s, until it answers)."""
    with tempfile.TemporaryDirectory(prefix="mqs-shape-windows-", dir=a.dir) as tmp:
        root = Path(tmp)
        client = root / "client.py"
        client.write_text(CLIENT)
        out = root / "rows.json"
        t0 = time.perf_counter()
        with running_store(root, "store", sync=False, pool=not a.pool_off, extra=extra) as run:
            boot_s = time.perf_counter() - t0
            sup = psutil.Process(run.proc.pid)
            pids = {proc_name(p): p.pid for p in sup.children(recursive=True)}
            samples: list[Sample] = []
            stop = threading.Event()
            th = threading.Thread(target=_sampler, args=(run.store_dir, samples, stop), daemon=True)
            th.start()
            try:
                subprocess.run(
                    [sys.executable, str(client), str(run.store_dir), str(a.n), str(a.rounds),
                     a.order, str(a.settle), json.dumps(pids), str(out)],
                    check=True, timeout=900,
                )  # fmt: skip
                time.sleep(0.5)
            finally:
                stop.set()
                th.join()
        rows: list[dict[str, Any]] = json.loads(out.read_text())
    # With the pool off readers follow `published`; the commit columns are then 0.
    for r in rows:
        x, y = r["a"], r["b"]
        if r["bad"]:
            raise SystemExit(f"{r['bad']} puts not PUT_OK")
        readable = x["pub"] if a.pool_off else x["com"]
        r["com_backlog"] = x["pub"] - readable
        r["dis_backlog"] = readable - x["dis"]
        r["com_caught"] = 0.0 if a.pool_off else _caught(samples, x["t"], 2, x["pub"])
        r["dis_caught"] = _caught(samples, x["t"], 3, readable)
        r["cpu_ms"] = {k: (y["cpu"][k][0] - x["cpu"][k][0]) / 1e6 for k in x["cpu"]}
        r["wait_ms"] = {k: (y["cpu"][k][1] - x["cpu"][k][1]) / 1e6 for k in x["cpu"]}
    return rows, boot_s


RECORD_KIB = 1.1  # a 1 KiB body's record with its header, topic, tags and keys, about


def window_line(r: dict[str, Any], n: int) -> str:
    """One window's line (module doc)."""
    cpu, mib = r["cpu_ms"], 1 << 20
    committer = cpu.get("committer", 0.0)
    others = ", ".join(
        f"{k} {v:.0f}"
        for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])
        if k not in ("producer", "committer", "dispatcher") and v >= 5
    )
    return (
        f"r{r['round']} {r['shape']:<10} {n / r['dt']:>9,.0f}/s"
        f"  producer {cpu['producer'] / n * 1e3:.2f} us/put,"
        f" {r['wait_ms']['producer']:.0f} ms in a run queue"
        f" | at start: commit {r['com_backlog'] / mib:6.1f} MiB,"
        f" dispatch {r['dis_backlog'] / mib:6.1f} MiB"
        f" | caught at {r['com_caught']:5.0f} / {r['dis_caught']:5.0f} ms of {r['dt'] * 1e3:.0f}"
        f" | CPU ms in window: committer {committer:.0f}"
        f" ({committer * 1e3 / (n * RECORD_KIB):.2f} us/KiB),"
        f" dispatcher {cpu.get('dispatcher', 0.0):.0f}" + (f", {others}" if others else "")
    )


def report(rows: list[dict[str, Any]], n: int) -> list[str]:
    """A line per window, then each shape's best rate and its ratio to str_key's."""
    best: dict[str, float] = {}
    for r in rows:
        best[r["shape"]] = max(best.get(r["shape"], 0.0), n / r["dt"])
    out = [window_line(r, n) for r in rows]
    base = best.get("str_key")
    if base:
        ratios = (f"{k} {v:,.0f} ({v / base:.2f})" for k, v in best.items())
        out.append("best of rounds, ratio to str_key: " + ", ".join(ratios))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.put_shapes_windows", description=__doc__)
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--order", default="str_key,readme,two_keys,properties")
    ap.add_argument("--settle", type=float, default=0.0)
    ap.add_argument("--pool-off", action="store_true")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a store setting by its snake_case name, e.g. warm_mapped_file_enable=true",
    )
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--dir", help="where the store goes (default: a new temporary directory)")
    a = ap.parse_args(argv)
    extra: dict[str, Any] = {"segment_size_bytes": 1 << 30}
    for kv in a.set:
        k, _, v = kv.partition("=")
        extra[k] = json.loads(v)
    for i in range(a.runs):
        rk = reported_kib()
        load = os.getloadavg()[0]
        rows, boot_s = one_run(a, extra)
        print(
            f"run {i + 1}: load {load:.1f} -> {os.getloadavg()[0]:.1f},"
            f" store start {boot_s:.1f} s, reported_kib {_kib(rk)} -> {_kib(reported_kib())},"
            f" settings {extra}, settle {a.settle}"
        )
        for line in report(rows, a.n):
            print("  " + line)
    return 0


def _kib(kib: int) -> str:
    return str(kib) if kib >= 0 else "-"  # -1: no free page reporting here


if __name__ == "__main__":
    raise SystemExit(main())
