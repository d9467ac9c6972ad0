"""Smoke tests of the benchmarks: each peer, the producer runner, the report writer and
the harness run for a tiny duration, and their output has the promised structure.
Nothing here checks speed."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import bench_put, peers, put_report, store_run
from bench.__main__ import main as bench_main
from bench.procs import CDF_QUANTILES, BenchError, FnProducer, Producer, RunResult, run_producers
from bench.report import Column, Goal, Report, write

RUN_FIELDS = {
    "name",
    "producers",
    "messages",
    "operations",
    "seconds",
    "msgs_per_s",
    "mb_per_s",
    "lat_p50_us",
    "lat_p99_us",
    "lat_max_us",
    "body_bytes",
}


def _no_children() -> list[str]:
    """Our live descendants, but for multiprocessing's resource tracker, which lives as
    long as this interpreter once anything attached shared memory."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" not in cmd:
            out.append(f"{p.pid}: {cmd}")
    return out


def _count_producer(index: int, params: Mapping[str, Any]) -> Producer:
    return FnProducer(lambda: int(params["per_op"]))


def _failing_producer(index: int, params: Mapping[str, Any]) -> Producer:
    if index == 1:
        raise RuntimeError("setup failed on purpose")
    return FnProducer(lambda: 1)


def test_run_producers_counts_every_producer(tmp_path: Path) -> None:
    r = run_producers(
        "count",
        _count_producer,
        {"per_op": 3},
        producers=3,
        duration_s=0.05,
        work_dir=tmp_path / "w",
        body_bytes=10,
        max_messages=300,
    )
    assert r.producers == 3
    assert r.messages == 900  # capped: 300 per producer, 3 per operation
    assert r.operations == 300
    assert r.msgs_per_s > 0
    assert 0 <= r.lat_p50_us <= r.lat_p99_us <= r.lat_max_us
    # the CDF the report plots: one latency per quantile, non-decreasing, ending at max
    assert len(r.lat_cdf_us) == len(CDF_QUANTILES)
    assert r.lat_cdf_us == sorted(r.lat_cdf_us)
    assert r.lat_cdf_us[-1] == r.lat_max_us
    assert r.extra["load_1m"] >= 0
    assert list((tmp_path / "w").iterdir()) == []
    assert _no_children() == []


def test_run_producers_reports_a_failed_producer(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="setup failed on purpose"):
        run_producers(
            "fail",
            _failing_producer,
            {},
            producers=2,
            duration_s=0.05,
            work_dir=tmp_path / "w",
            body_bytes=1,
        )
    assert _no_children() == []


@pytest.mark.parametrize("peer", list(peers.QUICK_PLAN.producers))
def test_each_peer_runs_and_cleans_up(tmp_path: Path, peer: str) -> None:
    r = peers.run_peer(peer, 2, 0.1, tmp_path)
    d = r.to_dict()
    assert d.keys() >= RUN_FIELDS
    assert d["name"] == peer
    assert d["producers"] == 2
    assert d["messages"] > 0
    assert d["operations"] == d["messages"]  # one message per operation
    assert d["lat_p50_us"] > 0
    assert list(tmp_path.iterdir()) == []  # database, log and latency files removed
    assert _no_children() == []


def test_disk_seq_write(tmp_path: Path) -> None:
    r = peers.disk_seq_write(tmp_path, 4)
    assert r.messages == 4
    assert r.mb_per_s > 0
    assert set(r.extra) == {"write_s", "fdatasync_s", "load_1m"}
    assert list(tmp_path.iterdir()) == []


