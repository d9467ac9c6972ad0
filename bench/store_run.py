"""The store under test: a fresh `mqstore start DIR --config F` (a foreground process)
under a bench's temporary directory, its status, its memory, and its stop (SIGTERM, then
a kill of the whole tree after STOP_TIMEOUT_S), with the shared memory it created checked
gone. Shared by the put, pull and dispatch benches and the profilers, with the put
workload they all use (a 1 KiB body, topic, tag, batch size).
"""

from __future__ import annotations

import compileall
import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.procs import BenchError

BODY_BYTES = 1024
TOPIC = "BenchTopic"
TAGS = "TagA"
BATCH = 128
REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 120.0


def client_api() -> tuple[Any, Any]:
    """(StoreClient, PutMessageStatus), imported when used: listing or running the peers
    alone does not load the store's C extension."""
    mod = importlib.import_module("mqstore")
    return mod.StoreClient, mod.PutMessageStatus


@dataclass
class StoreRun:
    """One running store: its directory, supervisor process and the shm it created."""

    store_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    shm_before: frozenset[str]


def _mqstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "mqstore", *args]


def shm_names(store_dir: Path | None = None) -> frozenset[str]:
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


# The package's source directories (mqstore/ links them).
PACKAGE_DIRS = ("conf", "engine", "ipc", "workers", "pipeline", "mqstore")


def precompile() -> None:
    """Write the package's bytecode (`__pycache__`, as an installed package has it), so
    that the store's processes, started fresh for every configuration, do not compile
    their modules from source inside the timed window: with PYTHONDONTWRITEBYTECODE set
    (this machine's environment) every worker compiled each module it imported, lazily
    too, about 0.1 CPU s each during a run. Up-to-date files are only stat'ed."""
    for d in PACKAGE_DIRS:
        if (REPO / d).is_dir():
            compileall.compile_dir(REPO / d, quiet=1, workers=1)


@contextlib.contextmanager
def running_store(
    root: Path,
    name: str,
    *,
    sync: bool,
    pool: bool,
    extra: Mapping[str, Any] | None = None,
    before_start: Callable[[Path], None] | None = None,
) -> Iterator[StoreRun]:
    """Start a fresh store under `root/name`, yield it, stop it (SIGTERM) and remove it.
    `before_start(store_dir)` runs on the empty store directory before the start.

    Raises BenchError if the store does not come up, or does not stop cleanly; any
    /dev/shm file it left behind is removed and reported.
    """
    StoreClient, _ = client_api()
    precompile()
    base = root / name
    shutil.rmtree(base, ignore_errors=True)
    store_dir = base / "store"
    store_dir.mkdir(parents=True)
    if before_start is not None:
        before_start(store_dir)
    cfg = base / "bench.toml"
    write_config(cfg, sync=sync, pool=pool, extra=extra or {})
    log_path = base / "supervisor.log"
    shm_before = shm_names(store_dir)
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
    left = sorted(shm_names(run.store_dir) - run.shm_before)
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
