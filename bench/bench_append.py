"""Single-process append throughput of the engine, against the floor of `os.write`.

    python -m bench.bench_append [--quick] [--total-mib N] [--repeats R] [--dir D]

For bodies of 128 B, 1 KiB and 16 KiB it measures, in one run:

* `floor`: `os.write` of already-encoded records (the same bytes the engine writes) to a
  file in the same directory: the least any append path must do.
* `mmap`: `CommitLog.append(Message)` into the segment's mapping (pool off); the first
  write to each page takes a page fault.
* `mmap_warm`: the same into segments warmed by the allocator (`Segment.warm`, RocketMQ's
  warmMapedFileEnable), so no page faults on the hot path.
* `write_buffer`: `CommitLog.append(Message)` into an external write buffer (pool on;
  the commit to the file is the committer's job and is timed apart, as `commit`).
* `mmap_warm_unique_keys`: as `mmap_warm`, but every message carries its own `KEYS` value, so the
  appender's tail cache misses and properties are encoded per message.
* `mmap_warm_batch32`: as `mmap_warm`, through `CommitLog.append_batch` with 32 messages per
  call (one segment check and one store timestamp per batch, as RocketMQ's batch put).

Every appended record is a full RocketMQ record: encoded from the `Message` (CRC,
header, topic, properties), with physical offset, queue offset and store timestamp
assigned at append time; segments roll with BLANK records. Messages are built before
the clock starts (they are what a producer hands over). No fsync is timed: this is the
CPU cost of the append path. Segments are created before the clock starts (the
runtime's allocator process keeps them ready), so file creation is not timed. Each
figure is the median of `--repeats` runs.

Writes `bench/results/append.json` and `bench/results/append.md` with the command, the
git commit and the machine.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import command_line, head_lines, run_meta, table_lines
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.record import Message, WritableBuffer, encode
from mqstore.engine.segment import Segment
from mqstore.engine.segment_queue import SegmentQueue

BODY_SIZES = (128, 1024, 16384)
SEGMENT_SIZE_BYTES = 64 * 1024 * 1024
RESULTS = Path(__file__).resolve().parent / "results"


def _messages(body_size: int, count: int, *, unique_keys: bool) -> list[Message]:
    body = os.urandom(body_size)
    props = {"TAGS": "TagA"}
    if not unique_keys:
        m = Message(topic="BenchTopic", body=body, properties=props, born_host="10.0.0.1:50000")
        return [m] * count
    return [
        Message(
            topic="BenchTopic",
            body=body,
            properties={"TAGS": "TagA", "KEYS": f"key-{i}"},
            born_host="10.0.0.1:50000",
        )
        for i in range(count)
    ]


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _floor(work: Path, msgs: list[Message]) -> tuple[float, int]:
    records = [encode(m).data for m in msgs[:1024]]
    path = work / "floor.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    n = len(msgs)
    k = len(records)
    total = sum(len(records[i % k]) for i in range(n))

    def run() -> None:
        write = os.write
        for i in range(n):
            write(fd, records[i % k])

    try:
        secs = _timed(run)
    finally:
        os.close(fd)
        path.unlink()
    return secs, total


def _commitlog(
    work: Path, total_bytes: int, *, pool: bool, warm: bool
) -> tuple[CommitLog, dict[int, Segment]]:
    """A fresh log whose segments are created (and warmed) before the clock starts, as
    the runtime's allocator process keeps them ready; pool buffers are pre-faulted, as
    the pool's locked shared memory is."""
    d = work / "commitlog"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    free: list[WritableBuffer] = []
    if pool:
        for _ in range(total_bytes // SEGMENT_SIZE_BYTES + 2):
            fresh = bytearray(SEGMENT_SIZE_BYTES)
            fresh[:: mmap.PAGESIZE] = b"\1" * len(range(0, SEGMENT_SIZE_BYTES, mmap.PAGESIZE))
            free.append(fresh)
    ready: dict[int, Segment] = {}
    for i in range(total_bytes // SEGMENT_SIZE_BYTES + 2):
        start = i * SEGMENT_SIZE_BYTES
        buf: WritableBuffer | None = None
        if pool:
            buf = free.pop() if free else bytearray(SEGMENT_SIZE_BYTES)
        seg = Segment.create(
            d,
            start,
            SEGMENT_SIZE_BYTES,
            write_buffer=buf,
            on_buffer_done=free.append if pool else None,
        )
        if warm:
            seg.warm(lock=False)
        ready[start] = seg

    def allocator(start: int) -> Segment:
        if start in ready:
            return ready.pop(start)
        return Segment.create(d, start, SEGMENT_SIZE_BYTES)

    queue = SegmentQueue(d, SEGMENT_SIZE_BYTES, allocator=allocator)
    return CommitLog(queue), ready


def _append_run(
    work: Path,
    msgs: list[Message],
    total_bytes: int,
    *,
    pool: bool,
    warm: bool = False,
    batch: int = 0,
) -> tuple[float, int, float]:
    log, unused = _commitlog(work, total_bytes, pool=pool, warm=warm)
    log.append(msgs[0])  # warms the encoder's cache outside the clock
    append = log.append
    rest = msgs[1:]

    def run() -> None:
        for m in rest:
            append(m)

    if batch:
        chunks = [rest[i : i + batch] for i in range(0, len(rest), batch)]
        append_batch = log.append_batch

        def run() -> None:
            for chunk in chunks:
                append_batch(chunk)

    secs = _timed(run)
    total = log.queue.max_wrote_offset()

    def commit() -> None:
        log.queue.commit_all()

    commit_secs = _timed(commit) if pool else 0.0
    problems = [f for f in log.check() if f.severity.name == "ERROR"]
    log.close()
    for seg in unused.values():
        seg.close()
    shutil.rmtree(work / "commitlog", ignore_errors=True)
    if problems:
        raise SystemExit(f"the log did not check out: {problems[:3]}")
    return secs * len(msgs) / len(rest), total, commit_secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_append", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes: checks the bench works")
    ap.add_argument("--total-mib", type=int, default=256, help="bytes appended per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args(argv)
    total_mib = 8 if args.quick else args.total_mib
    repeats = 1 if args.quick else args.repeats
    work_root = Path(tempfile.mkdtemp(prefix="mqstore-bench-", dir=args.dir))
    rows: list[dict[str, Any]] = []
    try:
        for body_size in BODY_SIZES:
            count = max(1000, total_mib * 1024 * 1024 // (body_size + 100))
            msgs = _messages(body_size, count, unique_keys=False)
            uniq = _messages(body_size, count, unique_keys=True)
            runs: dict[str, list[tuple[float, int]]] = {}
            commit: list[float] = []
            for _ in range(repeats):
                runs.setdefault("floor", []).append(_floor(work_root, msgs))
                nbytes = count * (body_size + 120)
                s, b, _c = _append_run(work_root, msgs, nbytes, pool=False)
                runs.setdefault("mmap", []).append((s, b))
                s, b, _c = _append_run(work_root, msgs, nbytes, pool=False, warm=True)
                runs.setdefault("mmap_warm", []).append((s, b))
                s, b, c = _append_run(work_root, msgs, nbytes, pool=True)
                runs.setdefault("write_buffer", []).append((s, b))
                commit.append(c)
                s, b, _c = _append_run(work_root, uniq, nbytes, pool=False, warm=True)
                runs.setdefault("mmap_warm_unique_keys", []).append((s, b))
                s, b, _c = _append_run(work_root, msgs, nbytes, pool=False, warm=True, batch=32)
                runs.setdefault("mmap_warm_batch32", []).append((s, b))
            floor_rate = count / statistics.median(s for s, _ in runs["floor"])
            for path, results in runs.items():
                secs = statistics.median(s for s, _ in results)
                nbytes = results[0][1]
                rate = count / secs
                rows.append(
                    {
                        "body_bytes": body_size,
                        "path": path,
                        "messages": count,
                        "seconds": round(secs, 4),
                        "msgs_per_s": round(rate),
                        "mb_per_s": round(nbytes / secs / 1e6, 1),
                        "us_per_msg": round(secs / count * 1e6, 3),
                        "ratio_to_floor": round(rate / floor_rate, 3),
                    }
                )
            rows.append(
                {
                    "body_bytes": body_size,
                    "path": "commit (pwrite of the write buffer, after the run)",
                    "messages": count,
                    "seconds": round(statistics.median(commit), 4),
                    "msgs_per_s": round(count / statistics.median(commit)),
                    "mb_per_s": round(
                        runs["write_buffer"][0][1] / statistics.median(commit) / 1e6, 1
                    ),
                    "us_per_msg": round(statistics.median(commit) / count * 1e6, 3),
                    "ratio_to_floor": None,
                }
            )
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    report = {
        **run_meta(command_line("bench.bench_append", argv), work_root.parent),
        "segment_size_bytes": SEGMENT_SIZE_BYTES,
        "total_mib_per_run": total_mib,
        "repeats": repeats,
        "goal": "mmap and write_buffer at >= 0.5x the floor's msgs/s for 1 KiB bodies",
        "rows": rows,
    }
    md = _markdown(report)
    print(md)
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "append.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "append.md").write_text(md)
    return 0


def _markdown(report: dict[str, Any]) -> str:
    lines = head_lines(
        "Single-process append (engine)",
        report,
        f"{report['total_mib_per_run']} MiB appended per run, median of "
        f"{report['repeats']} runs, {report['segment_size_bytes'] // (1024 * 1024)} MiB segments",
        f"goal: {report['goal']}",
    )
    lines += table_lines(
        ["body", "path", "msgs/s", "MB/s", "µs/msg", "× floor"],
        (
            [
                r["body_bytes"],
                r["path"],
                f"{r['msgs_per_s']:,}",
                r["mb_per_s"],
                r["us_per_msg"],
                "" if r["ratio_to_floor"] is None else f"{r['ratio_to_floor']:.2f}",
            ]
            for r in report["rows"]
        ),
        "rlrrrr",
    )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
