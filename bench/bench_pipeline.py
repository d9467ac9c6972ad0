"""Rows per second of the Spark data source, a plain Python decoder and a Parquet read.

    python -m bench.bench_pipeline [--size-mib 1024] [--repeats 3] [--dir D] [--master M]

One run, on one store of `--size-mib` MiB of 256-byte records (4 topics, 8 queues,
64 MiB segments) appended through `engine.commitlog.CommitLog`:

* `plain`: `pipeline.plain.iter_records`, one process, `engine.record.decode` per record
  (every field, CRC checked): the yardstick.
* `datasource`: `spark.read.format("mqstore").load(D)` in local mode (`local[*]`), every
  row materialised (`write.format("noop")`, so nothing is collected to the driver).
* `datasource, physical_offset only`: the same scan (a Python data source cannot prune
  columns, so every column is still decoded and shipped), but Spark turns only one
  column into rows: the difference to `datasource` is the JVM's Arrow-to-row conversion
  of the wide rows (the `properties` map most of all).
* `export`: `pipeline.jobs.export` to Parquet partitioned by topic and date (timed once).
* `parquet`: Spark reading that export back, every row materialised the same way.

Goal (issue 7): `datasource` >= 1.5x `plain` rows/s, and `parquet` <= 3x `datasource`.
Each Spark figure is the median of `--repeats` rounds (one run of each Spark reader per
round, interleaved) on a warm session; the store files are
in the page cache for every reader (the store was just written and is read once before
timing). Writes `bench/results/pipeline.json` and `.md` with command, commit and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import git_commit, machine
from mqstore.engine import record as rec
from mqstore.engine.commitlog import CommitLog
from mqstore.pipeline import jobs, plain, session

RECORD_BYTES = 256
SEGMENT_SIZE_BYTES = 64 * 1024 * 1024
TOPICS = ("orders", "payments", "audit", "clicks")
QUEUES = 8
RESULTS = Path(__file__).resolve().parent / "results"
GOAL_VS_PLAIN = 1.5
GOAL_PARQUET_WITHIN = 3.0


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


def write_store(root: Path, size_bytes: int) -> int:
    """Append 256-byte records until the log holds `size_bytes`; return the count."""
    log = CommitLog.open(root / "commitlog", SEGMENT_SIZE_BYTES)
    blob = os.urandom(1 << 20)  # bodies are distinct slices of it: nothing for Parquet to fold
    shapes = [(t, q, _body_bytes(t)) for t in TOPICS for q in range(QUEUES)]
    assert all(len(rec.encode(_message(t, q, bytes(n))).data) == RECORD_BYTES for t, q, n in shapes)
    count = size_bytes // RECORD_BYTES
    span = len(blob) - RECORD_BYTES
    try:
        append = log.append
        for i in range(count):
            topic, queue_id, n = shapes[i % len(shapes)]
            at = (i * 7919) % span
            res = append(_message(topic, queue_id, blob[at : at + n]))
            if not res.ok:
                raise RuntimeError(f"append failed: {res}")
    finally:
        log.close()
    return count


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _plain_count(root: Path) -> int:
    n = 0
    for _ in plain.iter_records(root):
        n += 1
    return n


def _noop(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_pipeline", description=__doc__)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", type=Path, default=None, help="scratch directory (default: /tmp)")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument("--no-write", action="store_true", help="do not write bench/results")
    args = p.parse_args(argv)
    host = machine()
    work = Path(tempfile.mkdtemp(prefix="mqstore-bench-pipeline-", dir=args.dir))
    try:
        store = work / "store"
        print(f"writing {args.size_mib} MiB of {RECORD_BYTES}-byte records ...", file=sys.stderr)
        write_secs, count = _timed(lambda: write_store(store, args.size_mib * 1024 * 1024))
        print(f"  {count:,} records in {write_secs:.1f} s", file=sys.stderr)

        print("plain decoder ...", file=sys.stderr)
        plain_secs, n = _timed(lambda: _plain_count(store))
        assert n == count, (n, count)
        print(f"  {count / plain_secs:,.0f} rows/s", file=sys.stderr)

        spark = session.start_session(
            "bench_pipeline", args.master, {"spark.ui.showConsoleProgress": "false"}
        )
        try:
            df = jobs.load(spark, str(store))
            assert df.count() == count  # warms the session, the workers and the page cache
            out = work / "parquet"
            export_secs, done = _timed(lambda: jobs.export(spark, str(store), str(out)))
            assert done.rows == count
            parquet_bytes = sum(f.stat().st_size for f in out.rglob("*.parquet"))
            print(f"  export: {export_secs:.1f} s", file=sys.stderr)
            _noop(spark.read.parquet(str(out)))  # warm the Parquet path too
            # rounds interleave the readers, so a burst of load from other processes
            # on a shared machine hits one round of each rather than all runs of one
            ds: list[float] = []
            narrow: list[float] = []
            pq: list[float] = []
            for i in range(args.repeats):
                secs, _ = _timed(lambda: _noop(jobs.load(spark, str(store))))
                ds.append(secs)
                one_col = jobs.load(spark, str(store)).select("physical_offset")
                secs, _ = _timed(lambda: _noop(one_col))  # noqa: B023 - called at once
                narrow.append(secs)
                secs, _ = _timed(lambda: _noop(spark.read.parquet(str(out))))
                pq.append(secs)
                print(
                    f"  round {i}: datasource {count / ds[-1]:,.0f}, one column "
                    f"{count / narrow[-1]:,.0f}, parquet {count / pq[-1]:,.0f} rows/s",
                    file=sys.stderr,
                )
            spark_version = spark.version
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ds_rate = count / statistics.median(ds)
    pq_rate = count / statistics.median(pq)
    plain_rate = count / plain_secs
    report: dict[str, Any] = {
        "command": "python -m bench.bench_pipeline " + " ".join(argv or sys.argv[1:]),
        "git_commit": git_commit(),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host,
        "spark": spark_version,
        "store_bytes": count * RECORD_BYTES,
        "records": count,
        "record_bytes": RECORD_BYTES,
        "repeats": args.repeats,
        "rows": [
            {"reader": "plain", "seconds": round(plain_secs, 2), "rows_per_s": round(plain_rate)},
            {
                "reader": "datasource",
                "seconds": round(statistics.median(ds), 2),
                "runs_s": [round(x, 2) for x in ds],
                "rows_per_s": round(ds_rate),
            },
            {
                "reader": "datasource, physical_offset only (same scan; Spark converts 1 column)",
                "seconds": round(statistics.median(narrow), 2),
                "runs_s": [round(x, 2) for x in narrow],
                "rows_per_s": round(count / statistics.median(narrow)),
            },
            {
                "reader": "parquet",
                "seconds": round(statistics.median(pq), 2),
                "runs_s": [round(x, 2) for x in pq],
                "rows_per_s": round(pq_rate),
            },
        ],
        "export_seconds": round(export_secs, 2),
        "parquet_bytes": parquet_bytes,
        "datasource_vs_plain": round(ds_rate / plain_rate, 2),
        "parquet_vs_datasource": round(pq_rate / ds_rate, 2),
        "parquet_vs_datasource_per_round": [round(d / p, 2) for d, p in zip(ds, pq, strict=True)],
        "goals": {
            f"datasource >= {GOAL_VS_PLAIN}x plain": ds_rate >= GOAL_VS_PLAIN * plain_rate,
            f"parquet <= {GOAL_PARQUET_WITHIN}x datasource": pq_rate
            <= GOAL_PARQUET_WITHIN * ds_rate,
        },
    }
    md = _markdown(report)
    print(md)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "pipeline.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "pipeline.md").write_text(md)
    return 0


def _markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    load = ", ".join(f"{x:.1f}" for x in m["load_avg_1_5_15"])
    lines = [
        "# Pipeline: data source vs plain decoder vs Parquet",
        "",
        f"- command: `{r['command'].strip()}`",
        f"- commit: `{r['git_commit']}`, {r['when_utc']}",
        f"- machine: {m['cpu_model']}, {m['cores']} cores, kernel {m['kernel']}, "
        f"Python {m['python']}, Spark {r['spark']} local mode; load average at start {load}",
        f"- store: {r['store_bytes'] / 2**20:,.0f} MiB, {r['records']:,} records of "
        f"{r['record_bytes']} bytes, 64 MiB segments, in the page cache",
        f"- Spark figures: median of {r['repeats']} interleaved rounds, every row materialised "
        "(noop sink)",
        "",
        "| reader | seconds | rows/s |",
        "| --- | ---: | ---: |",
    ]
    for row in r["rows"]:
        lines.append(f"| {row['reader']} | {row['seconds']} | {row['rows_per_s']:,} |")
    lines += [
        "",
        f"- export to Parquet (topic/date partitions): {r['export_seconds']} s, "
        f"{r['parquet_bytes'] / 2**20:,.0f} MiB written",
        f"- data source / plain: **{r['datasource_vs_plain']}x** (goal >= {GOAL_VS_PLAIN}x)",
        f"- Parquet / data source: **{r['parquet_vs_datasource']}x** "
        f"(goal <= {GOAL_PARQUET_WITHIN}x); per round: "
        + ", ".join(f"{x}x" for x in r["parquet_vs_datasource_per_round"]),
        "",
        "| goal | met |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {'yes' if v else 'no'} |" for k, v in r["goals"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
