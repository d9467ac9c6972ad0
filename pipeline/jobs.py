"""The pipeline's jobs, as functions of a SparkSession and a store URI.

Each returns plain Python values (dataclasses, lists of dicts) and prints nothing, so the
CLI (`workers/commands/pipeline.py`) formats them and tests check them.

- `stats`: records and bytes per topic and queue, overall and per time window, with rates.
- `query`: the records of a topic / key / time range (topic and time as the source's
  options, so only what they select is read).
- `audit`: every record's CRC and structure; the corrupt ranges.
- `export`: Parquet partitioned by topic and UTC date.

Cost: one scan of the store each (export: one scan and one write).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from mqstore.pipeline.schema import RECORD_FIELDS
from mqstore.pipeline.source import FORMAT_NAME


def load(spark: Any, uri: str, options: dict[str, str] | None = None) -> Any:
    """The store as a DataFrame (`format("mqstore")`)."""
    reader = spark.read.format(FORMAT_NAME)
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load(uri)


@dataclass(frozen=True, slots=True)
class QueueStats:
    topic: str
    queue_id: int
    records: int
    bytes: int
    first_store_ms: int
    last_store_ms: int

    @property
    def records_per_s(self) -> float:
        span_s = max(self.last_store_ms - self.first_store_ms, 1) / 1000.0
        return self.records / span_s if self.records > 1 else 0.0


@dataclass(frozen=True, slots=True)
class WindowStats:
    window_start_ms: int
    topic: str
    queue_id: int
    records: int
    bytes: int
    window_ms: int

    @property
    def records_per_s(self) -> float:
        return self.records * 1000.0 / self.window_ms

    @property
    def bytes_per_s(self) -> float:
        return self.bytes * 1000.0 / self.window_ms


@dataclass(frozen=True, slots=True)
class Stats:
    queues: list[QueueStats]
    windows: list[WindowStats]

    @property
    def records(self) -> int:
        return sum(q.records for q in self.queues)

    @property
    def bytes(self) -> int:
        return sum(q.bytes for q in self.queues)


def stats(spark: Any, uri: str, window_ms: int, options: dict[str, str] | None = None) -> Stats:
    """Counts and bytes per (topic, queue), and per (window, topic, queue) of `window_ms`."""
    from pyspark.sql import functions as F

    df = load(spark, uri, options).select("topic", "queue_id", "size", "store_timestamp")
    df = df.withColumn(
        "window_start", F.floor(F.col("store_timestamp") / window_ms) * F.lit(window_ms)
    ).cache()
    try:
        per_queue = (
            df.groupBy("topic", "queue_id")
            .agg(
                F.count("*").alias("records"),
                F.sum("size").alias("bytes"),
                F.min("store_timestamp").alias("first"),
                F.max("store_timestamp").alias("last"),
            )
            .orderBy("topic", "queue_id")
            .collect()
        )
        per_window = (
            df.groupBy("window_start", "topic", "queue_id")
            .agg(F.count("*").alias("records"), F.sum("size").alias("bytes"))
            .orderBy("window_start", "topic", "queue_id")
            .collect()
        )
    finally:
        df.unpersist()
    return Stats(
        [
            QueueStats(r.topic, r.queue_id, r.records, r.bytes, r["first"], r["last"])
            for r in per_queue
        ],
        [
            WindowStats(int(r.window_start), r.topic, r.queue_id, r.records, r.bytes, window_ms)
            for r in per_window
        ],
    )


def query(
    spark: Any,
    uri: str,
    *,
    topic: str | None = None,
    key: str | None = None,
    from_ms: int | None = None,
    to_ms: int | None = None,
    limit: int | None = None,
    options: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Records matching every given condition, in commit-log order, as dicts of the record
    fields. `key` matches one of the space-separated KEYS or the UNIQ_KEY (message id the
    client assigned), as RocketMQ's index does. Times are epoch ms, inclusive."""
    from pyspark.sql import functions as F

    selected = {
        name: str(value)
        for name, value in (
            ("topic", topic),
            ("fromStoreTimestamp", from_ms),
            ("toStoreTimestamp", to_ms),
        )
        if value is not None
    }
    df = load(spark, uri, {**(options or {}), **selected})
    if key is not None:
        df = df.filter(
            F.array_contains(F.split(F.coalesce(F.col("keys"), F.lit("")), " "), key)
            | (F.col("properties")["UNIQ_KEY"] == key)
        )
    df = df.select(*RECORD_FIELDS).orderBy("physical_offset")
    if limit is not None:
        df = df.limit(limit)
    return [r.asDict(recursive=True) for r in df.collect()]


