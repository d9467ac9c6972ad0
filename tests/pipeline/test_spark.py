"""`spark.read.format("mqstore")` and the jobs on it, on a real local Spark (local[2]).

The oracle is the plain reader (`pipeline.plain`: `engine.record.decode` record after
record) or the commit log's own reads. One SparkSession serves the module (see
conftest); the CLI is run in process on it, and once in a fresh subprocess.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mqstore.engine import record as rec
from mqstore.pipeline import jobs, plain
from mqstore.workers import cli
from tests.pipeline import storegen
from tests.pipeline.rows import by_offset, plain_row

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
REAL = ["broker-4.2-unit-store", "broker-4.9-commitlog", "rocketmq-rust-0.9-store"]


def rows_of(spark: Any, store: Path | str, **options: str) -> list[dict[str, Any]]:
    return by_offset(
        r.asDict(recursive=True) for r in jobs.load(spark, str(store), options).collect()
    )


def expected(store: Path | str, **kw: Any) -> list[dict[str, Any]]:
    return [plain_row(d) for d in plain.iter_records(store, **kw)]


@pytest.fixture
def mixed_store(tmp_path: Path) -> Path:
    root = tmp_path / "mixed"
    msgs = storegen.mixed_messages(500) + storegen.compressed_messages(20)
    storegen.write_store(root, msgs, segment_bytes=32 * 1024, v2_every=5, stale_after_blank=True)
    return root


@pytest.mark.parametrize("name", REAL)
def test_real_rocketmq_store_reads_as_the_engine_decodes_it(
    spark: Any, name: str, real_store_copy: Callable[[str], Path]
) -> None:
    store = real_store_copy(name)
    want = expected(store)
    assert want
    assert rows_of(spark, store) == want
    biggest = str(max(r["size"] for r in want))
    assert rows_of(spark, store, splitBytes="997", maxRecordBytes=biggest) == want


def test_commitlog_store_matches_the_logs_reads(spark: Any, tmp_path: Path) -> None:
    from mqstore.engine.commitlog import CommitLog

    root = tmp_path / "cl"
    storegen.commitlog_store(root, storegen.mixed_messages(400), segment_bytes=16384)
    log = CommitLog.open(root / "commitlog", 16384, read_only=True)
    try:
        want = [plain_row(d) for d in log.iter_records()]
    finally:
        log.close()
    got = rows_of(spark, root, splitBytes="4099", maxRecordBytes="4096")
    assert got == want
    counts = jobs.load(spark, str(root)).groupBy("topic").count().collect()
    assert {r.topic: r["count"] for r in counts} == Counter(r["topic"] for r in want)


def test_v2_ipv6_compressed_and_stale_bytes_with_many_splits(spark: Any, mixed_store: Path) -> None:
    want = expected(mixed_store)
    assert {r["magic"] for r in want} == {rec.MESSAGE_MAGIC_CODE, rec.MESSAGE_MAGIC_CODE_V2}
    biggest = str(max(r["size"] for r in want))
    assert rows_of(spark, mixed_store, splitBytes="5003", maxRecordBytes=biggest) == want


def _matrix(want: list[dict[str, Any]]) -> dict[str, tuple[Any, Callable[[Any], bool]]]:
    """Filters on every kind of column, each with the same test on the engine's rows."""
    from pyspark.sql import functions as F

    lo, hi = want[100]["store_timestamp"], want[400]["store_timestamp"]
    mid = want[250]["physical_offset"]
    return {
        "topic and queue": (
            (F.col("topic") == "payments") & (F.col("queue_id") == 1),
            lambda r: r["topic"] == "payments" and r["queue_id"] == 1,
        ),
        "topics": (
            F.col("topic").isin("orders", "tópico"),
            lambda r: r["topic"] in ("orders", "tópico"),
        ),
        "queue range": (F.col("queue_id") >= 2, lambda r: r["queue_id"] >= 2),
        "tags": (F.col("tags") == "b", lambda r: r["tags"] == "b"),
        "keys": (F.col("keys").contains("order-3"), lambda r: "order-3" in (r["keys"] or "")),
        "time range": (
            (F.col("store_timestamp") >= lo) & (F.col("store_timestamp") < hi),
            lambda r: lo <= r["store_timestamp"] < hi,
        ),
        "offsets": (
            (F.col("physical_offset") > mid) & (F.col("queue_offset") <= 60),
            lambda r: r["physical_offset"] > mid and r["queue_offset"] <= 60,
        ),
        "nothing": (F.col("topic") == "nothing-here", lambda r: False),
    }


