"""`mqstore pipeline JOB DIR ...`: Spark jobs over a store directory (or a store URI).

    mqstore pipeline stats  DIR [--window 1m] [--json]
    mqstore pipeline query  DIR [--topic T] [--key K] [--begin T0] [--end T1] [--limit N]
                                [--body text|base64|hex]
    mqstore pipeline audit  DIR [--json]          exit 1 when anything is corrupt
    mqstore pipeline export DIR --to OUT [--mode errorifexists|overwrite|append]
    mqstore pipeline cluster [--host H] [--port P] [--cores N] [--memory M] [--print]

Every job runs in local mode (`local[*]`) unless `--master` names a cluster (say
`spark://127.0.0.1:7077`, which `pipeline cluster` runs); under spark-submit, its master
is used. Results go to stdout, mqstore's own lines to stderr; what Spark's JVM prints
(log4j, its warnings) goes to a temporary file, named on stderr and kept when the job
fails, or with `--verbose` to stderr with the progress bar (on a terminal). Times are
ISO 8601 (UTC unless they carry an offset) or epoch milliseconds. DIR may be a local
path or a URI that `pyarrow.fs` understands (`file://`, `s3://`, `hdfs://`).

What a first run lacks is one line with the fix, exit 2: the `[spark]` extra, Java, or
(export) a new output path; arguments are checked before Spark starts. `query` prints
at most `--limit` rows (default 1000) and says on stderr when more matched; `--from` and
`--to` are deprecated spellings of its `--begin` and `--end`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from mqstore.workers.commands._common import (
    add_limit_arguments,
    add_time_arguments,
    say_cut,
    topic_arg,
)
from mqstore.workers.commands._console import make_console
from mqstore.workers.commands._records import add_body_argument, encode_body

NAME = "pipeline"
HELP = "Spark jobs over a store: stats, query, audit, export"

# The [spark] extra's packages (pyproject.toml) and py4j, which pyspark brings: a job that
# cannot import one of these is told to install the extra, not shown the traceback.
_SPARK_EXTRA = frozenset({"pyspark", "pyarrow", "py4j"})
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1}
QUERY_LIMIT = 1000  # rows of `pipeline query` unless --limit says otherwise


def parse_duration_ms(text: str) -> int:
    """`500ms`, `30s`, `5m`, `1h`, `1d`, or plain milliseconds."""
    m = _DURATION.match(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 5m, 1h")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", help="store directory, or a URI pyarrow.fs understands")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument("--split-bytes", type=int, default=None, help="bytes per split (default 64 MiB)")
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="Spark's own log on stderr (default: a file, named when the job fails)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    jobs = p.add_subparsers(dest="job", metavar="JOB", required=True)
    s = jobs.add_parser("stats", help="records, bytes and rates per topic and queue over time")
    _common(s)
    s.add_argument("--window", type=parse_duration_ms, default=60_000, help="window (1m)")
    s.add_argument("--json", action="store_true", help="print JSON")
    q = jobs.add_parser("query", help="records by topic, key and time range")
    _common(q)
    q.add_argument("--topic", default=None, type=topic_arg)
    q.add_argument("--key", default=None, help="one of the record's KEYS, or its UNIQ_KEY")
    add_time_arguments(q, begin_default=None, old=("--from", "--to"), dests=("from_ms", "to_ms"))
    add_limit_arguments(q, default=QUERY_LIMIT)
    add_body_argument(q)
    a = jobs.add_parser("audit", help="verify every CRC and report corrupt ranges")
    _common(a)
    a.add_argument("--json", action="store_true", help="print JSON")
    e = jobs.add_parser("export", help="write Parquet partitioned by topic and date")
    _common(e)
    e.add_argument("--to", dest="out", required=True, help="output directory or URI")
    e.add_argument(
        "--mode",
        choices=["errorifexists", "overwrite", "append", "ignore"],
        default="errorifexists",
    )
    c = jobs.add_parser("cluster", help="run a Spark standalone master and worker for --master")
    c.add_argument("--host", default="127.0.0.1", help="address both bind (127.0.0.1)")
    c.add_argument("--port", type=int, default=7077, help="master port (7077; 0: any free)")
    c.add_argument("--webui-port", type=int, default=8080, help="master web UI (8080; 0: any)")
    c.add_argument("--cores", type=int, default=None, help="worker cores (default: all)")
    c.add_argument("--memory", default=None, help="worker memory, e.g. 2g (default: all but 1g)")
    c.add_argument(
        "--dir", type=Path, default=Path("spark-cluster"),
        help="logs and executors' work dirs (./spark-cluster)",
    )  # fmt: skip
    c.add_argument(
        "--print", dest="print_only", action="store_true",
        help="print the two spark-class commands instead of running them",
    )  # fmt: skip


def _fmt_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _json_record(r: dict[str, Any], body_format: str) -> dict[str, Any]:
    out = dict(r)
    out["magic"] = f"0x{r['magic']:08x}"
    out["body"], out["body_encoding"] = encode_body(bytes(r["body"] or b""), body_format)
    out["properties"] = dict(r["properties"] or {})
    return out


def _fields(obj: Any, names: str) -> dict[str, Any]:
    """`obj`'s attributes `names` (space separated), in that order: a JSON object."""
    return {n: getattr(obj, n) for n in names.split()}


