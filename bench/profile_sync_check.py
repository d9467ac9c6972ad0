"""The sync perf checks' own shape, profiled: where the rate of `sync16_vs_naive.py` and
`sync64_vs_naive.py` (the shared perf folder) goes.

    python -m bench.profile_sync_check [--producers 16,64] [--pool on|off] [--naive]
                                       [--save] [--dir DIR] [--conf KEY=VALUE ...]

As the checks do: a SYNC_FLUSH store started by `mqstore start` in a session of its own,
then W client processes started one after another (`python client.py`), each importing
`StoreClient`, attaching, and timing only its own loop of N README-shape puts (1 KiB,
one key, a tag; N 2,000 for up to 16 clients, 600 above); the check's rate is W * N
divided by the slowest client's loop. Each client here also records when its interpreter
started, when the import was done and its loop's start and end (CLOCK_MONOTONIC), every
put's latency, and its own CPU, run-queue delay (`/proc/self/schedstat`) and switches
over the loop; the store's processes are read the same way over the whole run, and the
flusher's trace (`MQSTORE_FLUSH_TRACE`) gives its rounds. `--naive` runs the checks'
peer (W processes appending 1 KiB + fdatasync to one file, released by a barrier) right
after, for the ratio the check would print. `--save` writes
`bench/results/profile_sync_check.txt`.

Read it as a CPU budget: on 2 cores, W producers that each block once per put can only
go as fast as the CPU per put of everything (client, flusher, dispatcher, the rest)
allows once the cores are saturated, and the slowest client's loop also pays for the
other clients' interpreter starts that run beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.report import save_text
from bench.store_run import REPO, precompile, shm_names

TRACE_ENV = "MQSTORE_FLUSH_TRACE"
RESULT = REPO / "bench" / "results" / "profile_sync_check.txt"

CLIENT = r"""
import time
T_START = time.monotonic_ns()
import json, os, sys
from mqstore import StoreClient
T_IMPORTED = time.monotonic_ns()

def snap():
    with open("/proc/self/schedstat") as f:
        run, wait = (int(x) for x in f.read().split()[:2])
    vol = invol = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol = int(line.split()[1])
    return [run, wait, vol, invol]

store_dir, worker, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
pad = b"x" * 1000
lat, bad = [], 0
with StoreClient.attach(store_dir) as c:
    t0, s0 = time.monotonic_ns(), snap()
    for i in range(n):
        body = b"w%04d-m%08d|" % (worker, i) + pad
        a = time.monotonic_ns()
        r = c.put("perf", body, keys=["k-%d-%d" % (worker, i)], tags="t%d" % (i % 3))
        lat.append(time.monotonic_ns() - a)
        bad += r.status.name != "PUT_OK"
    t1, s1 = time.monotonic_ns(), snap()
with open(out, "w") as f:
    json.dump({"start": T_START, "imported": T_IMPORTED, "t0": t0, "t1": t1, "bad": bad,
               "lat": lat, "snap": [b - a for a, b in zip(s0, s1)]}, f)
"""

NAIVE = r"""
import os, sys, multiprocessing as mp, time, resource
path, n, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def run(i, bar):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    body = os.urandom(1024); bar.wait()
    for _ in range(n):
        os.write(fd, body); os.fdatasync(fd)
