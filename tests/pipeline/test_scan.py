"""The data source's reading side without Spark: splits, sync points, cut-off, damage.

`plan_splits` and `scan_split` are what each Spark task runs; calling them directly lets
these tests try hundreds of split layouts in a second. The oracle is the plain reader
(`pipeline.plain`, one `engine.record.decode` per record from each segment's start).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from mqstore.engine import record as rec
from mqstore.pipeline import plain, scan, source, storefs
from mqstore.pipeline.columnar import NO_FILTER, RecordFilter
from mqstore.pipeline.schema import COLUMN_NAMES
from tests.pipeline import storegen
from tests.pipeline.rows import by_offset, plain_row

REAL = ["broker-4.2-unit-store", "broker-4.9-commitlog", "rocketmq-rust-0.9-store"]


def read_rows(
    store: Path | str,
    split_bytes: int,
    *,
    max_record_bytes: int = scan.DEFAULT_MAX_RECORD_BYTES,
    include_corrupt: bool = False,
    flt: RecordFilter = NO_FILTER,
    honour_flushed: bool = True,
    columns: tuple[str, ...] = COLUMN_NAMES,
) -> list[dict[str, Any]]:
    """Every row of every split, as the Spark tasks would produce them."""
    opts = scan.ScanOptions(
        max_record_bytes=max_record_bytes, include_corrupt=include_corrupt, columns=columns
    )
    plan = source.ReadPlan(str(store), opts, flt, split_bytes, honour_flushed, True)
    fs, _root = storefs.resolve(str(store))
    rows: list[dict[str, Any]] = []
    for spec in source.plan_splits(plan):
        for batch in scan.scan_split(fs, spec, flt, opts):
            rows.extend(batch.to_pylist())
    return rows


def expected(store: Path | str, **kw: Any) -> list[dict[str, Any]]:
    return [plain_row(d) for d in plain.iter_records(store, **kw)]


def largest_record(store: Path | str) -> int:
    return max(d.size for d in plain.iter_records(store, include_corrupt=True))


@pytest.fixture
def mixed_store(tmp_path: Path) -> Path:
    """V1 and V2 records, IPv6 hosts, zlib bodies, stale records after every BLANK."""
    root = tmp_path / "mixed"
    msgs = storegen.mixed_messages(700) + storegen.compressed_messages(30)
    storegen.write_store(root, msgs, segment_bytes=32 * 1024, v2_every=5, stale_after_blank=True)
    return root


@pytest.mark.parametrize("name", REAL)
def test_real_store_rows_equal_plain_reader_for_every_split_size(
    name: str, real_store_copy: Callable[[str], Path]
) -> None:
    store = real_store_copy(name)
    want = expected(store)
    assert want, "the plain reader found no records"
    biggest = largest_record(store)
    # a max record size close to the real one puts the stale bytes after each BLANK
    # (broker-4.2) inside the split that must distrust them
    for max_record in (biggest, 2 * biggest, scan.DEFAULT_MAX_RECORD_BYTES):
        for split in (7, 91, 333, 4099, 1 << 20):
            got = by_offset(read_rows(store, split, max_record_bytes=max_record))
            assert got == want, f"{name}: split {split}, max record {max_record}"


def test_generated_store_rows_equal_plain_reader_for_every_split_size(mixed_store: Path) -> None:
    want = expected(mixed_store)
    assert len(want) == 731  # 700 mixed, 30 compressed, 1 flagged body that does not inflate
    assert {r["magic"] for r in want} == {rec.MESSAGE_MAGIC_CODE, rec.MESSAGE_MAGIC_CODE_V2}
    assert any(r["born_host"].startswith("[") for r in want)
    assert any(r["sys_flag"] & rec.SysFlag.COMPRESSED for r in want)
    biggest = largest_record(mixed_store)
    for split in (13, 97, 1000, 9973, 1 << 20):
        got = by_offset(read_rows(mixed_store, split, max_record_bytes=biggest))
        assert got == want, f"split {split}"


def test_commitlog_store_rows_equal_the_logs_own_reads(tmp_path: Path) -> None:
    from mqstore.engine.commitlog import CommitLog

    root = tmp_path / "cl"
    offsets = storegen.commitlog_store(root, storegen.mixed_messages(400), segment_bytes=16384)
    log = CommitLog.open(root / "commitlog", 16384, read_only=True)
    try:
        want = [plain_row(d) for d in log.iter_records()]
    finally:
        log.close()
    assert [r["physical_offset"] for r in want] == offsets
    for split in (5, 2049, 16384):
        assert by_offset(read_rows(root, split, max_record_bytes=4096)) == want


def test_a_record_straddling_a_split_boundary_belongs_to_the_split_it_starts_in(
    tmp_path: Path,
) -> None:
    root = tmp_path / "s"
    offsets = storegen.write_store(root, storegen.mixed_messages(200), segment_bytes=1 << 20)
    seg = storefs.open_store(str(root)).segments[0]
    fs, _ = storefs.resolve(str(root))
    opts = scan.ScanOptions(max_record_bytes=4096)
    sizes = {r["physical_offset"]: r["size"] for r in expected(root)}
    for target in offsets[1:-1:7]:
        for cut in (target + 1, target + sizes[target] // 2, target + sizes[target] - 1):
            halves = [
                scan.SplitSpec(seg.path, 0, seg.file_size_bytes, seg.readable_bytes, b, e)
                for b, e in ((0, cut), (cut, seg.readable_bytes))
            ]
            seen = [
                [o for b in scan.scan_split(fs, h, NO_FILTER, opts) for o in b["physical_offset"]]
                for h in halves
            ]
            first, second = ([x.as_py() for x in part] for part in seen)
            assert target in first and target not in second, (target, cut)
            assert sorted(first + second) == offsets


def test_live_store_is_read_only_up_to_the_flushed_offset(tmp_path: Path) -> None:
    root = tmp_path / "live"
    offsets = storegen.write_store(root, storegen.mixed_messages(300), segment_bytes=16384)
    everything = expected(root)
    ends = {r["physical_offset"]: r["physical_offset"] + r["size"] for r in everything}
    for flushed in (offsets[5] + 3, offsets[120], ends[offsets[200]], offsets[-1] + 1):
        storegen.write_flushed_offset(root, flushed)
        want = [r for r in everything if ends[r["physical_offset"]] <= flushed]
        assert want == expected(root)  # the plain reader honours it too
        for split in (1000, 16384):
            assert by_offset(read_rows(root, split, max_record_bytes=4096)) == want, flushed
            # a record cut by the flushed offset is not there yet, not damage
            assert (
                by_offset(read_rows(root, split, max_record_bytes=4096, include_corrupt=True))
                == want
            )
        assert by_offset(read_rows(root, 1000, honour_flushed=False)) == everything


def _damage(root: Path, offset: int, pos: int, data: bytes) -> None:
    seg = max(
        (s for s in storefs.open_store(str(root)).segments if s.start_offset <= offset),
        key=lambda s: s.start_offset,
    )
    with open(seg.path, "r+b") as f:
        f.seek(offset - seg.start_offset + pos)
        f.write(data)


def test_corrupt_records_are_skipped_by_default_and_reported_under_include_corrupt(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bad"
    msgs = [
        rec.Message(topic="T", body=b"payload %d " % i * 10, queue_id=i % 3) for i in range(400)
    ]
    offsets = storegen.write_store(root, msgs, segment_bytes=16384)
    sound = expected(root)
    crc_victim, header_victim = offsets[50], offsets[250]
    _damage(root, crc_victim, 88, b"\xff")  # first body byte: CRC mismatch
    _damage(root, header_victim, 0, struct.pack(">i", 7))  # TOTALSIZE nonsense
    want = [r for r in sound if r["physical_offset"] not in (crc_victim, header_victim)]
    assert expected(root, include_corrupt=False) != want  # the plain reader stops there
    for split in (333, 4099, 16384):
        got = read_rows(root, split, max_record_bytes=4096)
        assert by_offset(got) == want, split
        audit = sorted(
            read_rows(root, split, max_record_bytes=4096, include_corrupt=True),
            key=lambda r: r["physical_offset"],
        )
        bad = [r for r in audit if r["problem"] is not None]
        assert [(r["physical_offset"], r["crc_ok"]) for r in bad] == [
            (crc_victim, False),
            (header_victim, False),
        ], split
        assert bad[0]["problem"] == "body CRC mismatch" and bad[0]["topic"] == "T"
        assert bad[1]["topic"] is None  # an unreadable range, up to the next record
        assert bad[1]["physical_offset"] + bad[1]["size"] == offsets[251]


@pytest.mark.parametrize("torn_at", [9, 30, 120])
def test_a_torn_last_record_is_one_unreadable_range_whatever_the_splits(
    tmp_path: Path, torn_at: int
) -> None:
    """A crash tore the last record of a stopped store's last segment (zeros from byte
    `torn_at` of it on). Every split layout gives the sound records, and under
    `includeCorrupt` one row for the torn range. On the code before, a layout whose
    split boundary fell between the torn record and the record before it had no row:
    the split the record before starts in stopped at its end, and the next split found
    no sync point to walk from."""
    root = tmp_path / "torn"
    msgs = [rec.Message(topic="T", body=b"m%d " % i * (i % 40 + 1)) for i in range(300)]
    offsets = storegen.write_store(root, msgs, segment_bytes=16384)
    sound = expected(root)
    last = sound[-1]
    assert last["physical_offset"] == offsets[-1]
    _damage(root, offsets[-1], torn_at, bytes(last["size"] - torn_at))
    want = sound[:-1]
    seg = storefs.open_store(str(root)).segments[-1]
    torn = offsets[-1] - seg.start_offset
    assert torn > 1000  # split boundaries fall before it, between it and the record before
    whole = read_rows(root, 16384, max_record_bytes=4096, include_corrupt=True)
    whole = [r for r in whole if r["problem"]]
    assert [(r["physical_offset"], r["topic"]) for r in whole] == [(offsets[-1], None)]
    # every boundary from 600 bytes before the torn record to the record itself
    for split in sorted({torn - d for d in range(1, 600, 7)} | {257, 1000, 4096}):
        assert by_offset(read_rows(root, split, max_record_bytes=4096)) == want, split
        audit = read_rows(root, split, max_record_bytes=4096, include_corrupt=True)
        assert [r for r in audit if r["problem"]] == whole, split
        assert by_offset([r for r in audit if not r["problem"]]) == want, split


# what queries read: one column, the cheapest, a few of each kind (gathered from the header,
# built from the properties, the problem of a corrupt row), in any order, and all of them
COLUMN_SETS = [
    ("body",),
    ("physical_offset",),
    ("topic", "queue_id", "store_timestamp"),
    ("problem", "size", "crc_ok", "physical_offset", "magic"),
    ("keys", "msg_id", "born_host", "tags", "store_host", "reconsume_times"),
    ("properties", "body_crc", "prepared_transaction_offset", "flag", "sys_flag"),
    tuple(reversed(COLUMN_NAMES)),
]


def _project(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{c: r[c] for c in columns} for r in rows]


@pytest.mark.parametrize("columns", COLUMN_SETS, ids=lambda c: ",".join(c)[:40])
def test_a_read_of_some_columns_gives_those_columns_of_the_whole_rows(
    tmp_path: Path, mixed_store: Path, columns: tuple[str, ...]
) -> None:
    """What Spark's column pruning asks of the reader (`pipeline/jvm`): the same rows, in
    the same order, with only the columns asked for, in the order asked for; on V2 and
    IPv6 records (the engine-decoded path), corrupt ones, unreadable ranges and a filter."""
    root = tmp_path / "bad"
    msgs = [rec.Message(topic="T", body=b"p%d " % i * 10, queue_id=i % 3) for i in range(400)]
    offsets = storegen.write_store(root, msgs, segment_bytes=16384, fillers={7, 300})
    _damage(root, offsets[50], 88, b"\xff")  # a CRC mismatch
    _damage(root, offsets[250], 0, struct.pack(">i", 7))  # an unreadable range
    biggest = largest_record(mixed_store)
    lo = expected(mixed_store)[200]["store_timestamp"]
    cases: list[tuple[Path, dict[str, Any]]] = [
        (mixed_store, {"max_record_bytes": biggest}),
        (mixed_store, {"max_record_bytes": biggest, "flt": RecordFilter("orders", lo, None)}),
        (root, {"max_record_bytes": 4096, "include_corrupt": True}),
        (root, {"max_record_bytes": 4096}),
    ]
    for store, kw in cases:
        for split in (997, 1 << 20):
            whole = read_rows(store, split, **kw)
            some = read_rows(store, split, columns=columns, **kw)
            assert [list(r) for r in some[:1]] == [list(columns)]
            assert some == _project(whole, columns), (store.name, kw, split)
            assert len(whole) > 100


def test_a_reader_builds_the_columns_spark_asks_for() -> None:
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    def schema(*fields: tuple[str, Any]) -> StructType:
        return StructType([StructField(n, t) for n, t in fields])

    assert source.columns_of(None) == COLUMN_NAMES
    pruned = schema(("msg_id", StringType()), ("body", BinaryType()))
    reader = source.MqStoreDataSource(_options()).reader(pruned)
    assert isinstance(reader, source.MqStoreReader)
    assert reader.plan.opts.columns == ("msg_id", "body")
    for bad in (("msg_id", BinaryType()), ("nope", IntegerType())):
        with pytest.raises(ValueError, match="no column"):
            source.columns_of(schema(bad))
    with pytest.raises(ValueError, match="at least one column"):
        source.columns_of(schema())


def test_reused_read_buffers_are_never_shared_while_lent(tmp_path: Path) -> None:
    """`read_range_reused` keeps its buffer for the next read: a read inside another one,
    or two splits read in turns, must not see each other's bytes."""
    root = tmp_path / "r"
    storegen.write_store(root, storegen.mixed_messages(400), segment_bytes=16384)
    segs = storefs.open_store(str(root)).segments
    fs, _ = storefs.resolve(str(root))
    first, second = segs[0].path, segs[1].path
    with storefs.read_range_reused(fs, first, 10, 9000) as a:
        with storefs.read_range_reused(fs, second, 0, 20000) as b:
            assert bytes(b) == storefs.read_range(fs, second, 0, 20000)
        assert bytes(a) == storefs.read_range(fs, first, 10, 9000)
    with storefs.read_range_reused(fs, first, 16000, 9000) as c:
        assert bytes(c) == storefs.read_range(fs, first, 16000, 384)  # the end of the file
    opts = scan.ScanOptions(max_record_bytes=4096, batch_rows=7)
    gens = [scan.scan_split(fs, scan.SplitSpec(s.path, s.start_offset, s.file_size_bytes,
                                               s.readable_bytes, 0, s.readable_bytes), NO_FILTER,
                            opts) for s in segs]  # fmt: skip
    rows: list[dict[str, Any]] = []
    while gens:  # one batch of each split in turn
        for g in list(gens):
            batch = next(g, None)
            if batch is None:
                gens.remove(g)
            else:
                rows.extend(batch.to_pylist())
    assert by_offset(rows) == expected(root)


