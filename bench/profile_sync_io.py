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
queues (the report marks the files whose inode shares the first segment's block); but
whether they do depends on where the inode numbers fall. So the mechanism is also
measured alone, without a store (`--mechanism`): a "segment" (zeros written) and a
16-byte "offset" file, each round a 1 KiB pwrite into the segment, its fdatasync, then
a pwrite of the offset file, as the flusher does; the offset file's inode in the
segment's inode-table block, or in another block group. Needs root (perf
tracepoints). `--save` writes `bench/results/sync_round_io_profile.txt`.
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
from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.workers import priority

RESULT = REPO / "bench" / "results" / "sync_round_io_profile.txt"
TRACE_ENV = "MQSTORE_FLUSH_TRACE"
SYSCALL_FDATASYNC = 75  # x86_64
LATENCY_EVENTS = (
    "-eraw_syscalls:sys_enter",
    f"--filter=id == {SYSCALL_FDATASYNC}",
    "-eraw_syscalls:sys_exit",
    f"--filter=id == {SYSCALL_FDATASYNC}",
    "-eblock:block_rq_complete",
)
EVENTS = (
    "block:block_rq_issue",
    "ext4:ext4_mark_inode_dirty",
    "ext4:ext4_sync_file_enter",
    "sched:sched_switch",
    "sched:sched_wakeup",
)
WORKERS = ("flusher", "committer", "dispatcher", "allocator", "scheduler", "cleaner")
WARM_PUTS = 200
INODES_PER_BLOCK = 16  # ext4's default 256-byte inodes in a 4 KiB inode-table block
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


def _perf_record(root: Path, data: Path, args: list[str]) -> subprocess.Popen[bytes]:
    """`perf record` into `data`, returned once its events are enabled (started disabled,
    then enabled through a control FIFO whose ack says so: a sleep was not enough on a
    loaded machine). Stop it with SIGINT."""
    ctl, ack = root / "perf.ctl", root / "perf.ack"
    for f in (ctl, ack):
        f.unlink(missing_ok=True)
        os.mkfifo(f)
    rec = subprocess.Popen(
        [
            "perf",
            "record",
            "-q",
            "-D",
            "-1",
            "--control",
            f"fifo:{ctl},{ack}",
            "-o",
            str(data),
            *args,
        ],
        stderr=subprocess.DEVNULL,
    )
    with open(ctl, "w") as c, open(ack) as a:
        c.write("enable\n")
        c.flush()
        if a.readline().strip() != "ack":
            raise SystemExit("perf record did not enable its events")
    ctl.unlink()
    ack.unlink()
    return rec


