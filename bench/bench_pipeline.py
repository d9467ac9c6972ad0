"""Spark reading a store through `format("mqstore")` against the same query on Parquet.

    python -m bench.bench_pipeline [--size-mib 1024] [--repeats 5] [--dir D] [--master M]

One run, on one store of `--size-mib` MiB of 256-byte records (4 topics, 8 queues,
64 MiB segments) appended through `engine.commitlog.CommitLog`:

* `export`: `pipeline.jobs.export` writes the store as Parquet, partitioned by topic and
  date (timed once). Both readers then answer the same query on the same records.
* `mqstore`: `spark.read.format("mqstore").load(D)` in local mode (`local[*]`), then
  `count(*)` and `sum(length(body))` in one aggregation (`QUERY`).
* `parquet`: `spark.read.parquet(export)`, the same aggregation. Spark reads only the
  `body` column there, and so does `mqstore`: its JVM provider (`pipeline/jvm`) passes
  the columns a query reads to the Python source, which builds only those.
* `mqstore_python`: the same query through the Python source alone
  (`format("mqstore_python")`), which Spark cannot prune: every column of every row is
  built and shipped. What `mqstore` was before the JVM provider, for comparison.
* `scan alone`: `pipeline.scan.scan_split` over every split in this process, no Spark,
  building the query's column (`body`): the Python side of the `mqstore` reader on one
  core, to tell it from what Spark adds (moving the Arrow batches to the JVM and turning
  them into rows).

The profile of each Spark query is the CPU time it costs, split by process: the JVM
(driver and executor in local mode) and its Python workers (the data source's `read`,
planning), from the processes' own counters (`psutil`), so it holds on a loaded machine
where wall-clock time also counts waiting for a core.

Goal (issue 13): `mqstore` takes <= 1.5x the time of `parquet`. Each Spark figure is the
median of `--repeats` rounds (one run of each reader per round, interleaved, so a burst
of load from other processes hits one round of each) on a warm session; the store and
the export are in the page cache (written just before, and read once before timing).
Writes `bench/results/pipeline.{json,md,png}` with command, commit and machine, and
`pipeline_profile.txt`: cProfile of `scan alone` (where the Python side spends its time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.report import Column, Goal, Report, command_line, write
from mqstore.engine import record as rec
from mqstore.engine.commitlog import CommitLog
from mqstore.pipeline import jobs, scan, session, source, storefs
from mqstore.pipeline.columnar import NO_FILTER

RECORD_BYTES = 256
SEGMENT_SIZE_BYTES = 64 * 1024 * 1024
TOPICS = ("orders", "payments", "audit", "clicks")
QUEUES = 8
GOAL_WITHIN_PARQUET = 1.5
QUERY = "count(*) and sum(length(body))"


def _message(topic: str, queue_id: int, body: bytes) -> rec.Message:
    return rec.Message(
        topic=topic,
        body=body,
        properties={"TAGS": "t"},
        queue_id=queue_id,
        born_host="10.0.0.1:5000",
        store_host="10.0.0.2:10911",
    )


def _body_bytes(topic: str) -> int:
    props = len(rec.encode_properties({"TAGS": "t"}))
    return RECORD_BYTES - rec.record_length(0, len(topic.encode()), props)


def write_store(root: Path, size_bytes: int) -> tuple[int, int]:
    """Append 256-byte records until the log holds `size_bytes`; return (count, body bytes)."""
    log = CommitLog.open(root / "commitlog", SEGMENT_SIZE_BYTES)
    blob = os.urandom(1 << 20)  # bodies are distinct slices of it: nothing for Parquet to fold
    shapes = [(t, q, _body_bytes(t)) for t in TOPICS for q in range(QUEUES)]
    assert all(len(rec.encode(_message(t, q, bytes(n))).data) == RECORD_BYTES for t, q, n in shapes)
    count = size_bytes // RECORD_BYTES
    span = len(blob) - RECORD_BYTES
    body_bytes = 0
    try:
        append = log.append
        for i in range(count):
            topic, queue_id, n = shapes[i % len(shapes)]
            at = (i * 7919) % span
            res = append(_message(topic, queue_id, blob[at : at + n]))
            if not res.ok:
                raise RuntimeError(f"append failed: {res}")
            body_bytes += n
    finally:
        log.close()
    return count, body_bytes


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


@dataclass(frozen=True, slots=True)
class Cost:
    """One query: wall-clock seconds and CPU seconds of the JVM and of its Python workers."""

    wall_s: float
    jvm_cpu_s: float
    python_cpu_s: float


def _spark_cpu() -> tuple[float, float]:
    """CPU seconds used so far by this process's descendants: (JVM, Python workers)."""
    jvm = py = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
            used = t.user + t.system
            if "java" in proc.name():
                jvm += used
            else:
                py += used
        except psutil.NoSuchProcess:
            continue  # a worker that ended: its CPU is not counted (workers are reused)
    return jvm, py