def test_report_writer(tmp_path: Path) -> None:
    rep = Report(
        name="demo",
        title="Demo",
        method=["a method line"],
        columns=[Column("label", "run", "{}"), Column("msgs_per_s", "msgs/s")],
        rows=[
            {"label": "fast", "msgs_per_s": 1234.5},
            {"label": "slow", "msgs_per_s": 10.0},
            {"label": "not drawn", "msgs_per_s": 1.0, "plot": False},
        ],
        goals=[
            Goal("fast >= 1000", 1234.5, 1000.0, "msgs/s"),
            Goal("latency <= 2 ms", 4000.0, 2000.0, "µs", higher_is_better=False),
            Goal("not measured", None, 5.0, "msgs/s"),
        ],
    )
    paths = write(rep, command="python -m bench demo", bench_dir=tmp_path, out_dir=tmp_path)
    doc = json.loads(paths["json"].read_text())
    assert doc["name"] == "demo"
    assert doc["command"] == "python -m bench demo"
    assert doc["git_commit"]
    for key in ("cpu_model", "cores", "ram_gib", "kernel", "filesystem", "python"):
        assert doc["machine"][key], key
    assert doc["machine"]["filesystem"] != "unknown"
    assert [g["met"] for g in doc["goals"]] == [True, False, None]
    assert [g["ratio"] for g in doc["goals"]] == [1.234, 0.5, None]
    md = paths["md"].read_text()
    assert "| run | msgs/s |" in md
    assert "| fast | 1,234 |" in md or "| fast | 1,235 |" in md
    assert "| fast >= 1000 |" in md and "**no**" in md
    assert "python -m bench demo" in md and doc["git_commit"] in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_harness_runs_peers_quick(tmp_path: Path) -> None:
    out = tmp_path / "out"
    work = tmp_path / "work"
    work.mkdir()
    code = bench_main(
        ["peers", "--quick", "--duration", "0.05", "--out", str(out), "--dir", str(work)]
    )
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["peers.json", "peers.md", "peers.png"]
    doc = json.loads((out / "peers.json").read_text())
    names = {r["name"] for r in doc["rows"]}
    assert names == set(peers.PEER_NAMES)
    for row in doc["rows"]:
        assert row.keys() >= RUN_FIELDS
    assert list(work.iterdir()) == []  # the temporary bench directory is gone
    assert _no_children() == []


def test_harness_rejects_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_main(["nonesuch", "--out", str(tmp_path)])


@pytest.mark.slow
def test_put_two_producers(tmp_path: Path) -> None:
    stores = [tmp_path / n / "store" for n in ("sync_pool-2", "async_pool-2", "batch_nopool-1")]
    for sync in (True, False):
        r = bench_put.put_run(tmp_path, sync=sync, pool=True, producers=2, duration_s=0.3)
        assert r.producers == 2
        assert r.messages > 0
        assert r.extra.get("errors") is None, r.extra
        assert r.extra["mode"] == ("sync" if sync else "async")
        if sync:
            assert r.extra["msgs_per_fsync"] >= 1.0
    b = bench_put.put_run(tmp_path, sync=False, pool=False, producers=1, duration_s=0.2, batch=8)
    assert b.messages == 8 * b.operations
    # only these stores' segments: other stores may run on the machine meanwhile
    prefixes = tuple(f"mqs-{store_run.store_hash(p)}-" for p in stores)
    assert [n for n in os.listdir("/dev/shm") if n.startswith(prefixes)] == []
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


def test_profile_put_scaling_counts_every_process(tmp_path: Path) -> None:
    """The CPU accounting covers the producers and the store's workers, by name, and
    its report's sum is theirs."""
    from bench import profile_put_scaling as ps

    res = ps.measure(tmp_path, 1, 0.5, True, 0)
    assert res["msgs"] > 0
    names = {k.rpartition("[")[0] or k for k in res["cpu_s"]}
    assert {"producers", "supervisor", "committer", "flusher", "dispatcher"} <= names
    assert res["cpu_s"]["producers"] > 0
    text = ps.report(res, 2)
    assert "µs/msg" in text and "at most" in text.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


def test_profile_sync_wake_floor_counts_every_way(tmp_path: Path) -> None:
    """`profile_sync --wake-floor`: every loop runs in 1 and in 2 processes, each row has
    a figure per pass, a sync put blocks about once per message, and nothing is left."""
    from bench import profile_sync

    text = profile_sync.wake_floor(tmp_path, 30, True, [1, 2], repeat=1)
    lines = text.splitlines()
    heads = [ln for ln in lines if ln.startswith("== ")]
    assert [h.split()[1] for h in heads] == ["1", "2"]
    for mode in profile_sync.WAKE_MODES:
        assert any(ln.startswith(f"  {mode}   switches") for ln in lines), mode
    sync_rows = [ln for ln in lines if ln.startswith("  sync put   switches")]
    assert len(sync_rows) == 2 and all(0.5 <= float(r.split()[-1]) <= 3 for r in sync_rows)
    rates = [ln for ln in lines if ln.strip().startswith("msgs/s")]
    assert len(rates) == 5 + 2 and all(float(r.split()[-1].replace(",", "")) > 0 for r in rates)
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