def _print_stats(st: Any, as_json: bool) -> None:
    if as_json:
        queue = "topic queue_id records bytes first_store_ms last_store_ms records_per_s"
        window = "window_start_ms window_ms topic queue_id records bytes records_per_s bytes_per_s"
        doc = {
            "records": st.records,
            "bytes": st.bytes,
            "queues": [_fields(q, queue) for q in st.queues],
            "windows": [_fields(w, window) for w in st.windows],
        }
        print(json.dumps(doc, indent=2))
        return
    from rich.table import Table

    console = make_console()
    t = Table("topic", "queue", "records", "bytes", "first", "last", "records/s", title="per queue")
    for q in st.queues:
        t.add_row(
            q.topic, str(q.queue_id), f"{q.records:,}", f"{q.bytes:,}",
            _fmt_ms(q.first_store_ms), _fmt_ms(q.last_store_ms), f"{q.records_per_s:,.1f}",
        )  # fmt: skip
    console.print(t)
    w_table = Table(
        "window start", "topic", "queue", "records", "bytes", "records/s", "bytes/s",
        title="per window",
    )  # fmt: skip
    for w in st.windows:
        w_table.add_row(
            _fmt_ms(w.window_start_ms), w.topic, str(w.queue_id), f"{w.records:,}",
            f"{w.bytes:,}", f"{w.records_per_s:,.1f}", f"{w.bytes_per_s:,.0f}",
        )  # fmt: skip
    console.print(w_table)
    console.print(f"{st.records:,} records, {st.bytes:,} bytes")


def _print_audit(result: Any, as_json: bool) -> None:
    if as_json:
        corrupt = [
            {
                "physical_offset": c.physical_offset,
                "end_offset": c.physical_offset + c.size,
                **_fields(c, "size problem topic"),
            }
            for c in result.corrupt
        ]
        doc = {**_fields(result, "ok records_checked bytes_checked"), "corrupt": corrupt}
        print(json.dumps(doc, indent=2))
        return
    for c in result.corrupt:
        what = f"record of topic {c.topic!r}" if c.topic is not None else "unreadable range"
        print(
            f"CORRUPT [{c.physical_offset}, {c.physical_offset + c.size}) "
            f"{c.size} bytes, {what}: {c.problem}"
        )
    verdict = "OK" if result.ok else f"{len(result.corrupt)} corrupt range(s)"
    print(
        f"audit: {result.records_checked:,} records, {result.bytes_checked:,} bytes "
        f"of sound records checked: {verdict}"
    )


def run(args: argparse.Namespace) -> int:
    try:
        return _run_cluster(args) if args.job == "cluster" else _run_job(args)
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in _SPARK_EXTRA:
            raise
        print(
            f"mqstore pipeline: no module {e.name!r}: the pipeline needs the [spark] extra: "
            "pip install 'mqstore[spark]'",
            file=sys.stderr,
        )
        return 2


def _run_job(args: argparse.Namespace) -> int:
    from mqstore.pipeline import storefs

    refused = _refused(args)
    if refused:
        print(f"mqstore pipeline {args.job}: {refused}", file=sys.stderr)
        return 2
    try:
        listing = storefs.open_store(args.store_dir)
    except (storefs.StoreNotFound, OSError, ValueError) as e:
        print(f"mqstore pipeline: {e}", file=sys.stderr)
        return 2
    if not listing.segments:
        print(f"mqstore pipeline: {args.store_dir}: no commit-log segments", file=sys.stderr)
    live = (
        f", live up to offset {listing.flushed_offset}"
        if listing.flushed_offset is not None
        else ""
    )
    size = sum(s.readable_bytes for s in listing.segments)
    print(
        f"mqstore pipeline {args.job}: {len(listing.segments)} segment(s), {size:,} bytes{live}",
        file=sys.stderr,
    )
    log = None if args.verbose else _new_spark_log(args.job)
    code = 1  # what an exception leaves: the log is kept and named
    try:
        code = _run_on_spark(args, log)
    finally:
        if log is not None:
            _settle_spark_log(log, code)
    return code


def _refused(args: argparse.Namespace) -> str:
    """Why the job's arguments are refused ("" when they are not), found before Spark
    starts (a minute on a busy machine): a time range that ends before it begins, a
    `--limit` below 1, an export onto an existing path without a mode that allows it."""
    if args.job == "query":
        if None not in (args.from_ms, args.to_ms) and args.from_ms > args.to_ms:
            return f"--begin {args.from_ms} is after --end {args.to_ms}"
        if args.limit < 1:
            return "--limit must be >= 1"
    if args.job == "export" and args.mode == "errorifexists" and _exists(args.out):
        return _EXISTS.format(out=args.out)
    return ""


