"""Where a sync put's time goes: a profile of group commit at 1, 16 and 64 producers.

    python -m bench.profile_sync [--producers 1,16,64] [--duration 3] [--pool on|off]
                                 [--repeat 1] [--save] [--rates-only]

Each configuration starts a fresh SYNC_FLUSH store (as the put benchmark does) with the
flusher's trace on (`MQSTORE_FLUSH_TRACE`, `workers/flusher.py`): one row of
CLOCK_MONOTONIC timestamps per fsync round. Producers (forked processes, each attached
with `StoreClient.attach`, 1 KiB bodies, a unique key each, as `bench put`) record the
same clock before and after every put. Joining the two gives, per round: messages
covered, and the time in each hop: the put's wait for its round to start (the previous
fsync, or the flusher's wake-up), the commit, the fdatasync, and the wake back to the
producer's return. Around the measured window, every process's CPU (utime+stime),
context switches and run-queue delay (`/proc/<pid>/schedstat`: runnable but not running,
what a loaded 2-core machine costs) are read for the producers and for each worker.

After each configuration, the same disk's plain 1 KiB write + fdatasync loops (a file
written with zeros, one only fallocated, an append: `plain_fsync`) are the yardstick for
the flusher's own fdatasync (the trace's `fsync_ns`), measured within seconds of it.

`--save` writes `bench/results/profile_sync.txt` (command, commit, machine, load).
`--rates-only` skips the trace (an A/B of throughput, sync rows only).

`--round-cost N` measures the flusher's round alone instead, in this process: N rounds of
one published 1 KiB record each on a store of its own (no workers, the bench directory's
file system), alternately by the C round (`LogFiles.sync_round`) and its Python twin
(`sync_round_py`): the thread's CPU and the wall time per round outside the fdatasync.
CPU time is what a loaded machine changes least.

`--wake-floor N [--wake-procs 1,16]` measures what one sleep costs instead: on one
SYNC_FLUSH store, N iterations each of an async put (`wait_store=False`), a sync put, a
bare `time.sleep(200e-6)` (no store), an async put then that sleep, and the naive
peer's 1 KiB write + fdatasync (one shared O_APPEND file, as the perf checks), in one
process, then sync put against write + fdatasync in P processes at once; alternating,
three times. Per message: CPU (utime+stime, which the tick accounting scales to the
scheduler's exact runtime), voluntary switches, run-queue delay (`schedstat`) and wall
time. A sync put must block once (its round takes a fdatasync), as the naive peer does
in its fdatasync: each then waits for a CPU once per message, and when that wait is
longer than an fdatasync, sharing the fdatasync cannot make the puts much faster.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

import psutil

from bench.report import command_line, run_meta, text_head
from bench.store_run import BODY_BYTES, TAGS, TOPIC, client_api, running_store

TRACE_ENV = "MQSTORE_FLUSH_TRACE"


def _schedstat(pid: int | str) -> tuple[int, int, int]:
    """(ns on CPU, ns runnable waiting for a CPU, timeslices) of a process, threads summed."""
    run = wait = slices = 0
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return (0, 0, 0)
    for tid in tids:
        with contextlib.suppress(OSError, ValueError):
            with open(f"{base}/{tid}/schedstat") as f:
                a, b, c = f.read().split()[:3]
            run, wait, slices = run + int(a), wait + int(b), slices + int(c)
    return (run, wait, slices)


def _ctxsw(pid: int | str) -> tuple[int, int]:
    vol = invol = 0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol = int(line.split()[1])
    return (vol, invol)


def _snap(pid: int | str) -> list[int]:
    return [*_schedstat(pid), *_ctxsw(pid)]


def _producer(index: int, store_dir: str, barrier: Any, duration_ns: int, out: str) -> None:
    StoreClient, _ = client_api()
    calls = array("q")
    rets = array("q")
    body = os.urandom(BODY_BYTES)
    clock = time.monotonic_ns
    try:
        with StoreClient.attach(store_dir) as client:
            put = client.put
            for i in range(200):  # warm: topic, tags, lanes
                put(TOPIC, body, tags=TAGS, keys=f"w{index}-{i}")
            barrier.wait(timeout=300)
            s0 = _snap("self")
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            deadline = clock() + duration_ns
            i = 0
            bad = 0
            t = 0
            while t < deadline:
                key = f"k{index}-{i}"
                c = clock()
                r = put(TOPIC, body, tags=TAGS, keys=key)
                t = clock()
                if r.status.name == "PUT_OK":
                    calls.append(c)
                    rets.append(t)
                else:
                    bad += 1
                i += 1
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            s1 = _snap("self")
    except BaseException as e:
        Path(out, f"err-{index}.txt").write_text(repr(e))
        with contextlib.suppress(Exception):
            barrier.abort()
        os._exit(2)
    Path(out, f"calls-{index}.bin").write_bytes(calls.tobytes())
    Path(out, f"rets-{index}.bin").write_bytes(rets.tobytes())
    cpu = (r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime)
    Path(out, f"res-{index}.json").write_text(
        json.dumps({"bad": bad, "cpu": cpu, "snap": [b - a for a, b in zip(s0, s1, strict=True)]})
    )
    os._exit(0)


def _workers(sup_pid: int) -> dict[str, int]:
    out = {"supervisor": sup_pid}
    for p in psutil.Process(sup_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = p.cmdline()
            if "mqstore.workers.worker_main" in cmd:
                out[cmd[cmd.index("mqstore.workers.worker_main") + 1]] = p.pid
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _stat_line(name: str, xs: list[float]) -> str:
    if not xs:
        return f"  {name:44} (none)"
    return (
        f"  {name:44} p50 {_pct(xs, 0.5):8.1f}  mean {statistics.fmean(xs):8.1f}  "
        f"p90 {_pct(xs, 0.9):8.1f}  p99 {_pct(xs, 0.99):8.1f}"
    )


def _call_times(work: Path, i: int) -> tuple[array[int], array[int]]:
    """Producer `i`'s put calls and returns (CLOCK_MONOTONIC ns), in order."""
    calls, rets = array("q"), array("q")
    calls.frombytes((work / f"calls-{i}.bin").read_bytes())
    rets.frombytes((work / f"rets-{i}.bin").read_bytes())
    return calls, rets


