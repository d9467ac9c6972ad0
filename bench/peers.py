"""The peers mqstore's put is measured against, each in its own producer processes.

    python -m bench peers [--quick]

Every peer writes 1 KiB bodies, one message per operation, and is timed the same way as
mqstore's puts (`bench.procs.run_producers`: forked producers, a start barrier, every
operation timed):

* `sqlite_full`, `sqlite_normal`: SQLite in WAL mode with `synchronous=FULL` / `NORMAL`;
  one row per message (key, body), one transaction per message (autocommit INSERT).
  Producer processes share one database file and wait on each other with `busy_timeout`.
* `lmdb_sync`, `lmdb_nosync`, `lmdb_writemap`: LMDB (`lmdb` package) with `sync=True`;
  `sync=False`; `writemap=True, sync=False`. One write transaction per message; each
  producer writes its own ascending keys.
* `fdatasync_append`: `os.write` of the message (an 8-byte length and key header and the
  body) to one file opened `O_APPEND` by every producer, then `os.fdatasync`, after
  every message.
* `disk_fdatasync`: the disk's own rate: `os.pwrite` of 4 KiB into an already written
  file, then `os.fdatasync`, at queue depth 1 (no file growth, so no metadata).
* `disk_seq_write`: `os.write` of 1 MiB blocks, then one `os.fdatasync` at the end;
  MB/s counts the fdatasync.

Everything is written under a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.options import Options
from bench.procs import FnProducer, Producer, RunResult, run_producers
from bench.report import LOAD_COLUMN, RATE_COLUMNS, Column, Report, latency_columns

BODY_BYTES = 1024
DISK_BLOCK_BYTES = 4096
SEQ_BLOCK_BYTES = 1024 * 1024
LMDB_MAP_BYTES = 64 * 1024**3  # sparse; the runs are time-bounded and capped below it


@dataclass(frozen=True)
class PeerPlan:
    """Producer counts per peer, and the time each run lasts."""

    duration_s: float
    producers: Mapping[str, Sequence[int]]
    seq_write_mib: int


FULL_PLAN = PeerPlan(
    duration_s=5.0,
    producers={
        "sqlite_full": (1, 4, 16),
        "sqlite_normal": (1, 4, 16),
        "lmdb_sync": (1, 4),
        "lmdb_nosync": (1, 4),
        "lmdb_writemap": (1, 2, 4),
        "fdatasync_append": (1, 4, 16, 64),
        "disk_fdatasync": (1,),
    },
    seq_write_mib=1024,
)

QUICK_PLAN = PeerPlan(
    duration_s=0.3,
    producers={
        "sqlite_full": (1, 2),
        "sqlite_normal": (1,),
        "lmdb_sync": (1,),
        "lmdb_nosync": (1,),
        "lmdb_writemap": (1, 2),
        "fdatasync_append": (1, 2),
        "disk_fdatasync": (1,),
    },
    seq_write_mib=32,
)

PEER_NAMES = (*FULL_PLAN.producers, "disk_seq_write")


# --- producers (run in the forked children) ---------------------------------------------


def _sqlite_producer(index: int, params: Mapping[str, Any]) -> Producer:
    db = sqlite3.connect(params["path"], isolation_level=None, timeout=60.0)
    db.execute("PRAGMA busy_timeout=60000")
    db.execute(f"PRAGMA synchronous={params['synchronous']}")
    body = os.urandom(BODY_BYTES)
    execute = db.execute
    sql = "INSERT INTO msgs(msg_key, body) VALUES (?, ?)"
    seq = 0

    def step() -> int:
        nonlocal seq
        execute(sql, (f"{index}-{seq}", body))  # autocommit: one transaction
        seq += 1
        return 1

    return FnProducer(step, db.close)


def _lmdb_producer(index: int, params: Mapping[str, Any]) -> Producer:
    import lmdb

    env = lmdb.open(
        params["path"],
        map_size=LMDB_MAP_BYTES,
        sync=params["sync"],
        metasync=params["sync"],
        writemap=params["writemap"],
        max_spare_txns=1,
    )
    body = os.urandom(BODY_BYTES)
    pack = struct.Struct(">HQ").pack
    begin = env.begin
    seq = 0

    def step() -> int:
        nonlocal seq
        with begin(write=True) as txn:
            txn.put(pack(index, seq), body)
        seq += 1
        return 1

    return FnProducer(step, env.close)


def _append_producer(index: int, params: Mapping[str, Any]) -> Producer:
    fd = os.open(params["path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    body = os.urandom(BODY_BYTES)
    head = struct.Struct(">IHH")
    write = os.write
    fdatasync = os.fdatasync
    seq = 0

    def step() -> int:
        nonlocal seq
        write(fd, head.pack(BODY_BYTES, index, seq & 0xFFFF) + body)
        fdatasync(fd)
        seq += 1
        return 1

    return FnProducer(step, lambda: os.close(fd))


def _disk_fdatasync_producer(index: int, params: Mapping[str, Any]) -> Producer:
    fd = os.open(params["path"], os.O_WRONLY)
    block = os.urandom(DISK_BLOCK_BYTES)
    blocks = int(params["file_bytes"]) // DISK_BLOCK_BYTES
    pwrite = os.pwrite
    fdatasync = os.fdatasync
    seq = 0

    def step() -> int:
        nonlocal seq
        pwrite(fd, block, (seq % blocks) * DISK_BLOCK_BYTES)
        fdatasync(fd)
        seq += 1
        return 1

    return FnProducer(step, lambda: os.close(fd))


# --- setup per peer (parent) ------------------------------------------------------------


def _prepare(peer: str, run_dir: Path) -> tuple[Any, dict[str, Any]]:
    if peer.startswith("sqlite"):
        path = run_dir / "peer.sqlite"
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")  # persistent in the file
        db.execute("CREATE TABLE msgs(id INTEGER PRIMARY KEY, msg_key TEXT, body BLOB)")
        db.close()
        sync = "FULL" if peer == "sqlite_full" else "NORMAL"
        return _sqlite_producer, {"path": str(path), "synchronous": sync}
    if peer.startswith("lmdb"):
        import lmdb

        path = run_dir / "peer.lmdb"
        writemap = peer == "lmdb_writemap"
        lmdb.open(str(path), map_size=LMDB_MAP_BYTES, writemap=writemap).close()
        return _lmdb_producer, {
            "path": str(path),
            "sync": peer == "lmdb_sync",
            "writemap": writemap,
        }
    if peer == "fdatasync_append":
        path = run_dir / "peer.log"
        path.touch()
        return _append_producer, {"path": str(path)}
    if peer == "disk_fdatasync":
        path = run_dir / "disk.bin"
        file_bytes = 16 * 1024 * 1024
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(file_bytes // SEQ_BLOCK_BYTES):
                os.write(fd, os.urandom(SEQ_BLOCK_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        return _disk_fdatasync_producer, {"path": str(path), "file_bytes": file_bytes}
    raise ValueError(f"unknown peer {peer!r}; known: {PEER_NAMES}")


def disk_seq_write(run_dir: Path, total_mib: int) -> RunResult:
    """Sequential write bandwidth: 1 MiB `os.write`s, one `os.fdatasync` at the end."""
    path = run_dir / "seq.bin"
    block = os.urandom(SEQ_BLOCK_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        for _ in range(total_mib):
            os.write(fd, block)
        t1 = time.perf_counter()
        os.fdatasync(fd)
        t2 = time.perf_counter()
    finally:
        os.close(fd)
        path.unlink()
    secs = t2 - t0
    return RunResult(
        name="disk_seq_write",
        producers=1,
        messages=total_mib,
        operations=total_mib,
        seconds=secs,
        msgs_per_s=total_mib / secs,
        mb_per_s=total_mib * SEQ_BLOCK_BYTES / secs / 1e6,
        lat_p50_us=0.0,
        lat_p99_us=0.0,
        lat_max_us=0.0,
        lat_mean_us=secs / total_mib * 1e6,
        body_bytes=SEQ_BLOCK_BYTES,
        extra={
            "write_s": round(t1 - t0, 4),
            "fdatasync_s": round(t2 - t1, 4),
            "load_1m": round(os.getloadavg()[0], 2),
        },
    )


def run_peer(peer: str, producers: int, duration_s: float, work_root: Path) -> RunResult:
    """One peer at one producer count, in a fresh directory under `work_root` (removed)."""
    run_dir = work_root / f"{peer}-{producers}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    try:
        factory, params = _prepare(peer, run_dir)
        body = DISK_BLOCK_BYTES if peer == "disk_fdatasync" else BODY_BYTES
        return run_producers(
            peer,
            factory,
            params,
            producers=producers,
            duration_s=duration_s,
            work_dir=run_dir / "procs",
            body_bytes=body,
        )
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run_peers(
    plan: PeerPlan,
    work_root: Path,
    only: Sequence[str] | None = None,
    log: Any = print,
) -> list[RunResult]:
    """Every peer of `plan` (or those in `only`), each at each of its producer counts."""
    results: list[RunResult] = []
    for peer, counts in plan.producers.items():
        if only is not None and peer not in only:
            continue
        for n in counts:
            r = run_peer(peer, n, plan.duration_s, work_root)
            log(f"  {peer:18} x{n:<3} {r.msgs_per_s:12,.0f} msgs/s  p99 {r.lat_p99_us:9.1f} µs")
            results.append(r)
    if only is None or "disk_seq_write" in only:
        run_dir = work_root / "disk_seq_write"
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            r = disk_seq_write(run_dir, plan.seq_write_mib)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        log(f"  {'disk_seq_write':18} x1   {r.mb_per_s:12,.0f} MB/s")
        results.append(r)
    return results


def best(results: Sequence[RunResult], name: str) -> RunResult | None:
    """The fastest run of peer `name` (the strictest reference for a goal)."""
    runs = [r for r in results if r.name == name]
    return max(runs, key=lambda r: r.msgs_per_s) if runs else None


# --- the `peers` benchmark of `python -m bench` -----------------------------------------

PEER_COLUMNS = [
    Column("name", "peer", "{}"),
    Column("producers", "producers", "{}"),
    *RATE_COLUMNS,
    *latency_columns(),
    Column("messages", "messages"),
    Column("seconds", "s", "{:.2f}"),
    LOAD_COLUMN,
]

PEER_METHOD = [
    "1 KiB bodies; each producer is its own process (fork), set up before a start barrier; "
    "every operation timed with perf_counter_ns.",
    "msgs/s = messages of all producers / (last end - first start); load 1m = the "
    "machine's 1-minute load average at the end of the run (other work adds noise).",
    "sqlite_*: WAL, one autocommit INSERT (key, body) per message, busy_timeout 60 s.",
    "lmdb_*: one write transaction per message; sync=True / sync=False / "
    "writemap=True with sync=False.",
    "fdatasync_append: O_APPEND write of header+body then fdatasync, per message.",
    "disk_fdatasync: pwrite 4 KiB into an already written 16 MiB file then fdatasync "
    "(queue depth 1); disk_seq_write: 1 MiB writes then one fdatasync (MB/s includes it).",
]


def peer_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        d = r.to_dict()
        d.update(r.extra)
        d["label"] = f"{r.name} x{r.producers}"
        d["color"] = (
            "tab:orange"
            if r.name.startswith("sqlite")
            else "tab:green"
            if r.name.startswith("lmdb")
            else "tab:gray"
        )
        if r.name == "disk_seq_write":  # MB/s is its figure; no per-message latency
            d.update(plot=False, lat_p50_us=None, lat_p99_us=None, lat_max_us=None)
        rows.append(d)
    return rows


def benchmark(opts: Options) -> Report:
    """Run every peer; the harness writes `peers.json`, `peers.md`, `peers.png`."""
    plan = QUICK_PLAN if opts.quick else FULL_PLAN
    if opts.duration_s is not None:
        plan = PeerPlan(opts.duration_s, plan.producers, plan.seq_write_mib)
    results = run_peers(plan, opts.work_root / "peers", log=opts.log)
    opts.shared["peers"] = results
    return Report(
        name="peers",
        title="Peers: SQLite, LMDB, fdatasync appends, the disk (1 KiB messages)",
        method=[f"{plan.duration_s:g} s per configuration.", *PEER_METHOD],
        columns=PEER_COLUMNS,
        rows=peer_rows(results),
        extra={"duration_s": plan.duration_s, "body_bytes": BODY_BYTES},
    )