_EXISTS = "{out} exists, nothing written: --mode overwrite replaces it, --mode append adds to it"


def _exists(uri: str) -> bool:
    from pyarrow import fs as pafs

    from mqstore.pipeline import storefs

    try:
        fs, path = storefs.resolve(uri)
        return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)
    except (OSError, ValueError):
        return False  # Spark's own write says what is wrong with it


def _new_spark_log(job: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=f"mqstore-pipeline-{job}-", suffix=".log")
    os.close(fd)
    return Path(name)


def _settle_spark_log(log: Path, code: int) -> None:
    """Keep and name Spark's log after a failure (exit 1: a crash, a JVM that did not start,
    corrupt records found); remove it after success and after a refusal (exit 2), whose
    one line said all there is."""
    if code in (0, 2) or log.stat().st_size == 0:
        log.unlink()
    else:
        print(f"mqstore pipeline: Spark's log: {log}", file=sys.stderr)


def _run_on_spark(args: argparse.Namespace, log: Path | None) -> int:
    from mqstore.pipeline import jobs, session

    options = {} if args.split_bytes is None else {"splitBytes": str(args.split_bytes)}
    owned = session.owns_session()
    try:
        spark = session.start_session(f"mqstore pipeline {args.job}", args.master, spark_log=log)
    except session.SparkStartError as e:
        print(f"mqstore pipeline: {e}", file=sys.stderr)
        return 2 if isinstance(e, session.JavaNotFound) else 1
    try:
        if args.job == "stats":
            _print_stats(jobs.stats(spark, args.store_dir, args.window, options), args.json)
            return 0
        if args.job == "query":
            rows = jobs.query(
                spark, args.store_dir, topic=args.topic, key=args.key,
                from_ms=args.from_ms, to_ms=args.to_ms, limit=args.limit + 1, options=options,
            )  # fmt: skip
            for r in rows[: args.limit]:
                print(json.dumps(_json_record(r, args.body), ensure_ascii=False))
            print(f"{min(len(rows), args.limit)} record(s)", file=sys.stderr)
            if len(rows) > args.limit:
                say_cut(f"{NAME} query", args.limit, "more records match: a larger --limit")
            return 0
        if args.job == "audit":
            result = jobs.audit(spark, args.store_dir, options)
            _print_audit(result, args.json)
            return 0 if result.ok else 1
        if args.job == "export":
            return _export(spark, args, options)
        raise AssertionError(f"unknown job {args.job}")
    finally:
        if owned:
            spark.stop()


def _export(spark: Any, args: argparse.Namespace, options: dict[str, str]) -> int:
    from mqstore.pipeline import jobs

    try:
        done = jobs.export(spark, args.store_dir, args.out, mode=args.mode, options=options)
    except FileExistsError:  # made between the check before Spark and the write
        print(f"mqstore pipeline export: {_EXISTS.format(out=args.out)}", file=sys.stderr)
        return 2
    if args.mode == "ignore" and done.rows == 0:
        print(f"{done.out} exists: --mode ignore wrote nothing")
        return 0
    print(
        f"exported {done.rows:,} records to {done.out} "
        f"({len(done.partitions)} topic/date partitions)"
    )
    return 0


def _run_cluster(args: argparse.Namespace) -> int:
    """Run a master and a worker until Ctrl-C or SIGTERM (the handlers only record it;
    this loop stops the daemons), printing the master's URL on stdout once the worker
    has registered. Exit 1 when a daemon exits or does not start."""
    from mqstore.pipeline import cluster
    from mqstore.pipeline.java import missing_java

    spec = cluster.ClusterSpec(
        host=args.host, port=args.port, webui_port=args.webui_port,
        cores=args.cores, memory=args.memory, cluster_dir=args.dir,
    )  # fmt: skip
    if args.print_only:
        cluster.write_commands(spec, sys.stdout)
        return 0
    missing = missing_java()
    if missing is not None:
        print(f"mqstore pipeline cluster: {missing}", file=sys.stderr)
        return 2
    signals: list[int] = []

    def record(signum: int, _frame: FrameType | None) -> None:
        signals.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGINT, signal.SIGTERM)}
    daemons = cluster.Cluster(spec)
    try:
        url = daemons.start(stopping=lambda: bool(signals))
        print(url, flush=True)
        print(
            f"mqstore pipeline cluster: master {url}, one worker; logs and executors in "
            f"{spec.cluster_dir}; Ctrl-C stops both",
            file=sys.stderr,
        )
        while not signals:
            gone = daemons.exited()
            if gone is not None:
                print(f"mqstore pipeline cluster: {gone}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    except cluster.ClusterError as e:
        print(f"mqstore pipeline cluster: {e}", file=sys.stderr)
        return 1
    finally:
        daemons.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