@pytest.mark.parametrize("mode", ["put", "batch"])
def test_profile_put_native_runs_and_cleans_up(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import profile_put_native

    argv = [mode, "--n", "256", "--reps", "1", "--warm", "256", "--dir", str(tmp_path)]
    assert profile_put_native.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{mode}: ") and "µs CPU/msg" in out
    prefix = f"mqs-{store_run.store_hash(tmp_path)}-"
    assert [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] == []


def _run(name: str, n: int, rate: float, p99: float = 100.0, **extra: Any) -> RunResult:
    return RunResult(name, n, int(rate), int(rate), 1.0, rate, rate / 1000, 1.0, p99, p99, 1.0,
                     1024, dict(extra))  # fmt: skip


def test_goals_compare_with_the_peer_at_the_same_count_and_lmdbs_best() -> None:
    peer_results = [
        _run("fdatasync_append", 1, 1000.0),
        _run("fdatasync_append", 16, 4000.0),
        _run("fdatasync_append", 64, 5000.0),
        _run("lmdb_writemap", 1, 100_000.0),
        _run("lmdb_writemap", 4, 120_000.0),
    ]
    runs = [
        _run("sync_pool", 16, 12_000.0, p99=1500.0, mode="sync", pool=True, batch=0),
        _run("sync_pool", 64, 19_000.0, mode="sync", pool=True, batch=0),
        _run("async_pool", 1, 150_000.0, mode="async", pool=True, batch=0),
        _run("async_pool", 4, 140_000.0, mode="async", pool=True, batch=0),
        _run("batch_pool", 1, 2e6, mode="async", pool=True, batch=128),
    ]
    goals = {g.name: g for g in put_report.goals(runs, peer_results, None)}
    g = goals["sync 16 (pool on) >= 2.5x write+fdatasync x16"]
    assert (g.measured, g.required, g.met) == (12_000.0, 10_000.0, True)
    assert "x16" in g.basis  # the peer with as many processes, not its best
    assert goals["sync 64 (pool on) >= 5x write+fdatasync x64"].met is False
    assert goals["sync 16 (pool on) p99 <= 2 ms"].met is True
    a1 = goals["async 1 (pool on) >= 1.5x LMDB writemap"]
    assert (a1.required, a1.met) == (150_000.0, True)
    a4 = goals["async 4 (pool on) >= 2x LMDB's best"]
    assert (a4.required, a4.met) == (240_000.0, False) and "x4" in a4.basis
    assert goals["sync 16 (pool off) >= 2.5x write+fdatasync x16"].met is None  # not measured
    (batch,) = [g for n, g in goals.items() if n.startswith("batch") and "(pool on)" in n]
    assert batch.met is True


def test_fsync_counters_from_status_json() -> None:
    doc = {"fsync": {"total": 200, "msgs_per_fsync": 4.5, "per_s": 1.0}}
    assert store_run.fsync_counters(doc) == (200, 900)
    assert store_run.fsync_counters({"x": {"fsync_count": 3, "fsync_msgs": 7}}) == (3, 7)
    assert store_run.fsync_counters({}) is None


@pytest.mark.slow
def test_aio_bench_runs_every_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench.bench_aio` at a tiny size: every way and shape measured, every put
    PUT_OK, the gather floor and the goals printed, its stores gone."""
    from bench import bench_aio

    argv = ["--n", "400", "--sync-n", "160", "--gather", "50", "--threads", "4"]
    bench_aio.main([*argv, "--no-save", "--dir", str(tmp_path)])  # speed goals: not here
    out = capsys.readouterr().out
    ways = [f"{s} {w}" for s in bench_aio.SHAPES for w in ("blocking", "awaited", "gathered")]
    for way in [*ways, "gather floor", "sync blocking x4 threads", "sync gathered"]:
        line = next((ln for ln in out.splitlines() if ln.startswith(way)), "")
        assert line.endswith("bad 0"), (way, out)
    assert "goals: README shape, awaited one by one" in out
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


def test_profile_sync_check_runs_the_checks_shape_and_cleans_up(tmp_path: Path) -> None:
    """`profile_sync_check`: the check's rate from the slowest client's loop, every put
    PUT_OK, the store's processes and the flusher's rounds listed, nothing left behind."""
    from bench import profile_sync_check

    text = profile_sync_check.run_one(tmp_path, 2, True, False, puts=50)
    lines = text.splitlines()
    assert lines[0].startswith("== 2 clients x 50 puts, pool on")
    assert "not PUT_OK 0; shm left 0" in lines[1]
    assert float(lines[1].split("rate ")[1].split()[0].replace(",", "")) > 0
    assert any(ln.strip().startswith("flusher ") for ln in lines)
    assert any(ln.startswith("  flusher: ") and " rounds, " in ln for ln in lines)
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


def test_profile_sync_check_adds_conf_lines(tmp_path: Path) -> None:
    """`--conf` lines reach the store's broker.conf: a known key runs, a key nobody
    knows stops the store from starting."""
    from bench import profile_sync_check

    text = profile_sync_check.run_one(
        tmp_path, 2, False, False, puts=20, conf_lines=("flusher_rt_priority=1",)
    )
    assert "not PUT_OK 0; shm left 0" in text.splitlines()[1]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="no_such_setting"):
        profile_sync_check.run_one(
            tmp_path, 2, False, False, puts=20, conf_lines=("no_such_setting=1",)
        )
    assert _no_children() == []


def test_futex_wake_cost_wakes_every_waiter_both_ways() -> None:
    """`futex_wake_cost`: every waiter asleep before each wake, one cost per round, the
    waiters gone afterwards."""
    from bench import futex_wake_cost

    for per_task in (False, True):
        costs = futex_wake_cost.run(3, 4, per_task)
        assert len(costs) == 4 and all(c > 0 for c in costs)
    assert _no_children() == []


def _perf_tracepoints() -> bool:
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("perf") is None:
        return False
    r = subprocess.run(
        ["perf", "stat", "-e", "block:block_rq_issue", "true"], capture_output=True, check=False
    )
    return r.returncode == 0


@pytest.mark.skipif(not _perf_tracepoints(), reason="needs root and perf's tracepoints")
def test_profile_sync_io_counts_a_rounds_writes_and_cleans_up(tmp_path: Path) -> None:
    """`profile_sync_io`: the mechanism's loop and a store's rounds are counted (every
    round one data write at least, the producer's faults, whose inodes were dirtied),
    and nothing is left behind."""
    from bench import profile_sync_io

    mech = profile_sync_io.mechanism(tmp_path, "apart", 50)
    assert mech[0].startswith("== mechanism, offset and queue files in block groups")
    assert "inode-table writes per fdatasync" in mech[1]
    lines = profile_sync_io.profile(tmp_path, False, "spread", 100)
    assert lines[0].startswith("== pool-off-spread: 100 puts, 1 producer")
    rounds = int(lines[1].split("flusher: ")[1].split()[0])
    assert 0 < rounds <= 100
    data = float(lines[1].split("data ")[1].split(",")[0])
    assert data > 0.5
    faults = next(ln for ln in lines if ln.startswith("  producer per put: "))
    assert float(faults.split(": ")[1].split()[0]) > 0.5  # pool off: it stores into the map
    assert any("commitlog/N (producer" in ln for ln in lines)
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


def test_ctlblock_stress_runs_a_cycle_and_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import ctlblock_stress

    argv = ["--minutes", "0.001", "--seconds", "1", "--segment-mib", "64", "--producers", "2"]
    assert ctlblock_stress.main([*argv, "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cycle 0 pool=True sync=False killed=False exit=0 puts={'PUT_OK': "), out
    assert out.endswith("1 cycles, 0 with damage, 'overwritten' or read-only\n"), out
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


def test_fsync_vs_plain_runs_both_ways_and_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fsync_vs_plain`: run-level (every plain kind and the round, ratios) and paired
    blocks (every block's rounds found in the flusher's trace, a ratio per plain kind);
    every sync put PUT_OK (it exits otherwise), nothing left behind."""
    from bench import fsync_vs_plain

    argv = ["--reps", "1", "--puts", "60", "--plain", "40", "--pool", "off"]
    assert fsync_vs_plain.main([*argv, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for label, *_ in fsync_vs_plain.PLAIN_KINDS:
        assert f"round, pool off / {label}: p50 " in out, out
    warm = next(ln for ln in out.splitlines() if "(warm-up" in ln)
    assert int(warm.split("bytes/round")[0].split()[-1].replace(",", "")) > 1024
    argv = ["--blocks", "2", "--per-block", "30", "--pool", "on"]
    assert fsync_vs_plain.main([*argv, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head = next(ln for ln in out.splitlines() if " paired, 2 blocks of 30" in ln)
    rounds = int(head.split("round, pool on: ")[1].split()[0])
    assert 0 < rounds <= 60, head
    for label, *_ in fsync_vs_plain.PAIRED_KINDS:
        assert f"  plain {label}" in out and "round / plain per block: p50 median" in out
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


@pytest.mark.skipif(not _perf_tracepoints(), reason="needs root and perf's tracepoints")
def test_fsync_vs_plain_perf_splits_every_loops_fdatasyncs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--blocks --perf`: a breakdown for the round and each plain loop, each with a data
    write in most fdatasyncs (not all: a paced loop once showed 0.98 data writes per
    fdatasync over 60, not traced further)."""
    from bench import fsync_vs_plain

    argv = ["--blocks", "2", "--per-block", "30", "--pool", "on", "--perf"]
    assert fsync_vs_plain.main([*argv, "--dir", str(tmp_path)]) == 0
    why = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  breakdown, ")]
    assert len(why) == 1 + len(fsync_vs_plain.PAIRED_KINDS), why
    for ln in why:
        assert "device p50" in ln, ln
        assert float(ln.split("per fdatasync ")[1].split()[0]) > 0.5, ln
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


@pytest.mark.skipif(not _perf_tracepoints(), reason="needs root and perf's tracepoints")
def test_mgtime_dirtyings_counts_the_loops_inode(tmp_path: Path) -> None:
    """`mgtime_dirtyings`: the loop's file is dirtied at least once in every case (its
    first write lands in a later tick than the file was made), the helper is gone."""
    from bench import mgtime_dirtyings

    for mode in mgtime_dirtyings.HELPERS:
        line = mgtime_dirtyings.one(tmp_path, mode, 50)
        assert line.startswith(mode), line
        assert float(line.split("dirtied ")[1].split()[0]) > 0, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert _no_children() == []


def test_put_procs_cpu_counts_every_process_and_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench.put_procs_cpu`: a figure per process of the store and the producer for each
    shape, every round's row in the JSON, and nothing left behind."""
    from bench import put_procs_cpu

    out_json = tmp_path / "rows.json"
    shapes = ("readme", "properties", "batch128")
    argv = ["--rounds", "2", "--n", "512", "--shapes", ",".join(shapes), "--settle", "0"]
    assert put_procs_cpu.main([*argv, "--dir", str(tmp_path), "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines[1:]] == list(shapes)
    rows = json.loads(out_json.read_text())
    for shape in shapes:
        assert len(rows[shape]) == 2
        for row in rows[shape]:
            for name in ("producer", "supervisor", "committer", "dispatcher", "flusher"):
                assert row[name] >= 0 and name + ".cs" in row and name + ".flt" in row
            assert row["producer"] > 0 and row["rate"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]
    assert _no_children() == []


def test_put_shapes_windows_reports_every_window_and_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench.put_shapes_windows`: a line per shape per round in the order asked, with the
    backlog at its start and the committer's CPU in it, the best-of-rounds ratios, and
    nothing left behind."""
    from bench import put_shapes_windows

    argv = ["--n", "500", "--rounds", "2", "--order", "readme,str_key", "--dir", str(tmp_path)]
    assert put_shapes_windows.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("run 1: load"), lines
    windows = [ln.split()[:2] for ln in lines[1:-1]]
    assert windows == [["r0", "readme"], ["r0", "str_key"], ["r1", "readme"], ["r1", "str_key"]]
    for ln in lines[1:-1]:
        assert "at start: commit" in ln and "CPU ms in window: committer" in ln, ln
    assert lines[-1].strip().startswith("best of rounds, ratio to str_key: readme"), lines[-1]
    assert "str_key" in lines[-1] and "(1.00)" in lines[-1]
    assert list(tmp_path.iterdir()) == []
    assert _no_children() == []


def test_put_shapes_windows_times_a_stage_catching_up() -> None:
    """`_caught`: the first sample at or after the window's start whose column reached
    the target, in ms from the start; never reached is infinite."""
    from bench.put_shapes_windows import _caught

    samples = [(10.0, 100, 50, 40), (10.002, 120, 90, 60), (10.005, 150, 120, 100)]
    assert _caught(samples, 10.0, 2, 50) == 0.0
    assert abs(_caught(samples, 10.0, 2, 100) - 5.0) < 1e-6
    assert abs(_caught(samples, 10.001, 3, 60) - 1.0) < 1e-6
    assert _caught(samples, 10.0, 3, 101) == float("inf")