@dataclass(frozen=True, slots=True)
class CorruptRange:
    physical_offset: int
    size: int
    problem: str
    topic: str | None  # set when the record is whole and only its body CRC fails


@dataclass(frozen=True, slots=True)
class Audit:
    records_checked: int
    bytes_checked: int
    corrupt: list[CorruptRange]

    @property
    def ok(self) -> bool:
        return not self.corrupt


def audit(spark: Any, uri: str, options: dict[str, str] | None = None) -> Audit:
    """Check every record (structure and body CRC) and list what fails, by offset."""
    from pyspark.sql import functions as F

    opts = {**(options or {}), "includeCorrupt": "true"}
    df = load(spark, uri, opts).select("physical_offset", "size", "crc_ok", "problem", "topic")
    df = df.cache()
    try:
        good = df.filter(F.col("problem").isNull()).agg(
            F.count("*").alias("n"), F.sum("size").alias("b")
        )
        totals = good.collect()[0]
        bad = df.filter(F.col("problem").isNotNull()).orderBy("physical_offset").collect()
    finally:
        df.unpersist()
    return Audit(
        records_checked=int(totals.n) + sum(1 for r in bad if r.topic is not None),
        bytes_checked=int(totals.b or 0),
        corrupt=[CorruptRange(r.physical_offset, r.size, r.problem, r.topic) for r in bad],
    )


@dataclass(frozen=True, slots=True)
class Export:
    rows: int
    out: str
    partitions: list[tuple[str, str]]  # (topic, date) written


def _partition_counts(spark: Any, out: str) -> dict[tuple[str, str], int]:
    """Rows per (topic, date) partition under `out`; {} when it holds no Parquet yet."""
    from pyspark.errors import AnalysisException

    try:
        parts = spark.read.parquet(out).groupBy("topic", "date").count().collect()
    except AnalysisException as e:
        if e.getCondition() not in ("PATH_NOT_FOUND", "UNABLE_TO_INFER_SCHEMA"):
            raise
        return {}
    return {(str(r.topic), str(r.date)): int(r["count"]) for r in parts}


def export(
    spark: Any,
    uri: str,
    out: str,
    *,
    mode: str = "errorifexists",
    options: dict[str, str] | None = None,
) -> Export:
    """Write the records as Parquet under `out`, partitioned by `topic` and `date`
    (UTC day of the store time, yyyy-MM-dd). `mode` is Spark's save mode. Raises
    FileExistsError, having written nothing, when `out` exists and `mode` is
    errorifexists (`overwrite` replaces it, `append` adds to it).

    The result counts what this call wrote, never what was there before: with `append`
    and `ignore` the partitions under `out` are counted before and after (one more read
    of the output), so `ignore` on an existing `out` reports 0 rows."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    before = _partition_counts(spark, out) if mode in ("append", "ignore") else {}
    df = load(spark, uri, options).select(*RECORD_FIELDS)
    df = df.withColumn("date", F.to_date(F.timestamp_millis(F.col("store_timestamp"))))
    try:
        df.write.mode(mode).partitionBy("topic", "date").parquet(out)
    except AnalysisException as e:
        if e.getCondition() != "PATH_ALREADY_EXISTS":
            raise
        raise FileExistsError(errno.EEXIST, "export target exists", out) from None
    after = _partition_counts(spark, out)
    written = {k: n - before.get(k, 0) for k, n in sorted(after.items())}
    return Export(
        rows=sum(written.values()),
        out=out,
        partitions=[k for k, n in written.items() if n > 0],
    )