def test_every_query_on_a_dataframe_answers_as_if_it_were_the_first(
    spark: Any, mixed_store: Path
) -> None:
    """A filtered query must leave nothing behind for the next query on the DataFrame:
    not a plain count, not a grouping, not a filter Spark cannot hand to the source."""
    from pyspark.sql import functions as F

    want = expected(mixed_store)
    topics = Counter(r["topic"] for r in want)
    long_bodies = sum(1 for r in want if len(r["body"]) > 100)
    df = jobs.load(spark, str(mixed_store), {"splitBytes": "8192"})
    assert df.count() == len(want)
    for name, (condition, keep) in _matrix(want).items():
        assert df.where(condition).count() == sum(1 for r in want if keep(r)), name
        assert df.count() == len(want), f"a count after the {name} filter"
        by_topic = {r.topic: r["count"] for r in df.groupBy("topic").count().collect()}
        assert by_topic == topics, f"topics after the {name} filter"
        assert df.where(F.length("body") > 100).count() == long_bodies, name


def test_options_choose_what_a_dataframe_reads(spark: Any, mixed_store: Path) -> None:
    want = expected(mixed_store)
    lo, hi = want[100]["store_timestamp"], want[400]["store_timestamp"]
    chosen = [r for r in want if r["topic"] == "orders" and lo <= r["store_timestamp"] <= hi]
    opts = {"topic": "orders", "fromStoreTimestamp": str(lo), "toStoreTimestamp": str(hi)}
    df = jobs.load(spark, str(mixed_store), {**opts, "splitBytes": "8192"})
    assert by_offset(r.asDict(recursive=True) for r in df.collect()) == chosen
    assert df.where("queue_id = 1").count() == sum(1 for r in chosen if r["queue_id"] == 1)
    assert df.count() == len(chosen)
    with pytest.raises(Exception, match=re.escape("unknown option(s) topics")):
        jobs.load(spark, str(mixed_store), {"topics": "orders"}).count()


