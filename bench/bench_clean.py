"""Put latency while the cleaner deletes files, against no deletion at all.

    python -m bench.bench_clean [--quick] [--dir D] [--segment-mib N] [--old-segments K]
                                [--seconds S] [--rate R] [--no-save]

RocketMQ's users saw 1 s put stalls at the daily delete hour: its cleaner thread unmaps
and deletes 1 GiB files inside the broker's process. Here the cleaner is its own
process. This benchmark appends 1 KiB messages with the engine's `CommitLog.append` at a
fixed rate (`--rate` per second, for `--seconds`), timing every call, while:

* `off`: nothing is deleted;
* `process`: a cleaner process (`workers.cleaner.clean_once`, the `mqstore clean --now`
  path, in a loop) deletes `--old-segments` written, fsynced segments of another store
  on the same filesystem, 10 per run, 100 ms apart (RocketMQ's defaults);
* `thread`: the same deletion from a thread of the appending process (RocketMQ's
  layout), to show what the separate process buys.

The appender's segments are created and warmed before the clock starts (the runtime's
allocator keeps them ready) and it flushes every 500 ms outside the timed calls, as the
flusher process would. Each mode reports count, p50, p99, p99.9 and max of the append
call, and how many files/bytes were deleted while it ran.

Writes `bench/results/clean.json` and `bench/results/clean.md` with the command, the git
commit and the machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.report import command_line, head_lines, run_meta, table_lines
from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.record import Message
from mqstore.engine.segment import Segment, segment_file_name
from mqstore.engine.segment_queue import SegmentQueue

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("off", "process", "thread")
PATHS = ("pool", "mmap")
BODY_BYTES = 1024
FLUSH_EVERY_S = 0.5
OLD_AGE_S = 100 * 3600


def _prefill_old(store: Path, size: int, count: int) -> int:
    """`count` full segments of written, fsynced data, last written 100 h ago, plus an
    empty last one (never deleted). Returns the bytes written."""
    log_dir = store / "commitlog"
    fileio.makedirs(log_dir)
    chunk = os.urandom(1 << 20)
    old = time.time() - OLD_AGE_S
    for i in range(count + 1):
        path = log_dir / segment_file_name(i * size)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            if i < count:
                for off in range(0, size, len(chunk)):
                    os.pwrite(fd, chunk[: min(len(chunk), size - off)], off)
            else:
                os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.utime(path, (old, old))
    return count * size


def _settings(size: int) -> StoreSettings:
    return StoreSettings(segment_size_bytes=size, file_reserved_time_hours=72)


def _delete_all(store: str, size: int, stop: Any, done: Any, ready: Any) -> None:
    """Clean until only the last segment is left (or `stop` is set)."""
    from mqstore.workers.cleaner import clean_once

    s = _settings(size)
    ready.set()
    go = time.monotonic() + 0.5  # the appender's clock starts first
    while time.monotonic() < go and not stop.is_set():
        time.sleep(0.01)
    while not stop.is_set():
        r = clean_once(store, s, now=True)
        done.value += r.files_deleted
        if r.files_deleted == 0:
            break


def _percentile(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    i = min(len(sorted_ns) - 1, int(q * len(sorted_ns)))
    return sorted_ns[i] / 1000


def _run_mode(mode: str, path: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    size = args.segment_mib * 1024 * 1024
    old_store = work / f"old-{mode}"
    live = work / f"live-{mode}" / "commitlog"
    old_bytes = _prefill_old(old_store, size, args.old_segments)
    total = args.rate * args.seconds
    per_seg = size // (BODY_BYTES + 120)
    ready: dict[int, Segment] = {}

    def allocator(start: int) -> Segment:
        return ready.pop(start)

    queue = SegmentQueue(live, size, allocator=allocator)
    queue.load()  # empty: the segments below are handed over by the allocator
    for i in range(total // per_seg + 2):
        buf = bytearray(size) if path == "pool" else None
        seg = Segment.create(live, i * size, size, write_buffer=buf)
        if buf is None:
            seg.warm(lock=False)
        ready[i * size] = seg
    log = CommitLog(queue)
    msg = Message(topic="BenchTopic", body=os.urandom(BODY_BYTES), properties={"TAGS": "A"})
    log.append(msg)  # the first segment and the caches, before the clock
    lat = [0] * total
    deleted: Any = None
    stop_ev: Any
    worker: Any = None
    tdone: Any = None
    ready_ev: Any = threading.Event()
    if mode == "process":
        ctx = mp.get_context("spawn")
        stop_ev = ctx.Event()
        ready_ev = ctx.Event()
        deleted = ctx.Value("i", 0)
        worker = ctx.Process(
            target=_delete_all, args=(str(old_store), size, stop_ev, deleted, ready_ev)
        )
    elif mode == "thread":
        stop_ev = threading.Event()

        class _Count:
            value = 0

        tdone = _Count()
        worker = threading.Thread(
            target=_delete_all,
            args=(str(old_store), size, stop_ev, tdone, ready_ev),
            daemon=True,
        )
    if worker is not None:
        worker.start()
        if not ready_ev.wait(60):  # imports done before the clock starts
            raise RuntimeError("the cleaner did not start")
    period = 1.0 / args.rate
    perf = time.perf_counter_ns
    t0 = time.perf_counter()
    next_flush = t0 + FLUSH_EVERY_S
    for i in range(total):
        due = t0 + i * period
        now = time.perf_counter()
        if due - now > 0.002:  # well ahead: give the CPU away (2 cores are shared)
            time.sleep(due - now - 0.001)
            now = time.perf_counter()
        while now < due:
            now = time.perf_counter()
        if now >= next_flush:
            queue.commit(0)  # the committer's and the flusher's work, untimed
            queue.flush(0)
            next_flush = now + FLUSH_EVERY_S
        a = perf()
        r = log.append(msg)
        lat[i] = perf() - a
        if not r.ok:
            raise RuntimeError(f"append failed: {r}")
    elapsed = time.perf_counter() - t0
    files = 0
    if worker is not None:
        stop_ev.set()
        worker.join(timeout=120)
        files = deleted.value if mode == "process" else tdone.value
    queue.commit_all()
    queue.flush_all()
    log.close()
    for seg in ready.values():
        seg.close()
    shutil.rmtree(old_store, ignore_errors=True)
    shutil.rmtree(live.parent, ignore_errors=True)
    return {
        "load": os.getloadavg()[0],
        "lat": lat,
        "seconds": elapsed,
        "files": files,
        "old_bytes": old_bytes if mode != "off" else 0,
        "size": size,
    }


def _row(path: str, mode: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = sorted(x for r in runs for x in r["lat"])
    files = sum(r["files"] for r in runs)
    return {
        "path": path,
        "mode": mode,
        "runs": len(runs),
        "count": len(lat),
        "p50_us": round(_percentile(lat, 0.50), 2),
        "p99_us": round(_percentile(lat, 0.99), 2),
        "p999_us": round(_percentile(lat, 0.999), 2),
        "max_us": round(lat[-1] / 1000, 1),
        "max_per_run_us": [round(max(r["lat"]) / 1000, 1) for r in runs],
        "over_1ms": sum(1 for x in lat if x > 1_000_000),
        "files_deleted": files,
        "bytes_deleted": sum(r["files"] * r["size"] for r in runs),
        "load_avg_1m": [round(r["load"], 2) for r in runs],
    }


TABLE_TITLES = (
    *("write path", "cleaner", "appends", "p50 µs", "p99 µs", "p99.9 µs", "max µs"),
    *("max per run µs", "> 1 ms", "files deleted", "MiB deleted"),
)


def _markdown(doc: dict[str, Any]) -> str:
    a = doc["args"]
    lines = head_lines(
        "Put latency while the cleaner deletes files (engine)",
        doc,
        f"space of the run's filesystem: {doc['disk']}",
        f"{a['rate']:,} appends/s of {BODY_BYTES} B bodies for {a['seconds']} s per run, "
        f"{a['repeats']} runs per row (interleaved); "
        f"{a['old_segments']} old segments of {a['segment_mib']} MiB (written, fsynced) "
        "to delete per run; commit + flush every 500 ms outside the timed calls",
        "write path `pool`: appends into a write buffer (mqstore's default, the runtime's "
        "shared-memory pool); `mmap`: appends into the segment's mapping (warmed)",
    )
    lines += table_lines(
        TABLE_TITLES,
        (
            [
                r["path"],
                r["mode"],
                f"{r['count']:,}",
                r["p50_us"],
                r["p99_us"],
                r["p999_us"],
                f"{r['max_us']:,}",
                " / ".join(f"{m:,}" for m in r["max_per_run_us"]),
                r["over_1ms"],
                r["files_deleted"],
                f"{r['bytes_deleted'] // (1024 * 1024):,}",
            ]
            for r in doc["rows"]
        ),
        "llrrrrrlrrr",
    )
    lines += [
        "",
        "1-minute load average after each run (the machine is shared; max latencies track it):",
        "",
    ]
    for r in doc["rows"]:
        loads = ", ".join(str(x) for x in r["load_avg_1m"])
        lines.append(f"- {r['path']} / {r['mode']}: {loads}")
    lines += ["", "Deletion against none, same write path:", ""]
    by = {(r["path"], r["mode"]): r for r in doc["rows"]}
    for (path, mode), r in by.items():
        off = by.get((path, "off"))
        if mode == "off" or off is None or not off["p99_us"]:
            continue
        lines.append(
            f"- {path}, cleaner {mode}: p99 x{r['p99_us'] / off['p99_us']:.2f}, "
            f"p99.9 x{r['p999_us'] / off['p999_us']:.2f}, appends over 1 ms "
            f"{r['over_1ms']} vs {off['over_1ms']}, max {r['max_us']:,} vs {off['max_us']:,} µs"
        )
    lines += ["", *doc.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_clean", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    p.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    p.add_argument("--segment-mib", type=int, default=64)
    p.add_argument("--old-segments", type=int, default=20)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rate", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.segment_mib, args.old_segments, args.seconds, args.repeats = 16, 12, 3, 1
    work = Path(tempfile.mkdtemp(prefix="mqstore-bench-clean-", dir=args.dir))
    rows = []
    try:
        fs = shutil.disk_usage(work)
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for rep_i in range(args.repeats):
            for path in args.paths.split(","):
                for mode in args.modes.split(","):  # interleaved, so drift hits all modes
                    r = _run_mode(mode, path, work, args)
                    runs.setdefault((path, mode), []).append(r)
                    print(
                        f"run {rep_i + 1}/{args.repeats} {path} {mode}: "
                        f"max {max(r['lat']) / 1000:.1f} us, {r['files']} files deleted",
                        flush=True,
                    )
        rows = [_row(path, mode, rs) for (path, mode), rs in runs.items()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        **run_meta(command_line("bench.bench_clean", argv), work.parent),
        "disk": f"{fs.total // 2**30} GiB, {fs.used * 100 // fs.total} % used",
        "args": {
            k: getattr(args, k)
            for k in ("segment_mib", "old_segments", "seconds", "rate", "repeats")
        },
        "rows": rows,
    }
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "clean.json").write_text(json.dumps(doc, indent=2) + "\n")
        (RESULTS / "clean.md").write_text(_markdown(doc))
    print(_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
