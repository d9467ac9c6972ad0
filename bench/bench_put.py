"""mqstore's put, through the public client, against the peers of the same run.

    python -m bench put [--quick] [--duration S] [--producers 1,2,4,16,64]

For each configuration a fresh store is started (`mqstore start DIR --config F`, a
foreground process) under the bench's temporary directory, measured, stopped with
SIGTERM, and removed:

* `sync` (SYNC_FLUSH, `wait_store=True`) and `async` (ASYNC_FLUSH), each with the write
  pool on and off, at 1, 2, 4, 16 and 64 producer processes;
* `batch`: `put_batch` of `BATCH` messages from one producer (async, pool on and off).

Every put goes through `StoreClient.put(topic, body, tags=..., keys=...)`: the client
encodes the record (a 1 KiB body, tag `TagA`, a key unique to each message) and returns
a `PutResult`; a status other than PUT_OK counts as an error, not as a message.
Messages per fsync come from the flusher's counters (`mqstore status --json`), read
before and after each sync run.

Memory, measured in the same run:
* `client_rss`: a fresh interpreter imports `mqstore`, notes its RSS, attaches, puts
  1000 messages, notes its RSS again (USS too: RSS counts the pool pages it touched);
* `server_rss`: the supervisor's and its workers' RSS (and USS) after 0.25 GiB and
  after 2 GiB appended (quick: 16 and 64 MiB);
* `shm`: every /dev/shm file that appeared after `mqstore start`, against the pool size
  (buffers x segment size) plus the control block.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.options import Options
from bench.peers import (
    FULL_PLAN,
    QUICK_PLAN,
    PeerPlan,
    best,
    peer_rows,
    run_peers,
)
from bench.procs import BenchError, FnProducer, Producer, RunResult, run_producers
from bench.report import Column, Goal, Report

BODY_BYTES = 1024
TOPIC = "BenchTopic"
TAGS = "TagA"
BATCH = 128
PRODUCERS = (1, 2, 4, 16, 64)
REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 120.0
GOAL_PEERS = ("sqlite_full", "fdatasync_append", "lmdb_writemap")


def _api() -> tuple[Any, Any]:
    """(StoreClient, PutMessageStatus), imported when used: listing or running the peers
    alone does not load the store's C extension."""
    mod = importlib.import_module("mqstore")
    return mod.StoreClient, mod.PutMessageStatus


# --- the store under test ---------------------------------------------------------------


@dataclass
class StoreRun:
    """One running store: its directory, supervisor process and the shm it created."""

    store_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    shm_before: frozenset[str]


def _mqstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "mqstore", *args]


def _shm_names(store_dir: Path | None = None) -> frozenset[str]:
    """Names in /dev/shm; with `store_dir`, only that store's (the runtime names every
    segment `mqs-<hash of the store's real path>-...`), so that other stores running on
    the machine are neither counted nor touched."""
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return frozenset()
    if store_dir is None:
        return frozenset(names)
    prefix = f"mqs-{store_hash(store_dir)}-"
    return frozenset(n for n in names if n.startswith(prefix))


def store_hash(store_dir: Path) -> str:
    """The runtime's stem for this store's shared memory (`ipc.control.store_hash`)."""
    control = importlib.import_module("mqstore.ipc.control")
    h: str = control.store_hash(store_dir)
    return h


