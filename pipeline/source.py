"""`spark.read.format("mqstore").load(store_dir)`: a PySpark 4 Python data source.

Register it once per session with `register(spark)`. Then:

    spark.read.format("mqstore").load("file:///data/store")       # or a local path, s3://...
    spark.read.format("mqstore").option("includeCorrupt", "true").load(path)   # for audits
    spark.read.format("mqstore").option("topic", "orders").load(path)   # reads less

Options (all strings, as Spark passes them; names are case-insensitive, and one this
source does not know is refused, so a misspelt `topic` never reads the whole store):

| option             | default            | meaning                                           |
|--------------------|--------------------|---------------------------------------------------|
| splitBytes         | 67108864 (64 MiB)  | byte length of a split; a segment is cut into these |
| maxRecordBytes     | 4259840            | largest record the writer allowed (4 MiB + 64 KiB) |
| batchRows          | 16384              | rows per Arrow batch                              |
| includeCorrupt     | false              | also rows failing their checks (`problem` set)    |
| flushedOffset      | true               | read a live store only up to its flushed offset   |
| timeOrdered        | true               | skip segments outside the store-time range        |
| topic              | (every topic)      | only this topic's records are rows                |
| fromStoreTimestamp | (no bound)         | only records stored at or after this epoch ms     |
| toStoreTimestamp   | (no bound)         | only records stored at or before this epoch ms    |

`includeCorrupt` adds records whose body CRC does not match and one row per unreadable
byte range (see `pipeline.schema`). `timeOrdered` relies on store times not going back
from one segment to the next (RocketMQ stamps them under the append lock); it reads
only each segment's first record header. Set it to false for a log written by clocks
that jumped back. With `topic` or a store-time range, an unreadable byte range is no
row (it has neither). Fillers (`engine.filler`: what the publisher writes over a dead
producer's reservation) are never rows.

Two names, one reader. `format("mqstore")` is the JVM provider `pipeline/jvm`
(`mqstore.spark.MqStoreProvider`, built by `make setup`, added to the session by
`pipeline.session`): this same source, registered as `mqstore_python`, behind a scan
builder that takes the columns a query needs. Spark 4 gives a Python data source no
column pruning (its `PythonScanBuilder` takes no required columns), so the Python source
alone builds every column of every row and ships them all to the JVM; behind the
provider, `reader(schema)` gets only the query's columns and builds only those
(`count()` reads `physical_offset`). Where the jar is not on the driver's class path
(a session started elsewhere), `register` names this source `mqstore` too.

No filter is pushed down. Spark 4's Python data sources keep the plan of the last query
that pushed filters (its partitions and read function) on the DataFrame's table provider
(`PythonDataSourceV2.readInfo`, shared by every query on the DataFrame), and a later
query on it that pushes none (a plain `count()`) would run that plan again. So `where`
clauses stay with Spark, and what a DataFrame reads is decided once, by its options
(`topic` and the store-time range above), for every query on it. Give the options to
read less.

Planning (the driver's Python worker) lists the store through `pyarrow.fs` and, with a
store-time range, reads each segment's first record header (about 100 bytes) to skip
segments. A DataFrame's read is planned at its first query: the provider keeps those
partitions, and every later query on the DataFrame, whatever its columns, reads them (a
live store up to the flushed offset of then), so load the store again to see what was
written since.

Reading happens on executors (`pipeline.scan`); nothing attaches shared memory, so an
executor only needs the files to be reachable by URI.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from mqstore.engine import record as rec
from mqstore.pipeline import scan, storefs
from mqstore.pipeline.columnar import RecordFilter
from mqstore.pipeline.schema import COLUMN_NAMES, COLUMNS, DDL

FORMAT_NAME = "mqstore"
# the Python source's own name in a session; "mqstore" is the JVM provider in front of it
PYTHON_FORMAT_NAME = "mqstore_python"
JVM_PROVIDER = "mqstore.spark.MqStoreProvider"
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024
# what Spark's options hold (lower-cased: Spark hands them over case-insensitively)
OPTIONS = frozenset(
    name.lower()
    for name in (
        "path", "splitBytes", "maxRecordBytes", "batchRows", "includeCorrupt",
        "flushedOffset", "timeOrdered", "topic", "fromStoreTimestamp", "toStoreTimestamp",
    )
)  # fmt: skip
_PEEK_BYTES = 128


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"option {name} must be true or false, got {raw!r}")


def _whole(raw: str) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def _int(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    value = _whole(raw)
    if value is None or value <= 0:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _epoch_ms(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    value = _whole(raw)
    if value is None:
        raise ValueError(f"option {name} must be epoch milliseconds, got {raw!r}")
    return value


def columns_of(schema: Any) -> tuple[str, ...]:
    """The columns Spark asks the reader for (all of them, or those a query reads when the
    JVM provider prunes them), checked against ours; None means all. Raises ValueError."""
    if schema is None:
        return COLUMN_NAMES
    ours = dict(COLUMNS)
    names = []
    for field in schema.fields:
        kind = ours.get(field.name)
        if kind is None or field.dataType.simpleString() != kind:
            raise ValueError(
                f'spark.read.format("mqstore"): no column {field.name} '
                f"{field.dataType.simpleString()}; its columns are: {DDL}"
            )
        names.append(field.name)
    if not names:
        raise ValueError('spark.read.format("mqstore"): a read needs at least one column')
    return tuple(names)


def record_filter(options: Mapping[str, str]) -> RecordFilter:
    """The records a DataFrame holds, from its `topic` and store-time options. Raises
    ValueError for an empty topic or a range that ends before it starts."""
    topic = options.get("topic")
    if topic is not None and not topic:
        raise ValueError("option topic must name a topic, got an empty string")
    lo = _epoch_ms(options, "fromStoreTimestamp")
    hi = _epoch_ms(options, "toStoreTimestamp")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"option fromStoreTimestamp {lo} is after toStoreTimestamp {hi}")
    return RecordFilter(topic=topic, ts_min=lo, ts_max=hi)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What the driver decided, shipped to every task (picklable)."""

    uri: str
    opts: scan.ScanOptions
    filter: RecordFilter
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