def costed(fn: Callable[[], Any]) -> tuple[Cost, Any]:
    jvm0, py0 = _spark_cpu()
    wall, out = _timed(fn)
    jvm1, py1 = _spark_cpu()
    return Cost(wall, jvm1 - jvm0, py1 - py0), out


def run_query(df: Any) -> tuple[int, int]:
    """`QUERY` on a DataFrame: (rows, total body bytes)."""
    from pyspark.sql import functions as F

    row = df.agg(F.count("*").alias("n"), F.sum(F.length("body")).alias("b")).collect()[0]
    return int(row.n), int(row.b or 0)


def scan_alone(store: Path) -> int:
    """Rows of every split read by `pipeline.scan` in this process (no Spark), building
    the one column the query reads."""
    plan = source.ReadPlan(
        uri=str(store), opts=scan.ScanOptions(columns=("body",)), filter=NO_FILTER,
        split_bytes=source.DEFAULT_SPLIT_BYTES, honour_flushed=True, time_ordered=True,
    )  # fmt: skip
    fs, _root = storefs.resolve(plan.uri)
    return sum(
        batch.num_rows
        for split in source.plan_splits(plan)
        for batch in scan.scan_split(fs, split, NO_FILTER, plan.opts)
    )


def profile_scan(store: Path) -> str:
    """`scan_alone` under cProfile: the top functions by their own time."""
    prof = cProfile.Profile()
    prof.runcall(scan_alone, store)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(20)
    return out.getvalue()


def measure(work: Path, size_mib: int, repeats: int, master: str | None) -> Report:
    store = work / "store"
    print(f"writing {size_mib} MiB of {RECORD_BYTES}-byte records ...", file=sys.stderr)
    write_secs, (count, body_bytes) = _timed(lambda: write_store(store, size_mib << 20))
    print(f"  {count:,} records in {write_secs:.1f} s", file=sys.stderr)
    expected = (count, body_bytes)
    scans = []
    for _ in range(min(repeats, 3)):
        secs, n = _timed(lambda: scan_alone(store))
        assert n == count, (n, count)
        scans.append(secs)
    profile = profile_scan(store)
    spark = session.start_session(
        "bench_pipeline", master, {"spark.ui.showConsoleProgress": "false"}
    )
    try:
        assert run_query(jobs.load(spark, str(store))) == expected  # warms the session
        out = work / "parquet"
        export_secs, done = _timed(lambda: jobs.export(spark, str(store), str(out)))
        assert done.rows == count
        parquet_bytes = sum(f.stat().st_size for f in out.rglob("*.parquet"))
        print(f"  export: {export_secs:.1f} s", file=sys.stderr)
        assert run_query(spark.read.parquet(str(out))) == expected  # warms the Parquet path
        if not source.jvm_provider_loaded(spark):
            raise RuntimeError("format('mqstore') has no JVM provider here: run `make setup`")
        python_only = spark.read.format(source.PYTHON_FORMAT_NAME)
        assert run_query(python_only.load(str(store))) == expected
        ds: list[Cost] = []
        py: list[Cost] = []
        pq: list[Cost] = []
        for i in range(repeats):
            cost, got = costed(lambda: run_query(jobs.load(spark, str(store))))
            assert got == expected, (got, expected)
            ds.append(cost)
            cost, got = costed(lambda: run_query(spark.read.parquet(str(out))))
            assert got == expected, (got, expected)
            pq.append(cost)
            cost, got = costed(lambda: run_query(python_only.load(str(store))))
            assert got == expected, (got, expected)
            py.append(cost)
            print(
                f"  round {i}: mqstore {ds[-1]}, parquet {pq[-1]}, mqstore_python {py[-1]}",
                file=sys.stderr,
            )
        spark_version = spark.version
        cores = spark.sparkContext.defaultParallelism
    finally:
        spark.stop()
    return _report(
        count=count, ds=ds, pq=pq, py=py, scans=scans, export_secs=export_secs,
        parquet_bytes=parquet_bytes, spark_version=spark_version, cores=cores, profile=profile,
    )  # fmt: skip


def _row(label: str, runs: list[Cost], count: int, color: str) -> dict[str, Any]:
    secs = statistics.median(c.wall_s for c in runs)
    return {
        "label": label,
        "seconds": round(secs, 3),
        "runs_s": [round(c.wall_s, 3) for c in runs],
        "rows_per_s": round(count / secs),
        "jvm_cpu_s": round(statistics.median(c.jvm_cpu_s for c in runs), 2),
        "python_cpu_s": round(statistics.median(c.python_cpu_s for c in runs), 2),
        "color": color,
    }