def _scanned_columns(df: Any) -> list[str]:
    """The columns the query's scan of the store reads (its executed plan)."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    scans = re.findall(r"BatchScan mqstore\[([^\]]*)\]", plan)
    assert len(scans) == 1, plan
    return [re.sub(r"#\d+L?$", "", c) for c in scans[0].split(", ")]


def test_format_mqstore_reads_only_the_columns_a_query_needs(spark: Any, mixed_store: Path) -> None:
    """`format("mqstore")` is the JVM provider (`pipeline/jvm`) in front of the Python
    source: Spark prunes columns through it, and the Python source builds only those."""
    from pyspark.sql import functions as F

    from mqstore.pipeline import source

    assert source.jvm_provider_loaded(spark)  # `make setup` built it, the session has it
    want = expected(mixed_store)
    df = jobs.load(spark, str(mixed_store), {"splitBytes": "8192"})
    query = df.agg(F.count("*").alias("n"), F.sum(F.length("body")).alias("b"))
    assert _scanned_columns(query) == ["body"]
    assert query.collect()[0].asDict() == {
        "n": len(want),
        "b": sum(len(r["body"]) for r in want),
    }
    assert _scanned_columns(df.select("msg_id", "topic")) == ["topic", "msg_id"]
    assert len(_scanned_columns(df)) == 23
    assert df.count() == len(want)  # no column at all: one is read for the rows
    assert df.where("queue_id = 1").select("body").count() == sum(
        1 for r in want if r["queue_id"] == 1
    )


@pytest.mark.parametrize(
    "columns",
    [("body",), ("topic", "problem", "physical_offset"), ("properties", "tags", "msg_id")],
)
def test_pruned_reads_equal_the_python_sources_rows(
    spark: Any, tmp_path: Path, real_store_copy: Callable[[str], Path], columns: tuple[str, ...]
) -> None:
    """The differential test of the JVM provider: `format("mqstore")` with Spark pruning
    columns gives, column for column, what the Python source alone gives (which builds
    every column), on real RocketMQ stores, a generated one with V2, IPv6 and fillers, a
    damaged one read with includeCorrupt, and a live one cut at its flushed offset."""
    from mqstore.pipeline import source

    gen = tmp_path / "gen"
    storegen.write_store(
        gen, storegen.mixed_messages(300), segment_bytes=16384, v2_every=4, fillers={5, 90}
    )
    bad, _offsets = _damaged_store(tmp_path)
    live = tmp_path / "live"
    offsets = storegen.write_store(live, storegen.mixed_messages(200), segment_bytes=16384)
    storegen.write_flushed_offset(live, offsets[150] + 10)
    cases = [(real_store_copy(n), {}) for n in REAL] + [
        (gen, {"splitBytes": "3001", "maxRecordBytes": "4096"}),
        (bad, {"includeCorrupt": "true", "splitBytes": "5000", "maxRecordBytes": "4096"}),
        (live, {"splitBytes": "3000"}),
    ]
    for store, opts in cases:
        pruned = jobs.load(spark, str(store), opts).select(*columns)
        whole = spark.read.format(source.PYTHON_FORMAT_NAME).options(**opts).load(str(store))
        assert _scanned_columns(pruned) == [c for c in whole.columns if c in columns]
        got = sorted(map(repr, pruned.collect()))
        want = sorted(map(repr, whole.select(*columns).collect()))
        assert got == want and got, (store.name, opts)
        assert pruned.count() == whole.count()


def test_every_query_on_a_dataframe_reads_what_its_first_planned(
    spark: Any, tmp_path: Path
) -> None:
    """Whatever columns a later query reads, it reads the records of the DataFrame's first
    query: a live store's flushed offset moving on shows in a new DataFrame only."""
    root = tmp_path / "live"
    offsets = storegen.write_store(root, storegen.mixed_messages(300), segment_bytes=16384)
    storegen.write_flushed_offset(root, offsets[100])
    df = jobs.load(spark, str(root))
    assert df.select("msg_id").count() == 100
    storegen.write_flushed_offset(root, offsets[200])
    assert df.count() == 100
    assert len(df.select("body", "topic").collect()) == 100
    assert jobs.load(spark, str(root)).count() == 200