def plan_splits(plan: ReadPlan) -> list[scan.SplitSpec]:
    """Cut every readable segment into splits; drop segments outside the store-time range."""
    listing = storefs.open_store(plan.uri, honour_flushed_offset=plan.honour_flushed)
    segments = listing.segments
    flt = plan.filter
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


class MqStoreReader(DataSourceReader):
    """Plans splits on the driver; reads one split per task on executors.

    It has no `pushFilters` (see the module doc): what it reads is its `ReadPlan`, made
    from the DataFrame's options alone."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> Sequence[InputPartition]:
        return [SplitPartition(s) for s in plan_splits(self.plan)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        fs, _root = storefs.resolve(self.plan.uri)
        assert isinstance(partition, SplitPartition)
        yield from scan.scan_split(fs, partition.spec, self.plan.filter, self.plan.opts)


class MqStoreDataSource(DataSource):
    """The `mqstore` format: one row per commit-log record (columns in `pipeline.schema`)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return DDL

    def reader(self, schema: Any) -> DataSourceReader:
        """A reader of `schema`'s columns (a subset of ours, in any order). Raises
        ValueError for a missing store, an unknown option or a bad value."""
        opts = self.options
        unknown = sorted(set(opts) - OPTIONS)
        if unknown:
            raise ValueError(
                f'spark.read.format("mqstore"): unknown option(s) {", ".join(unknown)}; '
                f"known: {', '.join(sorted(OPTIONS - {'path'}))}"
            )
        uri = opts.get("path")
        if not uri:
            raise ValueError('spark.read.format("mqstore") needs a store: .load(store_dir)')
        plan = ReadPlan(
            uri=uri,
            opts=scan.ScanOptions(
                max_record_bytes=_int(opts, "maxRecordBytes", scan.DEFAULT_MAX_RECORD_BYTES),
                batch_rows=_int(opts, "batchRows", scan.DEFAULT_BATCH_ROWS),
                include_corrupt=_flag(opts, "includeCorrupt", False),
                columns=columns_of(schema),
            ),
            filter=record_filter(opts),
            split_bytes=_int(opts, "splitBytes", DEFAULT_SPLIT_BYTES),
            honour_flushed=_flag(opts, "flushedOffset", True),
            time_ordered=_flag(opts, "timeOrdered", True),
        )
        return MqStoreReader(plan)


class MqStorePythonSource(MqStoreDataSource):
    """The same source under the name the JVM provider looks it up by."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_FORMAT_NAME


def jvm_provider_loaded(spark: Any) -> bool:
    """Is the JVM provider (`pipeline/jvm`, on the driver's class path) in this session?"""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: no JVM of ours to ask
        return False
    return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(JVM_PROVIDER))


def register(spark: Any) -> None:
    """Make `format("mqstore")` available in this session: the JVM provider, which reads
    only the columns a query needs, when the session has its jar (`session.start_session`
    adds it); else this Python source alone under that name, which reads them all."""
    spark.dataSource.register(MqStorePythonSource)
    if not jvm_provider_loaded(spark):
        spark.dataSource.register(MqStoreDataSource)