PLAIN_ROUNDS = 2000
PLAIN_FILE_BYTES = 8 << 20


def plain_fsync(work: Path, how: str) -> list[float]:
    """fdatasync µs of `PLAIN_ROUNDS` 1 KiB writes in a tight loop on the bench's disk, the
    yardstick for the flusher's own: "zeroed" overwrites a file written with zeros (what
    a segment of the allocator is under SYNC_FLUSH), "fallocated" one only allocated,
    "append" appends to a new file (the perf checks' write + fdatasync per message)."""
    path = work / f"plain-{how}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if how != "append":
            os.posix_fallocate(fd, 0, PLAIN_FILE_BYTES)
            if how == "zeroed":
                os.pwrite(fd, bytes(PLAIN_FILE_BYTES), 0)
            os.fsync(fd)
        body = os.urandom(BODY_BYTES)
        out = []
        for i in range(PLAIN_ROUNDS):
            os.pwrite(fd, body, i * BODY_BYTES)
            t = time.perf_counter_ns()
            os.fdatasync(fd)
            out.append((time.perf_counter_ns() - t) / 1e3)
        return out
    finally:
        os.close(fd)
        path.unlink()


def plain_lines(work: Path) -> list[str]:
    """The plain loops, one line each (run right after a configuration, same disk)."""
    lines = ["  plain 1 KiB write + fdatasync in a tight loop, same disk, right after (µs):"]
    for how in ("zeroed", "fallocated", "append"):
        lines.append(_stat_line(f"fdatasync, {how} file", plain_fsync(work, how)))
    return lines