def test_live_store_stops_at_the_flushed_offset(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "live"
    offsets = storegen.write_store(root, storegen.mixed_messages(300), segment_bytes=16384)
    everything = expected(root)
    storegen.write_flushed_offset(root, offsets[200] + 10)  # inside record 200
    assert rows_of(spark, root, splitBytes="3000", maxRecordBytes="4096") == everything[:200]
    assert rows_of(spark, root, flushedOffset="false") == everything


def _damaged_store(tmp_path: Path) -> tuple[Path, list[int]]:
    root = tmp_path / "bad"
    msgs = [rec.Message(topic="T", body=b"body %d " % i * 8, queue_id=i % 2) for i in range(300)]
    offsets = storegen.write_store(root, msgs, segment_bytes=16384)
    seg = root / "commitlog" / f"{0:020d}"
    with open(seg, "r+b") as f:
        f.seek(offsets[30] + 90)
        f.write(b"\x00\x01")  # inside the body: CRC mismatch
        f.seek(offsets[60])
        f.write(struct.pack(">i", 3))  # TOTALSIZE: the record is unreadable
    return root, offsets


def test_audit_finds_the_corrupt_record_and_the_unreadable_range(
    spark: Any, tmp_path: Path
) -> None:
    root, offsets = _damaged_store(tmp_path)
    result = jobs.audit(spark, str(root), {"splitBytes": "5000", "maxRecordBytes": "4096"})
    assert not result.ok
    assert [(c.physical_offset, c.topic) for c in result.corrupt] == [
        (offsets[30], "T"),
        (offsets[60], None),
    ]
    assert result.corrupt[0].problem == "body CRC mismatch"
    assert result.corrupt[1].physical_offset + result.corrupt[1].size == offsets[61]
    assert result.records_checked == 299  # all but the unreadable one
    good = rows_of(spark, root)
    assert [r["physical_offset"] for r in good] == [
        o for i, o in enumerate(offsets) if i not in (30, 60)
    ]


def test_stats_and_query_jobs(spark: Any, mixed_store: Path) -> None:
    want = expected(mixed_store)
    st = jobs.stats(spark, str(mixed_store), 1000)
    per_queue = Counter((r["topic"], r["queue_id"]) for r in want)
    assert {(q.topic, q.queue_id): q.records for q in st.queues} == per_queue
    assert st.bytes == sum(r["size"] for r in want)
    assert sum(w.records for w in st.windows) == len(want)
    assert all(w.window_start_ms % 1000 == 0 for w in st.windows)

    hits = jobs.query(spark, str(mixed_store), topic="payments", key="order-3")
    assert [h["physical_offset"] for h in hits] == [
        r["physical_offset"]
        for r in want
        if r["topic"] == "payments" and "order-3" in (r["keys"] or "").split(" ")
    ]
    assert hits
    uniq = want[77]["properties"]["UNIQ_KEY"]
    by_uniq = jobs.query(spark, str(mixed_store), key=uniq)
    assert [h["physical_offset"] for h in by_uniq] == [want[77]["physical_offset"]]
    t0, t1 = want[10]["store_timestamp"], want[20]["store_timestamp"]
    timed = jobs.query(spark, str(mixed_store), from_ms=t0, to_ms=t1)
    assert [h["physical_offset"] for h in timed] == [r["physical_offset"] for r in want[10:21]]


def test_export_to_parquet_round_trips(spark: Any, mixed_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    done = jobs.export(spark, str(mixed_store), str(out))
    want = expected(mixed_store)
    assert done.rows == len(want)
    topics = {r["topic"] for r in want}
    assert {t for t, _d in done.partitions} == topics
    assert all(d == "2023-11-14" for _t, d in done.partitions)  # BASE_TS_MS is that UTC day
    back = spark.read.parquet(str(out)).drop("date").collect()
    assert by_offset(r.asDict(recursive=True) for r in back) == want


def test_export_counts_what_it_wrote_not_what_was_there(
    spark: Any, mixed_store: Path, tmp_path: Path
) -> None:
    """`append` reported the rows already under OUT as exported too, and `ignore` on an
    existing OUT reported a full export when it wrote nothing."""
    out = str(tmp_path / "export")
    n = len(expected(mixed_store))
    assert jobs.export(spark, str(mixed_store), out).rows == n
    again = jobs.export(spark, str(mixed_store), out, mode="append")
    assert again.rows == n and spark.read.parquet(out).count() == 2 * n
    skipped = jobs.export(spark, str(mixed_store), out, mode="ignore")
    assert (skipped.rows, skipped.partitions) == (0, [])
    assert spark.read.parquet(out).count() == 2 * n
    fresh = jobs.export(spark, str(mixed_store), str(tmp_path / "new"), mode="ignore")
    assert fresh.rows == n


def test_fillers_are_no_rows_in_any_job(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "fillers"
    dead = {3, 77, 150, 151, 298}  # producers that died after reserving
    msgs = storegen.mixed_messages(300)
    offsets = storegen.write_store(root, msgs, segment_bytes=16384, v2_every=7, fillers=dead)
    want = expected(root)
    assert [r["physical_offset"] for r in want] == [
        o for i, o in enumerate(offsets) if i not in dead
    ]
    assert rows_of(spark, root, splitBytes="3001", maxRecordBytes="4096") == want
    assert jobs.stats(spark, str(root), 1000).records == len(want)
    assert jobs.audit(spark, str(root)).records_checked == len(want)
    out = tmp_path / "export"
    assert jobs.export(spark, str(root), str(out)).rows == len(want)
    back = spark.read.parquet(str(out)).drop("date").collect()
    assert by_offset(r.asDict(recursive=True) for r in back) == want


def test_cli_jobs(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, offsets = _damaged_store(tmp_path)
    assert cli.main(["pipeline", "stats", str(root), "--json", "--window", "1s"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"] == 298 and {q["queue_id"] for q in doc["queues"]} == {0, 1}

    assert cli.main(["pipeline", "audit", str(root), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [c["physical_offset"] for c in doc["corrupt"]] == [offsets[30], offsets[60]]

    t = storegen.BASE_TS_MS + 7 * 5  # record 5's store time
    args = ["pipeline", "query", str(root), "--topic", "T", "--begin", str(t), "--end", str(t)]
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x)["physical_offset"] for x in lines] == [offsets[5]]
    assert cli.main(["pipeline", "query", str(root), "--begin", str(t + 1), "--end", str(t)]) == 2
    assert f"--begin {t + 1} is after --end {t}" in capsys.readouterr().err
    # a result cut at --limit says so, and how to get the rest; one that fits does not
    assert cli.main(["pipeline", "query", str(root), "--topic", "T", "--limit", "5"]) == 0
    cut = capsys.readouterr()
    assert len(cut.out.splitlines()) == 5
    assert "stopped at --limit 5; more records match: a larger --limit" in cut.err
    assert cli.main(["pipeline", "query", str(root), "--topic", "T", "--limit", "100000"]) == 0
    whole = capsys.readouterr()
    assert len(whole.out.splitlines()) > 5 and "--limit" not in whole.err
    # the old spelling still works, and says which to use
    assert cli.main(["pipeline", "query", str(root), "--from", str(t + 1), "--to", str(t)]) == 2
    err = capsys.readouterr().err
    assert "--from is deprecated, use --begin" in err and "is after --end" in err

    out = tmp_path / "pq"
    assert cli.main(["pipeline", "export", str(root), "--to", str(out)]) == 0
    assert "exported 298 records" in capsys.readouterr().out
    assert (out / "topic=T").is_dir()

    assert cli.main(["pipeline", "stats", str(tmp_path / "missing")]) == 2


def _clean_env() -> dict[str, str]:
    """The environment of a fresh shell: none of the variables Spark would need."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_cli_in_a_fresh_process_needs_no_setup(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    storegen.write_store(root, storegen.mixed_messages(50))
    res = subprocess.run(
        [sys.executable, "-m", "mqstore", "pipeline", "stats", str(root), "--json"],
        env=_clean_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["records"] == 50


def test_compressed_bodies_read_as_their_original_bytes(spark: Any, mixed_store: Path) -> None:
    """Through format("mqstore") (the JVM provider, pruned to three columns): every
    codec's body inflated, the codec named; a flagged body that does not inflate as stored."""
    df = jobs.load(spark, str(mixed_store)).where("topic = 'zipped'")
    rows = sorted(df.select("physical_offset", "body", "compression").collect())
    assert len(rows) == 21
    for i, r in enumerate(rows[:20]):
        assert (bytes(r.body), r.compression) == (
            b"squeeze me %d " % i * 20, ["zlib", "lz4", "zstd", "zlib"][i % 4],
        )  # fmt: skip
    assert bytes(rows[20].body) == b"not zlib"
    counts = {r.compression: r["count"] for r in df.groupBy("compression").count().collect()}
    assert counts == {"zlib": 11, "lz4": 5, "zstd": 5}