def write_config(path: Path, *, sync: bool, pool: bool, extra: Mapping[str, Any]) -> None:
    lines = [
        "[store]",
        f'flush_disk_type = "{"SYNC_FLUSH" if sync else "ASYNC_FLUSH"}"',
        f"transient_store_pool_enable = {'true' if pool else 'false'}",
    ]
    for k, v in extra.items():
        lines.append(f"{k} = {json.dumps(v)}")
    path.write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def running_store(
    root: Path, name: str, *, sync: bool, pool: bool, extra: Mapping[str, Any] | None = None
) -> Iterator[StoreRun]:
    """Start a fresh store under `root/name`, yield it, stop it (SIGTERM) and remove it.

    Raises BenchError if the store does not come up, or does not stop cleanly; any
    /dev/shm file it left behind is removed and reported.
    """
    StoreClient, _ = _api()
    base = root / name
    shutil.rmtree(base, ignore_errors=True)
    store_dir = base / "store"
    store_dir.mkdir(parents=True)
    cfg = base / "bench.toml"
    write_config(cfg, sync=sync, pool=pool, extra=extra or {})
    log_path = base / "supervisor.log"
    shm_before = _shm_names(store_dir)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            _mqstore("start", str(store_dir), "--config", str(cfg)),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    run = StoreRun(store_dir, proc, log_path, shm_before)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise BenchError(
                    f"mqstore start exited with {proc.returncode}:\n{log_path.read_text()}"
                )
            try:
                with StoreClient.attach(store_dir):
                    break
            except Exception as e:
                if time.monotonic() > deadline:
                    raise BenchError(f"store did not come up in {START_TIMEOUT_S} s: {e}") from e
                time.sleep(0.05)
        yield run
    finally:
        problems = _stop(run)
        shutil.rmtree(base, ignore_errors=True)
    if problems:
        raise BenchError(f"{name}: {problems}")


def _stop(run: StoreRun) -> str:
    """SIGTERM the supervisor, wait for it, kill it (by pid) if it overstays; clean shm."""
    problems = []
    proc = run.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            problems.append(f"supervisor {proc.pid} did not stop in {STOP_TIMEOUT_S} s; killed")
            _kill_tree(proc.pid)
            proc.wait(timeout=30)
    if proc.returncode not in (0, None) and not problems:
        tail = run.log_path.read_text(errors="replace")[-2000:] if run.log_path.exists() else ""
        problems.append(f"supervisor exited with {proc.returncode}:\n{tail}")
    left = sorted(_shm_names(run.store_dir) - run.shm_before)
    for n in left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join("/dev/shm", n))
    if left:
        problems.append(f"/dev/shm left behind (removed): {left}")
    return "; ".join(problems)