def run_one(root: Path, producers: int, duration_s: float, pool: bool, trace: bool) -> str:
    """One configuration; returns its profile as text."""
    work = root / f"p{producers}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    trace_path = work / "flush-trace.jsonl"
    if trace:
        os.environ[TRACE_ENV] = str(trace_path)
    try:
        with running_store(root, f"sync-{producers}", sync=True, pool=pool) as store:
            procs = _workers(store.proc.pid)
            ctx = mp.get_context("fork")
            barrier = ctx.Barrier(producers + 1)
            kids = [
                ctx.Process(
                    target=_producer,
                    args=(i, str(store.store_dir), barrier, int(duration_s * 1e9), str(work)),
                    daemon=True,
                )
                for i in range(producers)
            ]
            for kid in kids:
                kid.start()
            with contextlib.suppress(Exception):
                barrier.wait(timeout=300)
            t_start = time.monotonic_ns()
            before = {n: _snap(p) for n, p in procs.items()}
            load0 = os.getloadavg()
            for kid in kids:
                kid.join(timeout=duration_s + 120)
            t_end = time.monotonic_ns()
            after = {n: _snap(p) for n, p in procs.items()}
            for kid in kids:
                if kid.is_alive() and kid.pid is not None:
                    kid.kill()
                    kid.join(10)
    finally:
        os.environ.pop(TRACE_ENV, None)
    errs = [p.read_text() for p in work.glob("err-*.txt")]
    if errs:
        raise RuntimeError(f"producer failed: {errs[0]}")
    times = [_call_times(work, i) for i in range(producers)]
    calls = [t for a, _ in times for t in a]
    rets = [t for _, b in times for t in b]
    res = [json.loads((work / f"res-{i}.json").read_text()) for i in range(producers)]
    n = len(rets)
    first, last = min(calls), max(rets)
    secs = (last - first) / 1e9
    lat = [(r - c) / 1000 for c, r in zip(calls, rets, strict=True)]
    lines = [
        f"== {producers} producer(s), pool {'on' if pool else 'off'}, {duration_s:g} s, "
        f"load at start {load0[0]:.2f}",
        f"  {n:,} sync puts PUT_OK in {secs:.2f} s = {n / secs:,.0f} msgs/s; "
        f"latency µs p50 {_pct(lat, 0.5):.1f} p99 {_pct(lat, 0.99):.1f}; "
        f"not PUT_OK {sum(r['bad'] for r in res)}",
    ]
    # CPU, context switches, run-queue delay over the window
    wall = (t_end - t_start) / 1e9
    lines.append(
        "  per process over the window (CPU and run-queue delay in % of one core; "
        "switches per second):"
    )
    lines.append(f"    {'who':14} {'CPU %':>7} {'runq %':>7} {'vol cs/s':>9} {'invol/s':>8}")
    for name in procs:
        d = [b - a for a, b in zip(before[name], after[name], strict=True)]
        lines.append(
            f"    {name:14} {d[0] / wall / 1e7:7.1f} {d[1] / wall / 1e7:7.1f} "
            f"{d[3] / wall:9,.0f} {d[4] / wall:8,.0f}"
        )
    agg = [sum(r["snap"][j] for r in res) for j in range(5)]
    lines.append(
        f"    {'producers':14} {agg[0] / wall / 1e7:7.1f} {agg[1] / wall / 1e7:7.1f} "
        f"{agg[3] / wall:9,.0f} {agg[4] / wall:8,.0f}"
    )
    cpu_put = sum(r["cpu"][0] + r["cpu"][1] for r in res) / max(n, 1) * 1e6
    utime = sum(r["cpu"][0] for r in res) / max(n, 1) * 1e6
    lines.append(
        f"    producers' CPU per put {cpu_put:.1f} µs (user {utime:.1f}); "
        f"run-queue delay per put {agg[1] / max(n, 1) / 1000:.1f} µs; "
        f"switches per put {(agg[3] + agg[4]) / max(n, 1):.2f}"
    )
    if not trace:
        return "\n".join(lines)
    lines += plain_lines(work)
    rows = []
    if trace_path.exists():
        rows = [json.loads(x) for x in trace_path.read_text().splitlines()]
    rows = [r for r in rows if r["forced"] and first <= r["forced"] <= last]
    if not rows:
        lines.append("  (no flusher trace rows in the window)")
        return "\n".join(lines)
    forced = [r["forced"] for r in rows]
    msgs = [float(r["msgs"]) for r in rows]
    lines.append(
        f"  fsync rounds: {len(rows):,} ({len(rows) / secs:,.0f}/s); messages per round "
        f"mean {statistics.fmean(msgs):.1f} p50 {_pct(msgs, 0.5):.0f} max {max(msgs):.0f}; "
        f"rounds that began with the flusher asleep {sum(1 for r in rows if r['woke']):,}; "
        f"polls for a producer still copying {sum(r.get('spins', 0) for r in rows):,}"
    )

    def hop(name: str, a: str, b: str) -> None:
        lines.append(_stat_line(name, [(r[b] - r[a]) / 1e3 for r in rows]))

    lines.append("  flusher, per round (µs):")
    if "gathered" in rows[0]:
        hop("gather (wait for last round's waiters)", "served", "gathered")
        hop("commit (publish + pool -> file)", "gathered", "committed")
    else:
        hop("commit (publish + pool -> file)", "served", "committed")
    hop("force (fdatasync + flushed_offset)", "committed", "forced")
    if "fsync_ns" in rows[0]:
        lines.append(_stat_line("  of which the fdatasync", [r["fsync_ns"] / 1e3 for r in rows]))
    hop("FUTEX_WAKE of all waiters", "forced", "waked")
    gaps = [(b["served"] - a["waked"]) / 1e3 for a, b in itertools.pairwise(rows)]
    lines.append(_stat_line("gap: waiters woken -> next round served", gaps))
    busy = sum(r["waked"] - r["served"] for r in rows) / (forced[-1] - forced[0] + 1)
    lines.append(f"  flusher busy in rounds {busy * 100:.0f}% of the window")
    slept = [(r["woke"] - r["slept"]) / 1e3 for r in rows if r["woke"]]
    lines.append(_stat_line("asleep before a round", slept))
    # join every put with the round that covered it: the first round forced after its call
    # whose flushed end reached it; approximated as the first forced after its call that
    # was also served after the call (a round served before the call cannot cover it)
    served = [r["served"] for r in rows]
    wait_start: list[float] = []
    to_ret: list[float] = []
    wake_lat: list[float] = []
    pos_in_round: list[float] = []
    for c, r in zip(calls, rets, strict=True):
        k = bisect.bisect_right(served, c)
        if k >= len(rows) or rows[k]["forced"] > r:
            continue
        row = rows[k]
        wait_start.append((row["served"] - c) / 1e3)
        to_ret.append((r - row["forced"]) / 1e3)
        if row["woke"]:
            wake_lat.append((row["woke"] - c) / 1e3)
        pos_in_round.append((row["served"] - c) / 1e3)
    lines.append(f"  each put (µs; {len(to_ret):,} of {n:,} joined to a round):")
    lines.append(_stat_line("call -> its round served (queue + wake)", wait_start))
    lines.append(_stat_line("call -> flusher awake (when it slept)", wake_lat))
    lines.append(_stat_line("fsync returned -> put returned", to_ret))
    think = [(a[j + 1] - b[j]) / 1e3 for a, b in times for j in range(len(a) - 1)]
    lines.append(_stat_line("put returned -> next put called", think))
    return "\n".join(lines)