def _perf_script(data: Path) -> str:
    """The recorded events as text (pid, cpu, time, event, fields); the data file goes."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "pid,cpu,time,event,trace"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data.unlink()
    return script


def profile(root: Path, pool: bool, layout: str, puts: int, segment_mib: int = 0) -> list[str]:
    StoreClient, _ = client_api()
    name = f"{'pool-on' if pool else 'pool-off'}-{layout}"
    trace = root / f"{name}.trace"
    os.environ[TRACE_ENV] = str(trace)
    prepare = None
    if layout == "shared":

        def prepare(store_dir: Path) -> None:
            (store_dir / "commitlog").mkdir()

    data = root / f"{name}.data"
    extra = {"segment_size_bytes": segment_mib << 20} if segment_mib else {}
    with running_store(root, name, sync=True, pool=pool, extra=extra, before_start=prepare) as run:
        flusher = _pid_of(run.store_dir, "flusher")
        workers = {_pid_of(run.store_dir, w): w for w in WORKERS}
        with StoreClient.attach(run.store_dir) as c:
            for _ in range(WARM_PUTS):
                c.put("perf", b"warm" + PAD, keys=["w"], tags="t")
            rec = _perf_record(
                root, data, ["-a", "-m", "4096", *(f"-e{e}" for e in EVENTS), *LATENCY_EVENTS]
            )
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
        seg0 = os.stat(run.store_dir / "commitlog" / ("0" * 20)).st_ino
    os.environ.pop(TRACE_ENV)
    script = _perf_script(data)
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    trace.unlink()
    rows = [r for r in rows if ns0 <= r["served"] <= ns1]  # the loop's rounds
    workers[os.getpid()] = "producer"
    return _report(name, puts, dt, r0, r1, rows, script, inodes, seg0, flusher, workers)


def _breakdown(script: str, pid: int) -> str:
    """Where `pid`'s fdatasyncs spend their time (from `perf script -F
    pid,cpu,time,event,trace` with LATENCY_EVENTS and block_rq_issue, recorded with -a):
    the device's time (each request's issue to completion, summed; the cache flush is
    issued by a kworker), the CPU before the first request, and from one request's
    completion to the next one's issue (the sleeper's wake-up, then the flush or the
    inode-table write submitted)."""
    syncs: list[dict[str, float]] = []
    cur: dict[str, float] | None = None
    inflight: dict[tuple[str, str], float] = {}
    gaps: dict[str, list[float]] = {"first": [], "flush": [], "inode": []}
    for line in script.splitlines():
        f = line.split()
        if len(f) < 5:
            continue
        try:
            p, t = int(f[0]), float(f[2].rstrip(":"))
        except ValueError:
            continue
        ev = f[3]
        if ev.startswith("raw_syscalls:sys_enter") and p == pid:
            cur = {"t0": t, "dev": 0.0, "done": 0.0}
        elif ev.startswith("raw_syscalls:sys_exit") and p == pid and cur is not None:
            cur["t1"] = t
            syncs.append(cur)
            cur = None
        elif ev.startswith("block:block_rq_issue") and cur is not None:
            m = re.search(r"\d+,\d+ (\S+) \d+ \(\) (\d+) \+ (\d+)", line)
            if m and (p == pid or m.group(1).startswith("FF")):
                inflight[(m.group(2), m.group(3))] = t
                since = t - (cur["done"] or cur["t0"])
                kind = "first" if not cur["done"] else "flush" if "FF" in m.group(1) else None
                kind = kind or ("inode" if "M" in m.group(1) else None)
                if kind:
                    gaps[kind].append(since * 1e6)
        elif ev.startswith("block:block_rq_complete") and cur is not None:
            m = re.search(r"\d+,\d+ (\S+) \(\) (\d+) \+ (\d+)", line)
            if m and (m.group(2), m.group(3)) in inflight:
                cur["dev"] += t - inflight.pop((m.group(2), m.group(3)))
                cur["done"] = t
    if not syncs:
        return "  no fdatasync seen"

    def q(xs: list[float]) -> str:
        return f"p50 {statistics.median(xs):.0f} mean {statistics.fmean(xs):.0f}" if xs else "-"

    total = [(r["t1"] - r["t0"]) * 1e6 for r in syncs]
    dev = [r["dev"] * 1e6 for r in syncs]
    tail = [(r["t1"] - r["done"]) * 1e6 for r in syncs if r["done"]]
    return (
        f"  fdatasync µs {q(total)}: device {q(dev)}; before the first request "
        f"{q(gaps['first'])}; completion -> flush issued {q(gaps['flush'])}; "
        f"completion -> inode-table write {q(gaps['inode'])}; last completion -> return "
        f"{q(tail)}"
    )


def _report(
    name: str,
    puts: int,
    dt: float,
    r0: resource.struct_rusage,
    r1: resource.struct_rusage,
    rows: list[dict[str, int]],
    script: str,
    inodes: dict[int, str],
    seg0: int,
    flusher: int,
    workers: dict[int, str],
) -> list[str]:
    me = next(pid for pid, w in workers.items() if w == "producer")
    rounds = max(len(rows), 1)
    writes: collections.Counter[str] = collections.Counter()
    wbytes = 0
    dirtied: collections.Counter[tuple[str, str, int]] = collections.Counter()
    sched: collections.Counter[str] = collections.Counter()
    for line in script.splitlines():
        f = line.split()
        if len(f) < 5:
            continue
        pid, cpu = int(f[0]), int(f[1].strip("[]"))
        if "block_rq_issue" in line and pid == flusher:
            m = re.search(r"\d+,\d+ (\S+) (\d+) \(", line)
            if m:
                writes["metadata" if "M" in m.group(1) else "data"] += 1
                wbytes += int(m.group(2))
        elif "ext4_mark_inode_dirty" in line:
            m = re.search(r"ino (\d+)", line)
            if m and int(m.group(1)) in inodes:
                who = workers.get(pid, f"pid {pid}")
                ino = int(m.group(1))
                dirtied[(inodes[ino], who, ino)] += 1
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
        _breakdown(script, flusher),
        f"  producer per put: {(r1.ru_minflt - r0.ru_minflt) / puts:.2f} page faults, "
        f"{cpu_us:.1f} µs CPU",
        "  inodes dirtied per put (file, by; * in the first segment's inode-table block):",
    ]
    own = sum(
        n
        for (file, who, _), n in dirtied.items()
        if file.startswith("commitlog/") and who in ("flusher", "producer", "committer")
    )
    alloc = sum(n for (file, who, _), n in dirtied.items() if who == "allocator")
    if own:
        out.insert(
            2,
            f"  inode-table writes per time stamp of the segments' own: "
            f"{writes['metadata'] / own:.2f} (1.00: no neighbour adds a write); "
            f"the allocator's dirtyings {alloc / puts:.3f} per put",
        )
    block0 = (seg0 - 1) // INODES_PER_BLOCK
    for (file, who, ino), n in dirtied.most_common(6):
        mark = "*" if (ino - 1) // INODES_PER_BLOCK == block0 else " "
        out.append(f"    {n / puts:6.3f} {mark} {file} ({who}, inode {ino})")
    out.append("  scheduling per put:")
    for k, n in sorted(sched.items()):
        out.append(f"    {n / puts:6.3f}  {k}")
    return out


MECH_SEGMENT = 8 << 20
MECH_MODES = ("alone", "offset", "queue", "apart")
QUEUE_WRITER = """
import os, sys, time
fd, at = os.open(sys.argv[1], os.O_WRONLY), 0
while True:
    os.pwrite(fd, bytes(20), at)
    at = (at + 20) % (1 << 20)
    time.sleep(0.001)
"""


def _mechanism_files(d: Path, mode: str) -> tuple[Path, Path, Path]:
    """(segment, offset file, queue file): the last two in the segment's inode-table
    block (consecutive inodes in a fresh block group), or in block groups of their own
    (`apart`)."""
    d.mkdir()
    if mode == "apart":
        fileio.spread_subdirectories(d)
        paths = []
        for name in ("segment", "offset", "queue"):
            (d / name).mkdir()
            (d / name / name).touch()
            paths.append(d / name / name)
        return paths[0], paths[1], paths[2]
    made = []
    for i in range(2 * INODES_PER_BLOCK):
        f = d / f"f{i}"
        f.touch()
        made.append((f.stat().st_ino, f))
    for (a, fa), (_, fb), (c, fc) in zip(made, made[1:], made[2:], strict=False):
        if c == a + 2 and (a - 1) // INODES_PER_BLOCK == (c - 1) // INODES_PER_BLOCK:
            return fa, fb, fc
    raise SystemExit("no three consecutive inodes in one block: a crowded block group")


def mechanism(root: Path, mode: str, rounds: int) -> list[str]:
    """The flusher's round without a store: a 1 KiB pwrite into a zeroed segment, its
    fdatasync; with `offset` (or `apart`) a 16-byte pwrite of an offset file after it,
    as the flusher's `flushed_offset`; with `queue` (or `apart`) another process writes
    20 bytes into a queue file every millisecond, as the dispatcher its consume queues
    and index. Counts the inode-table writes (`WSM`, from `ext4_write_inode`). The loop
    runs at the store's nice and time slice, as the flusher does (an I/O completion's
    wake-up otherwise waits for the running task's slice: on a loaded machine that, not
    the disk, is most of a plain loop's fdatasync), and puts them back after."""
    d = root / f"mech-{mode}"
    seg, off, queue = _mechanism_files(d, mode)
    fd = os.open(seg, os.O_RDWR)
    ofd = os.open(off, os.O_RDWR) if mode in ("offset", "apart") else -1
    writer = None
    if mode in ("queue", "apart"):
        writer = subprocess.Popen([sys.executable, "-c", QUEUE_WRITER, str(queue)])
    zeros = bytes(1 << 20)
    for at in range(0, MECH_SEGMENT, len(zeros)):
        os.pwrite(fd, zeros, at)
    os.fsync(fd)
    body = os.urandom(1024)
    data = root / "mech.data"
    rec = _perf_record(root, data, ["-a", "-m", "1024", "-eblock:block_rq_issue", *LATENCY_EVENTS])
    lat = []
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    defaults = StoreSettings()
    priority.apply(defaults.store_nice)
    priority.apply_slice(defaults.store_slice_us)
    t0 = time.perf_counter()
    for i in range(rounds):
        os.pwrite(fd, body, i * 1024)
        a = time.perf_counter_ns()
        os.fdatasync(fd)
        lat.append((time.perf_counter_ns() - a) / 1e3)
        if ofd >= 0:
            os.pwrite(ofd, i.to_bytes(16, "big"), 0)
    dt = time.perf_counter() - t0
    priority._setattr_slice(0)  # the kernel's default slice again
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    rec.send_signal(signal.SIGINT)
    rec.wait()
    if writer is not None:
        writer.kill()
        writer.wait()
    os.close(fd)
    if ofd >= 0:
        os.close(ofd)
    shutil.rmtree(d)
    script = _perf_script(data)
    me = str(os.getpid())
    meta = sum(
        1
        for line in script.splitlines()
        if line.split()[:1] == [me] and re.search(r"rq_issue: \d+,\d+ \S*M\S* ", line)
    )
    what = {
        "alone": "segment alone",
        "offset": "offset file (same loop) in the segment's inode-table block",
        "queue": "queue file (another process, every ms) in the segment's inode-table block",
        "apart": "offset and queue files in block groups of their own",
    }[mode]
    return [
        f"== mechanism, {what}: {rounds} rounds, {rounds / dt:,.0f}/s, "
        f"load {os.getloadavg()[0]:.1f}",
        f"  inode-table writes per fdatasync {meta / rounds:.3f}, per 4 ms tick "
        f"{meta / (dt * 250):.2f}; fdatasync µs p50 {statistics.median(lat):.1f}, "
        f"mean {statistics.fmean(lat):.1f}",
        _breakdown(script, os.getpid()),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_sync_io", description=__doc__)
    ap.add_argument("--pool", default="on,off")
    ap.add_argument("--layout", default="spread,shared")
    ap.add_argument("--puts", type=int, default=3000)
    ap.add_argument("--segment-mib", type=int, default=0, help="segment size (0: default)")
    ap.add_argument("--mechanism", type=int, default=3000, help="rounds (0: none)")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="perf-syncio-", dir=a.dir))
    # Each store's directory in a block group of its own, where its files take inode
    # numbers one after another as a store made in a fresh place does (in a group that
    # earlier runs left holes in, `shared` would share a block only by chance).
    fileio.spread_subdirectories(root)
    lines = text_head(run_meta(command_line("bench.profile_sync_io", argv), root))
    try:
        for _ in range(2 if a.mechanism else 0):
            for mode in MECH_MODES:
                got = mechanism(root, mode, a.mechanism)
                print("\n".join(got), flush=True)
                lines += got
        for layout in filter(None, a.layout.split(",")):
            for pool in filter(None, a.pool.split(",")):
                got = profile(root, pool == "on", layout, a.puts, a.segment_mib)
                print("\n".join(got), flush=True)
                lines += got
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.save:
        RESULT.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