def _kill_tree(pid: int) -> None:
    try:
        parent = psutil.Process(pid)
        procs = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def status(store_dir: Path) -> dict[str, Any]:
    """`mqstore status DIR --json`, parsed ({} if the command is not there or fails)."""
    out = subprocess.run(
        _mqstore("status", str(store_dir), "--json"),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    if out.returncode != 0:
        return {}
    try:
        doc: dict[str, Any] = json.loads(out.stdout)
    except json.JSONDecodeError:
        return {}
    return doc


def fsync_counters(doc: Mapping[str, Any]) -> tuple[int, int] | None:
    """(fsyncs, messages covered by them) from a status document, wherever it keeps them."""
    found: dict[str, int] = {}

    def walk(d: Any) -> None:
        if isinstance(d, Mapping):
            for k, v in d.items():
                if k in ("fsync_count", "fsync_msgs") and isinstance(v, int):
                    found.setdefault(k, v)
                else:
                    walk(v)

    walk(doc)
    if "fsync_count" in found and "fsync_msgs" in found:
        return found["fsync_count"], found["fsync_msgs"]
    fs = doc.get("fsync")
    if isinstance(fs, Mapping) and isinstance(fs.get("total"), int):
        # `mqstore status --json`: {"fsync": {"total": n, "msgs_per_fsync": m, ...}}
        n = int(fs["total"])
        return n, round(n * float(fs.get("msgs_per_fsync", 0.0)))
    return None


def tree_memory(pid: int, store_dir: Path | None = None) -> dict[str, int]:
    """Memory (bytes) summed over the process `pid` and all its descendants.

    `rss` and `uss` as psutil gives them; `rss` split by mapping into `rss_shm` (this
    store's shared memory: the pool and the control block, bounded by the pool size and
    resident once first touched), `rss_store_files` (mapped files under `store_dir`) and
    `rss_other` (heap, interpreter, libraries: what would show a leak).
    """
    out = {"rss": 0, "uss": 0, "rss_shm": 0, "rss_store_files": 0, "rss_other": 0}
    out["processes"] = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    shm_prefix = f"/dev/shm/mqs-{store_hash(store_dir)}-" if store_dir else "/dev/shm/mqs-"
    store_prefix = os.path.realpath(store_dir) + "/" if store_dir else None
    for p in procs:
        try:
            info = p.memory_full_info()
            maps = p.memory_maps(grouped=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out["rss"] += info.rss
        out["uss"] += info.uss
        out["processes"] += 1
        shm = files = 0
        for m in maps:
            if m.path.startswith(shm_prefix):
                shm += m.rss
            elif store_prefix and m.path.startswith(store_prefix):
                files += m.rss
        out["rss_shm"] += shm
        out["rss_store_files"] += files
        out["rss_other"] += info.rss - shm - files
    return out


# --- producers (run in the forked children) ---------------------------------------------


def _put_producer(index: int, params: Mapping[str, Any]) -> Producer:
    StoreClient, PutMessageStatus = _api()
    stack = contextlib.ExitStack()
    client = stack.enter_context(StoreClient.attach(params["store_dir"]))
    body = os.urandom(BODY_BYTES)
    wait_store = bool(params["wait_store"])
    unique = bool(params.get("unique_keys", True))
    put = client.put
    ok = PutMessageStatus.PUT_OK
    errors: dict[str, int] = {}
    first_error: list[str] = []
    seq = 0

    def step() -> int:
        nonlocal seq
        key = f"k{index}-{seq}" if unique else f"k{index}"
        r = put(TOPIC, body, tags=TAGS, keys=key, wait_store=wait_store)
        seq += 1
        if r.status is ok:
            return 1
        errors[r.status.name] = errors.get(r.status.name, 0) + 1
        if not first_error:
            first_error.append(f"{r.status.name}: {r.reason}")
        return 0

    def close() -> None:
        stack.close()
        if errors:
            (Path(params["errors_dir"]) / f"put-errors-{index}.json").write_text(
                json.dumps({"errors": errors, "first": first_error})
            )

    return FnProducer(step, close)


def _batch_producer(index: int, params: Mapping[str, Any]) -> Producer:
    StoreClient, PutMessageStatus = _api()
    stack = contextlib.ExitStack()
    client = stack.enter_context(StoreClient.attach(params["store_dir"]))
    body = os.urandom(BODY_BYTES)
    size = int(params["batch"])
    unique = bool(params.get("unique_keys", True))
    put_batch = client.put_batch
    ok = PutMessageStatus.PUT_OK
    errors: dict[str, int] = {}
    first_error: list[str] = []
    seq = 0

    def step() -> int:
        nonlocal seq
        msgs = [
            {
                "topic": TOPIC,
                "body": body,
                "tags": TAGS,
                "keys": f"k{index}-{seq + i}" if unique else f"k{index}",
            }
            for i in range(size)
        ]
        seq += size
        done = 0
        for r in put_batch(msgs):
            if r.status is ok:
                done += 1
            else:
                errors[r.status.name] = errors.get(r.status.name, 0) + 1
                if not first_error:
                    first_error.append(f"{r.status.name}: {r.reason}")
        return done

    def close() -> None:
        stack.close()
        if errors:
            (Path(params["errors_dir"]) / f"put-errors-{index}.json").write_text(
                json.dumps({"errors": errors, "first": first_error})
            )

    return FnProducer(step, close)


def _collect_errors(errors_dir: Path) -> dict[str, Any]:
    total: dict[str, int] = {}
    first: list[str] = []
    for p in sorted(errors_dir.glob("put-errors-*.json")):
        doc = json.loads(p.read_text())
        for k, v in doc["errors"].items():
            total[k] = total.get(k, 0) + int(v)
        first += doc["first"]
        p.unlink()
    return {"errors": total, "first_error": first[0] if first else ""} if total else {}


# --- runs -------------------------------------------------------------------------------


def put_run(
    root: Path,
    *,
    sync: bool,
    pool: bool,
    producers: int,
    duration_s: float,
    batch: int = 0,
    unique_keys: bool = True,
    extra: Mapping[str, Any] | None = None,
    tag: str = "",
) -> RunResult:
    """One configuration on a fresh store (`extra`: more store settings; `tag` tells
    runs that differ only in them apart)."""
    mode = "sync" if sync else "async"
    name = f"{'batch' if batch else mode}_{'pool' if pool else 'nopool'}{tag}"
    with running_store(root, f"{name}-{producers}", sync=sync, pool=pool, extra=extra) as store:
        before = fsync_counters(status(store.store_dir)) if sync else None
        work = store.store_dir.parent / "procs"
        params = {
            "store_dir": str(store.store_dir),
            "wait_store": True,
            "batch": batch,
            "errors_dir": str(work),
            "unique_keys": unique_keys,
        }
        r = run_producers(
            name,
            _batch_producer if batch else _put_producer,
            params,
            producers=producers,
            duration_s=duration_s,
            work_dir=work,
            body_bytes=BODY_BYTES,
        )
        r.extra.update(_collect_errors(work))
        if sync:
            after = fsync_counters(status(store.store_dir))
            if before is not None and after is not None and after[0] > before[0]:
                fsyncs = after[0] - before[0]
                r.extra["fsyncs"] = fsyncs
                r.extra["msgs_per_fsync"] = round((after[1] - before[1]) / fsyncs, 2)
                r.extra["fsyncs_per_s"] = round(fsyncs / r.seconds, 1)
        r.extra.update({"mode": mode, "pool": pool, "batch": batch, "unique_keys": unique_keys})
    return r


_CLIENT_RSS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil
    me = psutil.Process()
    from mqstore import StoreClient
    bare = me.memory_full_info()
    body = os.urandom(1024)
    with StoreClient.attach(sys.argv[1]) as c:
        attached = me.memory_full_info()
        for i in range(int(sys.argv[2])):
            c.put("BenchTopic", body, tags="TagA", keys=f"k{i}")
        used = me.memory_full_info()
        n = int(sys.argv[3])
        t0 = time.thread_time()
        for i in range(n):
            c.put("BenchTopic", body, tags="TagA", keys=f"c{i}", wait_store=False)
        cpu = time.thread_time() - t0
    print(json.dumps({
        "bare_rss": bare.rss, "bare_uss": bare.uss,
        "attached_rss": attached.rss, "attached_uss": attached.uss,
        "after_puts_rss": used.rss, "after_puts_uss": used.uss,
        "cpu_per_put_us": cpu / n * 1e6, "cpu_puts": n,
    }))
    """
)


def client_memory(store_dir: Path, puts: int = 1000, cpu_puts: int = 50_000) -> dict[str, Any]:
    """RSS of a fresh client after `puts` puts, then its CPU per put over `cpu_puts` more
    (thread CPU time: the producer's own cost, not the store's)."""
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT_RSS_SCRIPT, str(store_dir), str(puts), str(cpu_puts)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    if out.returncode != 0:
        raise BenchError(f"client memory probe failed:\n{out.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    doc["puts"] = puts
    doc["rss_above_bare"] = doc["after_puts_rss"] - doc["bare_rss"]
    doc["uss_above_bare"] = doc["after_puts_uss"] - doc["bare_uss"]
    doc["attach_rss_above_bare"] = doc["attached_rss"] - doc["bare_rss"]
    return doc


def server_memory(root: Path, marks_bytes: Sequence[int], *, pool: bool) -> dict[str, Any]:
    """Supervisor + workers memory after each mark of bytes appended; shm in use."""
    out: dict[str, Any] = {"marks": []}
    with running_store(root, f"memory-{'pool' if pool else 'nopool'}", sync=False, pool=pool) as s:
        new_shm = sorted(_shm_names(s.store_dir) - s.shm_before)
        sizes = {n: os.stat(os.path.join("/dev/shm", n)).st_size for n in new_shm}
        ctl = sum(v for n, v in sizes.items() if n.endswith("-ctl"))
        pool_bytes = sum(v for n, v in sizes.items() if n.endswith("-pool"))
        out["shm"] = {
            "files": sizes,
            "total_bytes": sum(sizes.values()),
            "control_block_bytes": ctl,
            "pool_bytes": pool_bytes,
            "other_bytes": sum(sizes.values()) - ctl - pool_bytes,
        }
        out["shm"]["allocated_bytes"] = sum(
            os.stat(os.path.join("/dev/shm", n)).st_blocks * 512 for n in new_shm
        )
        out["client"] = client_memory(s.store_dir)
        work = s.store_dir.parent / "procs"
        record = BODY_BYTES + 150  # a little more than the encoded size: marks are minimums
        written = 0
        for mark in marks_bytes:
            todo = max(0, -(-(mark - written) // record))
            r = run_producers(
                "memory-fill",
                _batch_producer,
                {
                    "store_dir": str(s.store_dir),
                    "batch": BATCH,
                    "errors_dir": str(work),
                    "unique_keys": False,  # the fill only needs bytes in the log
                },
                producers=1,
                duration_s=3600.0,
                work_dir=work,
                body_bytes=BODY_BYTES,
                max_messages=todo,
            )
            errs = _collect_errors(work)
            if errs:
                raise BenchError(f"memory fill: puts failed: {errs}")
            written += r.messages * record
            mem = tree_memory(s.proc.pid, s.store_dir)
            out["marks"].append({"appended_bytes_at_least": written, **mem})
    return out


# --- the `put` benchmark of `python -m bench` -------------------------------------------


PUT_COLUMNS = [
    Column("label", "run", "{}"),
    Column("producers", "producers", "{}"),
    Column("msgs_per_s", "msgs/s"),
    Column("mb_per_s", "MB/s", "{:,.1f}"),
    Column("lat_p50_us", "p50 µs", "{:,.1f}"),
    Column("lat_p99_us", "p99 µs", "{:,.1f}"),
    Column("lat_max_us", "max µs", "{:,.0f}"),
    Column("msgs_per_fsync", "msgs/fsync", "{:,.1f}"),
    Column("fsyncs_per_s", "fsyncs/s", "{:,.0f}"),
    Column("errors", "errors", "{}"),
    Column("messages", "messages"),
    Column("load_1m", "load 1m", "{:.1f}"),
]


def _row(r: RunResult) -> dict[str, Any]:
    d = r.to_dict()
    d.update(r.extra)
    mode = "batch" if r.extra.get("batch") else str(r.extra.get("mode"))
    d["label"] = f"mqstore {mode} {'pool' if r.extra.get('pool') else 'no pool'}"
    if r.extra.get("batch"):
        d["label"] += f" ({r.extra['batch']}/call)"
    d["errors"] = sum(r.extra.get("errors", {}).values()) or ""
    d["color"] = {"sync": "tab:red", "async": "tab:blue", "batch": "tab:purple"}[mode]
    return d


def _find(rs: Sequence[RunResult], mode: str, pool: bool, n: int) -> RunResult | None:
    for r in rs:
        same = r.extra.get("mode") == mode and r.extra.get("pool") == pool
        if same and r.producers == n and not r.extra.get("batch"):
            return r
    return None


def goals(
    runs: Sequence[RunResult], peer_results: Sequence[RunResult], mem: Mapping[str, Any] | None
) -> list[Goal]:
    """Issue 12's goals. Async against LMDB writemap (sync off, one txn per put): its
    figure at 1 producer, and its best; sync against per-message write+fdatasync appends
    by as many processes as mqstore's producers."""
    out: list[Goal] = []
    lw_best = best(peer_results, "lmdb_writemap")

    def peer_at(name: str, n: int) -> RunResult | None:
        return next((p for p in peer_results if p.name == name and p.producers == n), None)

    def basis(p: RunResult | None, what: str = "") -> str:
        if p is None:
            return "peer not measured"
        return f"{p.name} x{p.producers} = {p.msgs_per_s:,.0f} msgs/s{what}"

    def rate(r: RunResult | None) -> float | None:
        return None if r is None else r.msgs_per_s

    def times(p: RunResult | None, k: float) -> float | None:
        return None if p is None else k * p.msgs_per_s

    for pool in (True, False):
        tag = "pool on" if pool else "pool off"
        lw1 = peer_at("lmdb_writemap", 1)
        out.append(
            Goal(
                f"async 1 ({tag}) >= 1.5x LMDB writemap",
                rate(_find(runs, "async", pool, 1)),
                times(lw1, 1.5),
                "msgs/s",
                basis=basis(lw1),
            )
        )
        for n in (2, 4):
            out.append(
                Goal(
                    f"async {n} ({tag}) >= 2x LMDB's best",
                    rate(_find(runs, "async", pool, n)),
                    times(lw_best, 2),
                    "msgs/s",
                    basis=basis(lw_best, " (its best)"),
                )
            )
        for n, k in ((1, 0.9), (16, 2.5), (64, 5.0)):
            fd = peer_at("fdatasync_append", n)
            out.append(
                Goal(
                    f"sync {n} ({tag}) >= {k:g}x write+fdatasync x{n}",
                    rate(_find(runs, "sync", pool, n)),
                    times(fd, k),
                    "msgs/s",
                    basis=basis(fd),
                )
            )
        s16 = _find(runs, "sync", pool, 16)
        out.append(
            Goal(
                f"sync 16 ({tag}) p99 <= 2 ms",
                None if s16 is None else s16.lat_p99_us,
                2000.0,
                "µs",
                higher_is_better=False,
            )
        )
    for r in runs:
        if r.extra.get("batch"):
            tag = "pool on" if r.extra.get("pool") else "pool off"
            out.append(
                Goal(
                    f"batch of {BATCH}, 1 producer ({tag}) >= 1M msgs/s",
                    r.msgs_per_s,
                    1e6,
                    "msgs/s",
                )
            )
    if mem is not None:
        mib = 1024 * 1024
        c = mem["client"]
        if "cpu_per_put_us" in c:
            out.append(
                Goal(
                    "client CPU per async put <= 2 µs",
                    c["cpu_per_put_us"],
                    2.0,
                    "µs",
                    higher_is_better=False,
                    basis=f"thread CPU over {c['cpu_puts']:,} puts with wait_store=False, "
                    "1 KiB body, tag, unique key",
                )
            )
        out.append(
            Goal(
                "client RSS above bare import <= 15 MiB",
                c["rss_above_bare"] / mib,
                15.0,
                "MiB",
                higher_is_better=False,
                basis=f"after attach + {c['puts']} puts; USS above bare "
                f"{c['uss_above_bare'] / mib:.1f} MiB",
            )
        )
        marks = mem["marks"]
        if len(marks) >= 2:
            lo, hi = marks[0], marks[-1]
            at = (
                f"at {hi['appended_bytes_at_least'] / 2**30:.2f} GiB vs 1.1x at "
                f"{lo['appended_bytes_at_least'] / 2**30:.2f} GiB appended"
            )
            for kind, what in (
                ("rss", "RSS"),
                ("rss_other", "RSS outside the pool's shm and the store's mapped files"),
            ):
                out.append(
                    Goal(
                        f"supervisor+workers {what} does not grow with data",
                        hi[kind] / mib,
                        1.1 * lo[kind] / mib,
                        "MiB",
                        higher_is_better=False,
                        basis=f"{at} (10% allowed for noise); shm "
                        f"{lo['rss_shm'] / mib:.0f} -> {hi['rss_shm'] / mib:.0f} MiB, mapped "
                        f"store files {lo['rss_store_files'] / mib:.0f} -> "
                        f"{hi['rss_store_files'] / mib:.0f} MiB",
                    )
                )
        shm = mem["shm"]
        out.append(
            Goal(
                "/dev/shm in use <= pool + control block",
                shm["total_bytes"] / mib,
                (shm["pool_bytes"] + shm["control_block_bytes"]) / mib,
                "MiB",
                higher_is_better=False,
                basis=f"pool {shm['pool_bytes'] / mib:.0f} MiB + control block "
                f"{shm['control_block_bytes'] / mib:.2f} MiB; other files "
                f"{shm['other_bytes']} B",
            )
        )
    return out


def plot_put(report: Report, path: Path) -> None:
    """Left: msgs/s against producers per mode, with the peers' best rates as lines and
    batch as points. Right: p99 latency against producers, with the 2 ms goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if str(r.get("label", "")).startswith("mqstore")]
    series: dict[str, list[tuple[int, float, float]]] = {}
    for r in rows:
        if r.get("batch"):
            continue
        series.setdefault(str(r["label"]), []).append(
            (int(r["producers"]), float(r["msgs_per_s"]), float(r["lat_p99_us"]))
        )
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    styles = {
        "mqstore sync pool": ("tab:red", "-"),
        "mqstore sync no pool": ("tab:red", "--"),
        "mqstore async pool": ("tab:blue", "-"),
        "mqstore async no pool": ("tab:blue", "--"),
    }
    for label, pts in series.items():
        pts.sort()
        color, ls = styles.get(label, ("black", ":"))
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], marker="o", color=color, ls=ls, label=label)
        ax2.plot(xs, [p[2] / 1000 for p in pts], marker="o", color=color, ls=ls, label=label)
    batches = [r for r in rows if r.get("batch")]
    for i, r in enumerate(batches):
        y = float(r["msgs_per_s"])
        ax.scatter([1], [y], marker="*", s=120, color="tab:purple", zorder=5)
        ax.annotate(
            f"{r['label'][8:]} {y:,.0f}",
            (1, y),
            xytext=(8, 10 - 12 * i),
            textcoords="offset points",
            fontsize=7,
            color="tab:purple",
        )
    counts = sorted({p[0] for pts in series.values() for p in pts})
    peer_colors = {"sqlite_full": "tab:orange", "fdatasync_append": "tab:gray"}
    peer_colors["lmdb_writemap"] = "tab:green"
    best_peer: dict[str, dict[str, Any]] = {}
    for r in report.rows:
        name = str(r.get("name", ""))
        if name in peer_colors and (
            name not in best_peer or r["msgs_per_s"] > best_peer[name]["msgs_per_s"]
        ):
            best_peer[name] = r
    for name, r in best_peer.items():
        ax.axhline(r["msgs_per_s"], color=peer_colors[name], ls=":", lw=1.2)
        ax.annotate(
            f"{name} (best, x{r['producers']}) {r['msgs_per_s']:,.0f}",
            (1, r["msgs_per_s"]),
            fontsize=7,
            color=peer_colors[name],
            va="bottom",
        )
    ax.axhline(1e6, color="tab:purple", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("producer processes")
    ax.set_ylabel("messages per second (PUT_OK)")
    ax.set_title("put throughput, 1 KiB bodies", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax2.axhline(2.0, color="black", ls=":", lw=1)
    ax2.annotate("goal: sync 16 p99 <= 2 ms", (1, 2.0), fontsize=7, va="bottom")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xticks(counts, [str(n) for n in counts])
    ax2.set_xlabel("producer processes")
    ax2.set_ylabel("p99 latency per put (ms)")
    ax2.set_title("put latency p99", fontsize=10)
    met = sum(1 for g in report.goals if g.met)
    fig.suptitle(f"{report.title} — goals met: {met}/{len(report.goals)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def benchmark(opts: Options) -> Report:
    """Peers (unless `peers` ran first in this run), puts, memory; see the module doc."""
    quick = opts.quick
    duration = opts.duration_s if opts.duration_s is not None else (0.5 if quick else 5.0)
    counts = opts.producers or ((1, 2) if quick else PRODUCERS)
    root = opts.work_root / "put"
    root.mkdir(parents=True, exist_ok=True)
    peer_results: list[RunResult] = list(opts.shared.get("peers", []))
    if not peer_results:
        plan = QUICK_PLAN if quick else FULL_PLAN
        plan = PeerPlan(
            opts.duration_s or plan.duration_s,
            {k: v for k, v in plan.producers.items() if k in GOAL_PEERS},
            plan.seq_write_mib,
        )
        opts.log("  (peers for the goals)")
        peer_results = run_peers(plan, root / "peers", only=GOAL_PEERS, log=opts.log)
    runs: list[RunResult] = []
    for sync in (True, False):
        for pool in (True, False):
            for n in counts:
                r = put_run(
                    root,
                    sync=sync,
                    pool=pool,
                    producers=n,
                    duration_s=duration,
                    unique_keys=opts.unique_keys,
                )
                opts.log(
                    f"  {'sync' if sync else 'async':5} {'pool' if pool else 'nopool':6} "
                    f"x{n:<3} {r.msgs_per_s:12,.0f} msgs/s  p99 {r.lat_p99_us:9.1f} µs  "
                    f"msgs/fsync {r.extra.get('msgs_per_fsync', '-')}  "
                    f"errors {r.extra.get('errors', {})}"
                )
                runs.append(r)
    for pool in (True, False):
        r = put_run(
            root,
            sync=False,
            pool=pool,
            producers=1,
            duration_s=duration,
            batch=BATCH,
            unique_keys=opts.unique_keys,
        )
        opts.log(f"  batch {'pool' if pool else 'nopool':6} x1   {r.msgs_per_s:12,.0f} msgs/s")
        runs.append(r)
    mib = 1024 * 1024
    marks = (16 * mib, 64 * mib) if quick else (256 * mib, 1024 * mib, 2048 * mib)
    mem = server_memory(root, marks, pool=True)
    opts.log(f"  memory: {json.dumps(mem)[:400]}")
    goal_list = goals(runs, peer_results, mem)
    rows = [_row(r) for r in runs]
    for pr in peer_rows([p for p in peer_results if p.name in GOAL_PEERS]):
        pr["label"] = f"peer {pr['name']}"
        rows.append(pr)
    mem_rows = [
        {
            "label": f"server after >= {m['appended_bytes_at_least'] / 2**30:.2f} GiB",
            **{k: round(m[k] / mib, 1) for k in m if k.startswith(("rss", "uss"))},
            "processes": m["processes"],
        }
        for m in mem["marks"]
    ]
    return Report(
        name="put",
        title="mqstore put through the public client (1 KiB bodies)",
        method=[
            f"{duration:g} s per configuration, a fresh store each (mqstore start, SIGTERM).",
            "Producers are processes (fork), each attached with StoreClient.attach; every put "
            "encodes from topic, body (1 KiB), tags and keys "
            f"({'a key unique to each message' if opts.unique_keys else 'one key per producer'}"
            "); only PUT_OK counts.",
            "sync = SYNC_FLUSH with wait_store=True; async = ASYNC_FLUSH; pool = "
            "transient_store_pool_enable; batch = put_batch of "
            f"{BATCH} messages per call, latency per call.",
            "msgs/fsync and fsyncs/s: the flusher's counters (mqstore status --json) "
            "before and after the run.",
            "Goals take each peer's best rate over its producer counts in this run "
            "(the strictest reading).",
            "Memory: RSS/USS via psutil; server = supervisor + all its descendants.",
        ],
        columns=PUT_COLUMNS,
        rows=rows,
        goals=goal_list,
        plotter=plot_put,
        notes=[
            "Peers in full: peers.md.",
            *(
                f"{m['label']} ({m['processes']} processes): RSS {m['rss']} MiB = shm "
                f"{m['rss_shm']} + mapped store files {m['rss_store_files']} + other "
                f"{m['rss_other']}; USS {m['uss']} MiB"
                for m in mem_rows
            ),
            f"client: RSS above a bare interpreter that imported mqstore "
            f"{mem['client']['rss_above_bare'] / mib:.1f} MiB after attach and "
            f"{mem['client']['puts']} puts ({mem['client']['attach_rss_above_bare'] / mib:.1f}"
            f" MiB after attach alone; USS {mem['client']['uss_above_bare'] / mib:.1f} MiB).",
            f"shm: {json.dumps(mem['shm']['files'])}",
        ],
        extra={
            "duration_s": duration,
            "producers": list(counts),
            "batch": BATCH,
            "memory": mem,
            "peers": [p.to_dict() for p in peer_results],
        },
    )