def notes(ds: dict[str, Any], pq: dict[str, Any], py: dict[str, Any], count: int) -> list[str]:
    """Where the time goes, from the three Spark rows (`_row`) of one run."""
    jvm, pyw, pq_cpu = ds["jvm_cpu_s"], ds["python_cpu_s"], pq["jvm_cpu_s"] + pq["python_cpu_s"]
    all_cpu = py["jvm_cpu_s"] + py["python_cpu_s"]
    return [
        f"CPU per query: mqstore {jvm + pyw:.2f} s (JVM {jvm:.2f}, Python workers {pyw:.2f}) "
        f"against Parquet's {pq_cpu:.2f} s, {(jvm + pyw) / pq_cpu:.1f}x; wall-clock "
        f"{ds['seconds'] / pq['seconds']:.1f}x.",
        "Column pruning: the query reads `body` only, so the JVM provider asks the Python "
        "source for that one column. The Python source alone (every column of every row "
        f"built, sent to the JVM as Arrow and turned into rows) costs {all_cpu:.2f} CPU s "
        f"(JVM {py['jvm_cpu_s']:.2f}, Python workers {py['python_cpu_s']:.2f}) and "
        f"{py['seconds']:.2f} s, {py['seconds'] / ds['seconds']:.1f}x mqstore's time.",
        f"The Python workers spend {pyw / count * 1e6:.2f} us of CPU a row. The scan alone "
        "(pipeline_profile.txt) is the ranged read of each split, the scanner (C, CRC "
        "included) and the body column's one gather.",
    ]


def _report(
    *,
    count: int,
    ds: list[Cost],
    pq: list[Cost],
    py: list[Cost],
    scans: list[float],
    export_secs: float,
    parquet_bytes: int,
    spark_version: str,
    cores: int,
    profile: str,
) -> Report:
    ds_s = statistics.median(c.wall_s for c in ds)
    pq_s = statistics.median(c.wall_s for c in pq)
    per_round = ", ".join(f"{d.wall_s / p.wall_s:.2f}x" for d, p in zip(ds, pq, strict=True))
    scan_s = statistics.median(scans)
    rows = [
        _row("mqstore data source (Spark)", ds, count, "tab:blue"),
        _row("Parquet export (Spark)", pq, count, "tab:gray"),
        _row("Python source alone, no pruning (Spark)", py, count, "tab:orange"),
    ]
    return Report(
        name="pipeline",
        title='Pipeline: format("mqstore") vs its Parquet export, same query',
        method=[
            f"Store: {count:,} records of {RECORD_BYTES} bytes "
            f"({count * RECORD_BYTES / 2**20:,.0f} MiB), 4 topics x {QUEUES} queues, 64 MiB "
            "segments, random bodies, written by engine.commitlog, in the page cache.",
            f"Query, on both readers: {QUERY}, one aggregation, collected; the answers are "
            "checked equal to what was written.",
            f"Spark {spark_version}, local mode, {cores} task slots; medians of {len(ds)} "
            "interleaved rounds on a warm session.",
            "scan alone: pipeline.scan.scan_split over every split in the benchmark's own "
            f"process, one core, no Spark (median of {len(scans)}); its cProfile is in "
            "pipeline_profile.txt.",
            "JVM / Python workers CPU s: CPU time the query cost in the Spark JVM and in its "
            "Python workers (psutil counters of the processes, median of the rounds): "
            "wall-clock time on a shared machine also counts waiting for a core.",
            f"Export (jobs.export, Parquet by topic/date): {export_secs:.1f} s, "
            f"{parquet_bytes / 2**20:,.0f} MiB written.",
        ],
        columns=[
            Column("label", "reader"),
            Column("seconds", "seconds", "{:,.2f}"),
            Column("rows_per_s", "rows/s"),
            Column("jvm_cpu_s", "JVM CPU s", "{:,.2f}"),
            Column("python_cpu_s", "Python workers CPU s", "{:,.2f}"),
        ],
        rows=[
            *rows,
            {
                "label": "scan alone (pipeline.scan, 1 core, no Spark)",
                "seconds": round(scan_s, 3),
                "runs_s": [round(x, 3) for x in scans],
                "rows_per_s": round(count / scan_s),
                "color": "tab:green",
            },
        ],
        goals=[
            Goal(
                "mqstore time / Parquet time",
                round(ds_s / pq_s, 2),
                GOAL_WITHIN_PARQUET,
                "x",
                higher_is_better=False,
                basis=f"{ds_s:.2f} s vs {pq_s:.2f} s; per round {per_round}",
            )
        ],
        plot_key="rows_per_s",
        plot_label="rows per second",
        notes=notes(rows[0], rows[1], rows[2], count),
        extra={"scan_profile": profile},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_pipeline", description=__doc__)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", type=Path, default=None, help="scratch directory (default: /tmp)")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument("--no-write", action="store_true", help="do not write bench/results")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mqstore-bench-pipeline-", dir=args.dir))
    try:
        rep = measure(work, args.size_mib, args.repeats, args.master)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for g in rep.goals:
        print(f"{g.name}: {g.measured} {g.unit} (goal <= {g.required}; met: {g.met}) {g.basis}")
    if not args.no_write:
        cmd = command_line("bench.bench_pipeline", argv)
        paths = write(rep, command=cmd, bench_dir=work.parent)
        profile_txt = paths["md"].with_name("pipeline_profile.txt")
        profile_txt.write_text(f"{cmd.strip()}\n\n{rep.extra['scan_profile']}")
        print(f"wrote {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