def test_time_filter_skips_segments_and_rows(tmp_path: Path) -> None:
    root = tmp_path / "t"
    storegen.write_store(root, storegen.mixed_messages(600), segment_bytes=16384)
    everything = expected(root)
    lo = everything[250]["store_timestamp"]
    hi = everything[320]["store_timestamp"]
    flt = RecordFilter(topic="tópico", ts_min=lo, ts_max=hi)
    want = [r for r in everything if lo <= r["store_timestamp"] <= hi and r["topic"] == "tópico"]
    assert want
    plan = source.ReadPlan(str(root), scan.ScanOptions(), flt, 16384, True, True)
    everywhere = source.ReadPlan(str(root), scan.ScanOptions(), NO_FILTER, 16384, True, True)
    assert 0 < len(source.plan_splits(plan)) < len(source.plan_splits(everywhere))
    assert by_offset(read_rows(root, 16384, flt=flt)) == want


def _options(**kw: str) -> CaseInsensitiveDict:
    return CaseInsensitiveDict({"path": "/nowhere", **kw})


def test_options_select_the_records() -> None:
    flt = source.record_filter(
        _options(TOPIC="orders", fromStoreTimestamp="5", tostoretimestamp="9")
    )
    assert flt == RecordFilter(topic="orders", ts_min=5, ts_max=9)
    assert source.record_filter(_options()) == NO_FILTER


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"topic": ""}, "option topic must name a topic"),
        ({"fromStoreTimestamp": "9", "toStoreTimestamp": "5"}, "fromStoreTimestamp 9 is after"),
        ({"toStoreTimestamp": "yesterday"}, "must be epoch milliseconds"),
        ({"topics": "orders"}, "unknown option(s) topics"),  # misspelt: would read everything
        ({"splitBytes": "64k"}, "option splitBytes must be a positive integer, got '64k'"),
        ({"batchRows": "0"}, "option batchRows must be a positive integer, got '0'"),
        ({"includeCorrupt": "treu"}, "option includeCorrupt must be true or false, got 'treu'"),
    ],
)
def test_bad_options_are_refused(opts: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        source.MqStoreDataSource(_options(**opts)).reader(None)


def test_fillers_are_never_rows(tmp_path: Path) -> None:
    root = tmp_path / "f"
    msgs = storegen.mixed_messages(400)
    dead = set(range(3, 400, 37))
    offsets = storegen.write_store(root, msgs, segment_bytes=16384, v2_every=5, fillers=dead)
    want = expected(root)
    assert [r["physical_offset"] for r in want] == [
        o for i, o in enumerate(offsets) if i not in dead
    ]
    biggest = largest_record(root)
    for split in (997, 5003, 1 << 20):
        assert by_offset(read_rows(root, split, max_record_bytes=biggest)) == want
        kept = read_rows(root, split, max_record_bytes=biggest, include_corrupt=True)
        assert by_offset(kept) == want


def test_store_uri_and_missing_store(tmp_path: Path) -> None:
    root = tmp_path / "u"
    storegen.write_store(root, storegen.mixed_messages(20))
    assert by_offset(read_rows(root.as_uri(), 1 << 20)) == expected(root)
    with pytest.raises(storefs.StoreNotFound):
        storefs.open_store(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    assert storefs.open_store(str(tmp_path / "empty")).segments == ()


def test_compressed_bodies_are_rows_of_their_original_bytes(mixed_store: Path) -> None:
    """zlib (4.x: flag alone), ZLIB, LZ4 and ZSTD bodies come out inflated, with the codec
    in `compression`; a flagged body that does not inflate stays as stored."""
    rows = [r for r in read_rows(mixed_store, 4099) if r["topic"] == "zipped"]
    assert len(rows) == 31
    rows.sort(key=lambda r: r["physical_offset"])
    for i, r in enumerate(rows[:30]):
        assert r["body"] == b"squeeze me %d " % i * 20
        assert r["compression"] == ["zlib", "lz4", "zstd", "zlib"][i % 4]
    assert (rows[30]["body"], rows[30]["compression"]) == (b"not zlib", "zlib")
    others = [r for r in read_rows(mixed_store, 1 << 20) if r["topic"] != "zipped"]
    assert others and all(r["compression"] is None for r in others)