if __name__ == "__main__":
    bar = mp.Barrier(w + 1); ps = [mp.Process(target=run, args=(i, bar)) for i in range(w)]
    [p.start() for p in ps]; bar.wait(); t = time.perf_counter(); [p.join() for p in ps]
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(n * w / (time.perf_counter() - t), (ru.ru_utime + ru.ru_stime) / (n * w))
"""


def naive_peer(root: Path, workers: int, n: int) -> tuple[float, float]:
    """The checks' peer (their naive script, which also prints its CPU): W processes
    appending 1 KiB + fdatasync to one file in `root`; its rate, and its CPU µs per
    message."""
    script = root / "naive.py"
    script.write_text(NAIVE)
    out = subprocess.run(
        [sys.executable, str(script), str(root / "naive.log"), str(n), str(workers)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (root / "naive.log").unlink()
    rate, cpu = out.stdout.split()
    return float(rate), float(cpu) * 1e6


def puts_for(producers: int) -> int:
    """N of the checks: 2,000 puts per client up to 16 clients, 600 at 64."""
    return 2000 if producers <= 16 else 600


def _schedstat(pid: int) -> tuple[int, int, int]:
    """(CPU ns, run-queue ns, times scheduled in: about one a wake-up) of every thread."""
    run = wait = slices = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                a, b, n = f.read().split()[:3]
            run, wait, slices = run + int(a), wait + int(b), slices + int(n)
    except OSError:
        pass
    return run, wait, slices


def _workers(sup_pid: int) -> dict[str, int]:
    out = {"supervisor": sup_pid}
    for p in psutil.Process(sup_pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "mqstore.workers.worker_main" in cmd:
            out[cmd[cmd.index("mqstore.workers.worker_main") + 1]] = p.pid
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _stat(name: str, xs: list[float]) -> str:
    if not xs:
        return f"  {name:34} (none)"
    return (
        f"  {name:34} p50 {_pct(xs, 0.5):8.1f}  mean {statistics.fmean(xs):8.1f}  "
        f"p90 {_pct(xs, 0.9):8.1f}  p99 {_pct(xs, 0.99):8.1f}"
    )


def _start_store(
    base: Path, pool: bool, trace: Path, conf_lines: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], Path]:
    """`mqstore start` as the checks' harness starts it: its own session, a broker.conf."""
    store = base / "store"
    store.mkdir(parents=True)
    conf = base / "broker.conf"
    conf.write_text(
        f"flushDiskType=SYNC_FLUSH\ntransientStorePoolEnable={str(pool).lower()}\n"
        + "".join(f"{line}\n" for line in conf_lines)
    )
    mq = [sys.executable, "-m", "mqstore"]
    with (base / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(
            [*mq, "start", str(store), "--config", str(conf)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
            env={**os.environ, TRACE_ENV: str(trace)},
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while subprocess.run([*mq, "status", str(store)], capture_output=True, cwd=REPO).returncode:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"store did not start: {(base / 'supervisor.log').read_text()}")
        time.sleep(0.2)
    return proc, store


def _stop_store(proc: subprocess.Popen[bytes], store: Path) -> None:
    subprocess.run([sys.executable, "-m", "mqstore", "stop", str(store)], capture_output=True)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError("the store did not stop within 60 s") from None


def run_one(
    root: Path, producers: int, pool: bool, naive: bool, puts: int = 0,
    conf_lines: tuple[str, ...] = (),
) -> str:  # fmt: skip
    """One check-shaped run (`puts` per client, 0: the check's); its profile as text."""
    n = puts or puts_for(producers)
    base = root / f"w{producers}-{'on' if pool else 'off'}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    trace = base / "flush-trace.jsonl"
    client = base / "client.py"
    client.write_text(CLIENT)
    proc, store = _start_store(base, pool, trace, conf_lines)
    shm_before = shm_names(store)
    try:
        procs = _workers(proc.pid)
        before = {k: _schedstat(p) for k, p in procs.items()}
        load0 = os.getloadavg()[0]
        t_launch = time.monotonic_ns()
        kids = [
            subprocess.Popen(
                [sys.executable, str(client), str(store), str(w), str(n), str(base / f"{w}.json")],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
            for w in range(producers)
        ]
        for kid in kids:
            out, _ = kid.communicate(timeout=600)
            if kid.returncode:
                raise RuntimeError(f"client failed: {out.decode(errors='replace')[-800:]}")
        t_done = time.monotonic_ns()
        after = {k: _schedstat(p) for k, p in procs.items()}
    finally:
        _stop_store(proc, store)
    left = shm_names(store) - shm_before
    res: list[dict[str, Any]] = [
        json.loads((base / f"{w}.json").read_text()) for w in range(producers)
    ]
    rows = [json.loads(x) for x in trace.read_text().splitlines()] if trace.exists() else []
    peer = None
    if naive:
        peer = naive_peer(base, producers, n)[0]
    shutil.rmtree(base, ignore_errors=True)
    return _report(
        producers, n, pool, load0, res, rows, before, after, t_launch, t_done, peer, left
    )


def _report(
    producers: int, n: int, pool: bool, load0: float, res: list[dict[str, Any]],
    rows: list[dict[str, int]], before: dict[str, tuple[int, int, int]],
    after: dict[str, tuple[int, int, int]], t_launch: int, t_done: int, peer: float | None,
    left: frozenset[str],
) -> str:  # fmt: skip
    total = producers * n
    loops = [(r["t1"] - r["t0"]) / 1e9 for r in res]
    rate = total / max(loops)
    lat = [x / 1e3 for r in res for x in r["lat"]]
    rel = [(r["t0"] - t_launch) / 1e9 for r in res]
    ends = [(r["t1"] - t_launch) / 1e9 for r in res]
    imports = [(r["imported"] - r["start"]) / 1e9 for r in res]
    all_in = max(0.0, min(ends) - max(rel))
    lines = [
        f"== {producers} clients x {n} puts, pool {'on' if pool else 'off'}, load at start "
        f"{load0:.2f}, at end {os.getloadavg()[0]:.2f}",
        f"  check's rate {rate:,.0f} puts/s (slowest loop {max(loops):.2f} s)"
        + (f"; naive peer right after {peer:,.0f}/s: ratio {rate / peer:.2f}" if peer else "")
        + f"; not PUT_OK {sum(r['bad'] for r in res)}; shm left {len(left)}",
        f"  loops s min / median / max {min(loops):.2f} / {statistics.median(loops):.2f} / "
        f"{max(loops):.2f}; clients' loops start {min(rel):.2f}-{max(rel):.2f} s after the "
        f"first launch, end {min(ends):.2f}-{max(ends):.2f}; all {producers} putting at once "
        f"for {all_in:.2f} s",
        f"  interpreter start + import per client: median {statistics.median(imports):.3f} s "
        f"wall (clients starting together)",
        _stat("put latency µs", lat),
    ]
    cpu = sum(r["snap"][0] for r in res)
    runq = sum(r["snap"][1] for r in res)
    sw = sum(r["snap"][2] + r["snap"][3] for r in res)
    store_cpu = {k: after[k][0] - before[k][0] for k in before}
    store_runq = {k: after[k][1] - before[k][1] for k in before}
    store_runs = {k: after[k][2] - before[k][2] for k in before}
    whole = (t_done - t_launch) / 1e9
    lines.append(
        f"  CPU per put (µs): clients' loops {cpu / total / 1e3:.1f} (run-queue delay "
        f"{runq / total / 1e3:.1f}, switches {sw / total:.2f}); store's processes over the "
        f"whole run {sum(store_cpu.values()) / total / 1e3:.1f}:"
    )
    for k in before:
        lines.append(
            f"    {k:12} {store_cpu[k] / total / 1e3:6.1f} µs/put  "
            f"CPU {store_cpu[k] / whole / 1e7:5.1f} %"
            f"  run-queue {store_runq[k] / whole / 1e7:5.1f} % of the run"
            f"  {store_runs[k] / total:5.2f} runs/put"
        )
    t0 = min(r["t0"] for r in res)
    t1 = max(r["t1"] for r in res)
    rows = [r for r in rows if r.get("forced") and t0 <= r["forced"] <= t1]
    if not rows:
        lines.append("  (no flusher trace rows)")
        return "\n".join(lines)
    span = (rows[-1]["waked"] - rows[0]["served"]) / 1e9
    busy = sum(r["waked"] - r["served"] for r in rows) / 1e9
    lines.append(
        f"  flusher: {len(rows):,} rounds, {statistics.fmean(r['msgs'] for r in rows):.2f} "
        f"messages per round (p90 {_pct([float(r['msgs']) for r in rows], 0.9):.0f}); in rounds "
        f"{100 * busy / span:.0f} % of their span; began asleep in "
        f"{sum(1 for r in rows if r['slept']):,}"
    )
    for name, a, b in (
        ("gather", "served", "gathered"), ("commit", "gathered", "committed"),
        ("force", "committed", "forced"), ("wake", "forced", "waked"),
    ):  # fmt: skip
        lines.append(_stat(f"{name} µs", [(r[b] - r[a]) / 1e3 for r in rows]))
        if name == "force":
            lines.append(_stat("  of which the fdatasync µs", [r["fsync_ns"] / 1e3 for r in rows]))
    gaps = [(b["served"] - a["waked"]) / 1e3 for a, b in itertools.pairwise(rows)]
    lines.append(_stat("woken -> next round µs", gaps))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_sync_check", description=__doc__)
    ap.add_argument("--producers", default="16,64")
    ap.add_argument("--pool", choices=("on", "off"), default="on")
    ap.add_argument("--naive", action="store_true", help="run the checks' peer after each")
    ap.add_argument("--puts", type=int, default=0, help="per client (default: the check's)")
    ap.add_argument("--save", action="store_true")
    ap.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE",
        help="a line added to the store's broker.conf (repeatable)",
    )  # fmt: skip
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default /tmp)")
    args = ap.parse_args(argv)
    precompile()
    root = Path(tempfile.mkdtemp(prefix="profile-sync-check-", dir=args.dir))
    try:
        parts = [
            run_one(root, int(w), args.pool == "on", args.naive, args.puts, tuple(args.conf))
            for w in args.producers.split(",")
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = "\n".join(parts)
    if args.save:
        save_text(RESULT, "bench.profile_sync_check", argv, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