def round_cost(root: Path, rounds: int, pool: bool) -> str:
    """The C round against its Python twin, alternating, on one store (see the doc)."""
    import secrets

    from mqstore import _native
    from mqstore.engine.segment import segment_file_name
    from mqstore.ipc import control as c
    from mqstore.ipc.commit import LogFiles
    from mqstore.ipc.control_views import Flags, FlushStats, Reservation

    seg = 64 << 20
    d = root / "round-cost"
    (d / "commitlog").mkdir(parents=True)
    with open(d / "commitlog" / segment_file_name(0), "wb") as f:
        f.truncate(seg)
        f.write(bytes(BODY_BYTES + 200) * (rounds + 10))  # written, as the allocator does
    geo = c.Geometry(segment_size=seg, pool_buffers=1 if pool else 0, slot_count=4096)
    cb = c.ControlBlock.create(d, 1, geo, token=secrets.token_hex(4))
    files = LogFiles(str(d), cb, "127.0.0.1:10911")
    fd = os.open(d / "commitlog" / segment_file_name(0), os.O_WRONLY)
    size = BODY_BYTES + 200
    cost: dict[str, tuple[list[float], list[float]]] = {"C": ([], []), "Python": ([], [])}
    try:
        Flags(cb).mark_running()
        resv, stats = Reservation(cb), FlushStats(cb)
        for i in range(rounds):
            at = i * size
            body = os.urandom(size)
            if pool:
                view = cb.pool_view(0)
                view[at : at + size] = body
                view.release()
            else:  # what a producer writes into the file's mapping
                os.pwrite(fd, body, at)
            row = c.SLOTS_OFF + (i % cb.slot_count) * c.SLOT_ROW
            c.SLOT.pack_into(cb.buf, row, at, i, i, size, os.getpid(), 0, c.STATE_DONE)
            resv.commit_reservation(at + size, i + 1)
            _native.publish(cb.buf)
            cb.set(c.OFF_SYNC_REQUEST, at + size)
            name = "C" if i % 2 else "Python"
            ns0 = stats.fsync_ns
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            (files.sync_round if name == "C" else files.sync_round_py)(0, 0)
            c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
            fsync = stats.fsync_ns - ns0
            cost[name][0].append((c1 - c0) / 1e3)
            cost[name][1].append((w1 - w0 - fsync) / 1e3)
    finally:
        os.close(fd)
        files.close()
        cb.close()
    lines = [
        f"== the flusher's round alone, pool {'on' if pool else 'off'}, {rounds:,} rounds of "
        f"one {size}-byte record, C and Python alternating, load {os.getloadavg()[0]:.2f}"
    ]
    for name, (cpu, wall) in cost.items():
        lines.append(_stat_line(f"{name}: thread CPU per round (µs)", cpu))
        lines.append(_stat_line(f"{name}: wall per round outside fdatasync (µs)", wall))
    return "\n".join(lines)


