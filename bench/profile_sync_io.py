"""What a sync round writes, and who waits for whom: one producer's SYNC_FLUSH puts,
counted with kernel tracepoints instead of timed (this 2-core machine is shared and its
disk times swing 10x with the load; the counts do not).

    python -m bench.profile_sync_io [--pool on,off] [--puts N] [--layout spread,shared]
                                    [--save] [--dir DIR]

One producer in this process, in the perf checks' call shape (1 KiB body, a key, a
tag), against a fresh store per configuration. Over its loop only, `perf record -a`
of `block:block_rq_issue`, `ext4:ext4_mark_inode_dirty`, `ext4:ext4_sync_file_enter`,
`sched:sched_switch` and `sched:sched_wakeup`, then per put or per round:

* the flusher's block writes per round (`rwbs` with `M`: metadata, the inode-table
  block that ext4 without a journal writes at an fdatasync whenever any inode in that
  4 KiB block changed) and bytes;
* which of the store's files had their inode dirtied, by whom (a timestamp per 4 ms
  tick per file written);
* the producer's page faults and CPU per put (`getrusage`): with the pool off it
  stores into the commit log's mapping, and every fdatasync's writeback write-protects
  the pages again;
* where the producer wakes: on the flusher's CPU (preempting it) or on the other one.

`--layout shared` makes the store's `commitlog/` before the store starts, so it is an
ordinary subdirectory (the layout before `fileio.spread_subdirectories`): its segments'
inodes then share inode-table blocks with `flushed_offset`, the index and the consume
queues. Needs root (perf tracepoints). `--save` writes
`bench/results/sync_round_io_profile.txt`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import command_line, run_meta, text_head
from bench.store_run import REPO, client_api, running_store

RESULT = REPO / "bench" / "results" / "sync_round_io_profile.txt"
TRACE_ENV = "MQSTORE_FLUSH_TRACE"
EVENTS = (
    "block:block_rq_issue",
    "ext4:ext4_mark_inode_dirty",
    "ext4:ext4_sync_file_enter",
    "sched:sched_switch",
    "sched:sched_wakeup",
)
WORKERS = ("flusher", "committer", "dispatcher", "allocator", "scheduler", "cleaner")
WARM_PUTS = 200
PAD = b"x" * 1000


def _pid_of(store_dir: Path, worker: str) -> int:
    out = subprocess.run(
        ["pgrep", "-f", f"worker_main {worker} .*{re.escape(str(store_dir))}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not out:
        raise SystemExit(f"no {worker} process for {store_dir}")
    return int(out[0])


def _inodes(store_dir: Path) -> dict[int, str]:
    names = {}
    for dp, dn, fn in os.walk(store_dir):
        for f in fn + dn:
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, store_dir)
            names[os.stat(p).st_ino] = re.sub(r"\d{6,}", "N", rel)
    return names


def profile(root: Path, pool: bool, layout: str, puts: int) -> list[str]:
    StoreClient, _ = client_api()
    name = f"{'pool-on' if pool else 'pool-off'}-{layout}"
    trace = root / f"{name}.trace"
    os.environ[TRACE_ENV] = str(trace)
    prepare = None
    if layout == "shared":

        def prepare(store_dir: Path) -> None:
            (store_dir / "commitlog").mkdir()

    data = root / f"{name}.data"
    with running_store(root, name, sync=True, pool=pool, before_start=prepare) as run:
        flusher = _pid_of(run.store_dir, "flusher")
        workers = {_pid_of(run.store_dir, w): w for w in WORKERS}
        with StoreClient.attach(run.store_dir) as c:
            for _ in range(WARM_PUTS):
                c.put("perf", b"warm" + PAD, keys=["w"], tags="t")
            rec = subprocess.Popen(
                [
                    "perf",
                    "record",
                    "-q",
                    "-a",
                    "-m",
                    "4096",
                    "-o",
                    str(data),
                    *(f"-e{e}" for e in EVENTS),
                ],
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # perf is recording
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            ns0 = time.monotonic_ns()
            for i in range(puts):
                body = b"w%04d-m%08d|" % (0, i) + PAD
                c.put("perf", body, keys=[f"k-0-{i}"], tags=f"t{i % 3}")
            dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
            ns1 = time.monotonic_ns()
            rec.send_signal(signal.SIGINT)
            rec.wait()
        inodes = _inodes(run.store_dir)
    os.environ.pop(TRACE_ENV)
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,cpu,event,trace"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data.unlink()
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    trace.unlink()
    rows = [r for r in rows if ns0 <= r["served"] <= ns1]  # the loop's rounds
    workers[os.getpid()] = "producer"
    return _report(name, puts, dt, r0, r1, rows, script, inodes, flusher, workers)


def _report(
    name: str,
    puts: int,
    dt: float,
    r0: resource.struct_rusage,
    r1: resource.struct_rusage,
    rows: list[dict[str, int]],
    script: str,
    inodes: dict[int, str],
    flusher: int,
    workers: dict[int, str],
) -> list[str]:
    me = next(pid for pid, w in workers.items() if w == "producer")
    rounds = max(len(rows), 1)
    writes: collections.Counter[str] = collections.Counter()
    wbytes = 0
    dirtied: collections.Counter[tuple[str, str]] = collections.Counter()
    sched: collections.Counter[str] = collections.Counter()
    for line in script.splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        pid, cpu = int(f[1]), int(f[2].strip("[]"))
        if "block_rq_issue" in line and pid == flusher:
            m = re.search(r"\d+,\d+ (\S+) (\d+) \(", line)
            if m:
                writes["metadata" if "M" in m.group(1) else "data"] += 1
                wbytes += int(m.group(2))
        elif "ext4_mark_inode_dirty" in line:
            m = re.search(r"ino (\d+)", line)
            if m and int(m.group(1)) in inodes:
                who = workers.get(pid, f"pid {pid}")
                dirtied[(inodes[int(m.group(1))], who)] += 1
        elif "sched_wakeup" in line:
            m = re.search(r" pid=(\d+) .*target_cpu=(\d+)", line)
            if m and int(m.group(1)) == me and pid == flusher:
                sched["woken on the flusher's CPU" if int(m.group(2)) == cpu else
                      "woken on the other CPU"] += 1  # fmt: skip
        elif "sched_switch" in line:
            m = re.search(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)", line)
            if m and int(m.group(1)) == flusher and m.group(2).startswith("R"):
                sched["flusher preempted by the producer" if int(m.group(3)) == me else
                      "flusher preempted by another process"] += 1  # fmt: skip
    fs = [r["fsync_ns"] / 1e3 for r in rows if r["fsync_ns"]]
    cpu_us = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / puts * 1e6
    out = [
        f"== {name}: {puts} puts, 1 producer, {puts / dt:,.0f} puts/s, "
        f"load {os.getloadavg()[0]:.1f}",
        f"  flusher: {rounds} rounds ({puts / rounds:.2f} puts each); block writes per round: "
        f"data {writes['data'] / rounds:.3f}, inode-table (metadata) "
        f"{writes['metadata'] / rounds:.3f}; {wbytes / rounds:,.0f} bytes per round",
        f"  round's fdatasync µs (trace): p50 {statistics.median(fs):.1f}, "
        f"mean {statistics.fmean(fs):.1f}"
        if fs
        else "  no trace rows",
        f"  producer per put: {(r1.ru_minflt - r0.ru_minflt) / puts:.2f} page faults, "
        f"{cpu_us:.1f} µs CPU",
        "  inodes dirtied per put (file, by):",
    ]
    for (file, who), n in dirtied.most_common(6):
        out.append(f"    {n / puts:6.3f}  {file} ({who})")
    out.append("  scheduling per put:")
    for k, n in sorted(sched.items()):
        out.append(f"    {n / puts:6.3f}  {k}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_sync_io", description=__doc__)
    ap.add_argument("--pool", default="on,off")
    ap.add_argument("--layout", default="spread,shared")
    ap.add_argument("--puts", type=int, default=3000)
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="perf-syncio-", dir=a.dir))
    lines = text_head(run_meta(command_line("bench.profile_sync_io", argv), root))
    try:
        for layout in a.layout.split(","):
            for pool in a.pool.split(","):
                got = profile(root, pool == "on", layout, a.puts)
                print("\n".join(got), flush=True)
                lines += got
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.save:
        RESULT.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
