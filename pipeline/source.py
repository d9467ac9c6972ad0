"""`spark.read.format("mqstore").load(store_dir)`: a PySpark 4 Python data source.

Register it once per session with `register(spark)` (which also turns on
`spark.sql.python.filterPushdown.enabled`, without which Spark refuses a reader that
filters for itself). Then:

    spark.read.format("mqstore").load("file:///data/store")       # or a local path, s3://...
    spark.read.format("mqstore").option("includeCorrupt", "true").load(path)   # for audits

Options (all strings, as Spark passes them):

| option           | default            | meaning                                             |
|------------------|--------------------|-----------------------------------------------------|
| splitBytes       | 67108864 (64 MiB)  | byte length of a split; a segment is cut into these  |
| maxRecordBytes   | 4259840            | largest record the writer allowed (4 MiB + 64 KiB)  |
| batchRows        | 16384              | rows per Arrow batch                                |
| includeCorrupt   | false              | also rows failing their checks (`problem` set)      |
| flushedOffset    | true               | read a live store only up to its flushed offset     |
| timeOrdered      | true               | skip segments outside a pushed-down time range      |

`includeCorrupt` adds records whose body CRC does not match and one row per unreadable
byte range (see `pipeline.schema`). `timeOrdered` relies on store times not going back
from one segment to the next (RocketMQ stamps them under the append lock); it reads
only each segment's first record header. Set it to false for a log written by clocks
that jumped back.

Pushed-down filters (exact: Spark need not re-check them): `topic` =, IN; `queue_id`
=, IN, <, <=, >, >=; `store_timestamp` =, <, <=, >, >=. Others stay with Spark.

Planning (the driver's Python worker) lists the store through `pyarrow.fs` and, when a
time filter is pushed down, reads each segment's first record header (about 100
bytes) to skip segments. Reading happens on executors (`pipeline.scan`); nothing attaches
shared memory, so an executor only needs the files to be reachable by URI.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from mqstore.engine import record as rec
from mqstore.pipeline import scan, storefs
from mqstore.pipeline.columnar import NO_FILTER, RecordFilter
from mqstore.pipeline.schema import DDL

FORMAT_NAME = "mqstore"
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_PEEK_BYTES = 128


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _int(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    value = default if raw is None else int(raw)
    if value <= 0:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What the driver decided, shipped to every task (picklable)."""

    uri: str
    opts: scan.ScanOptions
    split_bytes: int
    honour_flushed: bool
    time_ordered: bool


class SplitPartition(InputPartition):
    """One task: a byte range of one segment."""

    def __init__(self, spec: scan.SplitSpec) -> None:
        super().__init__(spec)
        self.spec = spec


def first_store_timestamp(fs: Any, seg: storefs.Segment) -> int | None:
    """The store time of a segment's first record, from a ~100-byte read; None if unsure."""
    raw = storefs.read_range(fs, seg.path, 0, min(_PEEK_BYTES, seg.readable_bytes))
    return rec.peek_store_timestamp(raw)


def plan_splits(plan: ReadPlan, flt: RecordFilter) -> list[scan.SplitSpec]:
    """Cut every readable segment into splits; drop segments outside the time filter."""
    listing = storefs.open_store(plan.uri, honour_flushed_offset=plan.honour_flushed)
    segments = listing.segments
    if flt.is_empty():
        return []
    keep = [True] * len(segments)
    if plan.time_ordered and (flt.ts_min is not None or flt.ts_max is not None):
        fs, _root = storefs.resolve(plan.uri)
        firsts = [first_store_timestamp(fs, s) for s in segments]
        for i in range(len(segments)):
            nxt = next((t for t in firsts[i + 1 :] if t is not None), None)
            keep[i] = flt.overlaps_time(firsts[i], nxt)
    splits = []
    for seg, wanted in zip(segments, keep, strict=True):
        if not wanted:
            continue
        for begin in range(0, seg.readable_bytes, plan.split_bytes):
            splits.append(
                scan.SplitSpec(
                    seg.path, seg.start_offset, seg.file_size_bytes, seg.readable_bytes,
                    begin, min(begin + plan.split_bytes, seg.readable_bytes),
                )
            )  # fmt: skip
    return splits


def _path(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    return attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None


def _ints(values: Iterable[Any]) -> frozenset[int] | None:
    vals = list(values)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return frozenset(vals)
    return None


def absorb(flt: RecordFilter, f: Filter) -> RecordFilter | None:
    """`flt` narrowed by `f`, or None when `f` is not one this source applies."""
    col = _path(f)
    value: Any = getattr(f, "value", None)
    if col == "topic":
        if isinstance(f, EqualTo) and isinstance(value, str):
            new = frozenset([value])
        elif isinstance(f, In) and all(isinstance(v, str) for v in value):
            new = frozenset(value)
        else:
            return None
        return replace(flt, topics=new if flt.topics is None else flt.topics & new)
    if col not in ("queue_id", "store_timestamp"):
        return None
    if isinstance(f, In):
        ints = _ints(value)
        if col != "queue_id" or ints is None:
            return None
        return replace(flt, queue_ids=ints if flt.queue_ids is None else flt.queue_ids & ints)
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    lo: int | None = None
    hi: int | None = None
    if isinstance(f, EqualTo):
        lo = hi = value
    elif isinstance(f, GreaterThan):
        lo = value + 1
    elif isinstance(f, GreaterThanOrEqual):
        lo = value
    elif isinstance(f, LessThan):
        hi = value - 1
    elif isinstance(f, LessThanOrEqual):
        hi = value
    else:
        return None
    if col == "queue_id":
        return replace(
            flt,
            queue_id_min=_max(flt.queue_id_min, lo),
            queue_id_max=_min(flt.queue_id_max, hi),
        )
    return replace(flt, ts_min=_max(flt.ts_min, lo), ts_max=_min(flt.ts_max, hi))


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class MqStoreReader(DataSourceReader):
    """Plans splits on the driver; reads one split per task on executors."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self.filter = NO_FILTER

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        kept = []
        for f in filters:
            narrowed = absorb(self.filter, f)
            if narrowed is None:
                kept.append(f)
            else:
                self.filter = narrowed
        return kept

    def partitions(self) -> Sequence[InputPartition]:
        return [SplitPartition(s) for s in plan_splits(self.plan, self.filter)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        fs, _root = storefs.resolve(self.plan.uri)
        assert isinstance(partition, SplitPartition)
        spec = partition.spec
        yield from scan.scan_split(fs, spec, self.filter, self.plan.opts)


class MqStoreDataSource(DataSource):
    """The `mqstore` format: one row per commit-log record (columns in `pipeline.schema`)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return DDL

    def reader(self, schema: Any) -> DataSourceReader:
        opts = self.options
        uri = opts.get("path")
        if not uri:
            raise ValueError('spark.read.format("mqstore") needs a store: .load(store_dir)')
        plan = ReadPlan(
            uri=uri,
            opts=scan.ScanOptions(
                max_record_bytes=_int(opts, "maxRecordBytes", scan.DEFAULT_MAX_RECORD_BYTES),
                batch_rows=_int(opts, "batchRows", scan.DEFAULT_BATCH_ROWS),
                include_corrupt=_flag(opts, "includeCorrupt", False),
            ),
            split_bytes=_int(opts, "splitBytes", DEFAULT_SPLIT_BYTES),
            honour_flushed=_flag(opts, "flushedOffset", True),
            time_ordered=_flag(opts, "timeOrdered", True),
        )
        return MqStoreReader(plan)


def register(spark: Any) -> None:
    """Make `format("mqstore")` available in this session and enable filter pushdown."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(MqStoreDataSource)