WAKE_MODES = ("async put", "sync put", "sleep 200 µs", "async put + sleep", "write + fdatasync")


def _wake_loop(store_dir: str, mode: str, n: int, barrier: Any, out: str, index: int) -> None:
    StoreClient, _ = client_api()
    body = os.urandom(BODY_BYTES)
    nap = time.sleep
    try:
        with StoreClient.attach(store_dir) as client:
            put = client.put
            for i in range(200):  # warm: topic, tags, lanes
                put(TOPIC, body, tags=TAGS, keys=f"warm-{index}-{i}", wait_store=False)
            fd = os.open(Path(out, "naive.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            barrier.wait(timeout=300)
            s0, r0, t0 = _schedstat("self"), resource.getrusage(resource.RUSAGE_SELF), time.time()
            for i in range(n):
                if mode == "write + fdatasync":
                    os.write(fd, body)
                    os.fdatasync(fd)
                    continue
                if mode != "sleep 200 µs":
                    key = f"k{index}-{i}"
                    r = put(TOPIC, body, tags=TAGS, keys=key, wait_store=mode == "sync put")
                    if r.status.name != "PUT_OK":
                        raise RuntimeError(f"{mode}: {r.status.name}")
                if "sleep" in mode:
                    nap(200e-6)
            t1, r1, s1 = time.time(), resource.getrusage(resource.RUSAGE_SELF), _schedstat("self")
            os.close(fd)
    except BaseException as e:
        Path(out, f"err-{index}.txt").write_text(repr(e))
        with contextlib.suppress(Exception):
            barrier.abort()
        os._exit(2)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    row = [cpu, r1.ru_nvcsw - r0.ru_nvcsw, (s1[1] - s0[1]) / 1e9, t1 - t0]
    Path(out, f"res-{index}.json").write_text(json.dumps(row))
    os._exit(0)


def _wake_case(store_dir: str, work: Path, mode: str, n: int, procs: int) -> list[float]:
    """`procs` processes run `mode` n times each from one barrier: per message CPU µs,
    voluntary switches, run-queue delay µs, wall µs per message and process; msgs/s."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(procs)
    kids = [
        ctx.Process(target=_wake_loop, args=(store_dir, mode, n, barrier, str(work), i))
        for i in range(procs)
    ]
    for kid in kids:
        kid.start()
    for kid in kids:
        kid.join()
    errs = sorted(work.glob("err-*.txt"))
    if errs or any(kid.exitcode != 0 for kid in kids):
        raise RuntimeError(f"{mode}: " + (errs[0].read_text() if errs else "a process died"))
    rows = [json.loads((work / f"res-{i}.json").read_text()) for i in range(procs)]
    msgs = n * procs
    return [
        sum(r[0] for r in rows) / msgs * 1e6,
        sum(r[1] for r in rows) / msgs,
        sum(r[2] for r in rows) / msgs * 1e6,
        statistics.fmean(r[3] for r in rows) / n * 1e6,
        msgs / max(r[3] for r in rows),
    ]


def wake_floor(root: Path, n: int, pool: bool, procs: list[int], repeat: int = 3) -> str:
    """What one sleep costs beside a sync put (see the doc)."""
    lines = []
    with running_store(root, "wake-floor", sync=True, pool=pool) as store:
        for p in procs:
            modes = WAKE_MODES if p == 1 else ("sync put", "write + fdatasync")
            got: dict[str, list[list[float]]] = {m: [] for m in modes}
            loads = [os.getloadavg()[0]]
            for _, mode in itertools.product(range(repeat), modes):
                got[mode].append(_wake_case(str(store.store_dir), root / "wf", mode, n, p))
            loads.append(os.getloadavg()[0])
            lines += [
                f"== {p} process(es) at once, pool {'on' if pool else 'off'}, {n:,} iterations "
                f"each, {repeat} alternating passes, load {loads[0]:.2f} -> {loads[1]:.2f}",
                "  per message, per pass: CPU µs (utime+stime) | run-queue delay µs | "
                "wall µs per process | msgs/s; voluntary switches (mean)",
            ]
            for mode, rows in got.items():
                lines.append(f"  {mode}   switches {statistics.fmean(r[1] for r in rows):.2f}")
                for name, k, fmt in (
                    ("CPU", 0, "{:8.1f}"),
                    ("run-queue", 2, "{:8.1f}"),
                    ("wall", 3, "{:8.1f}"),
                    ("msgs/s", 4, "{:8,.0f}"),
                ):
                    vals = ", ".join(fmt.format(r[k]) for r in rows)
                    lines.append(f"    {name:<10} {vals}")
    shutil.rmtree(root / "wf", ignore_errors=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_sync", description=__doc__)
    ap.add_argument("--producers", default="1,16,64")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--pool", choices=("on", "off"), default="on")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rates-only", action="store_true")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--round-cost", type=int, default=0, metavar="N")
    ap.add_argument("--wake-floor", type=int, default=0, metavar="N")
    ap.add_argument("--wake-procs", default="1,16")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqstore-profile-sync-", dir=args.dir))
    out: list[str] = []
    try:
        if args.round_cost:
            out.append(round_cost(root, args.round_cost, args.pool == "on"))
            print(out[-1], flush=True)
        if args.wake_floor:
            procs = [int(x) for x in args.wake_procs.split(",")]
            out.append(wake_floor(root, args.wake_floor, args.pool == "on", procs))
            print(out[-1], flush=True)
        for _ in range(0 if args.round_cost or args.wake_floor else args.repeat):
            for n in (int(x) for x in args.producers.split(",")):
                text = run_one(root, n, args.duration, args.pool == "on", not args.rates_only)
                print(text, flush=True)
                out.append(text)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.save:
        meta = run_meta(command_line("bench.profile_sync", argv), root.parent)
        head = [
            "# Profile of the sync put path (group commit), bench/profile_sync.py",
            *text_head(meta),
            f"# bench directory filesystem: {meta['machine']['filesystem']}",
            "",
        ]
        name = "profile_sync_wake.txt" if args.wake_floor else "profile_sync.txt"
        path = Path(__file__).parent / "results" / name
        path.write_text("\n".join(head + out) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
