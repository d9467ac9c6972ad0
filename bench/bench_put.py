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
import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.options import Options
from bench.peers import (
    FULL_PLAN,
    QUICK_PLAN,
    PeerPlan,
    run_peers,
)
from bench.procs import NO_LIMIT, BenchError, FnProducer, Producer, RunResult, run_producers
from bench.put_report import GOAL_PEERS, build_report
from bench.report import Report
from bench.store_run import (
    BATCH,
    BODY_BYTES,
    REPO,
    TAGS,
    TOPIC,
    StoreRun,
    client_api,
    fsync_counters,
    running_store,
    shm_names,
    status,
    tree_memory,
)

PRODUCERS = (1, 2, 4, 16, 64)


# --- producers (run in the forked children) ---------------------------------------------


class _Session:
    """One producer's attached client, its body and key rule, and the statuses other than
    PUT_OK it got with the first one's reason; at close, the client detaches and the
    statuses are written where the parent collects them (`_collect_errors`)."""

    def __init__(self, index: int, params: Mapping[str, Any]) -> None:
        store_client, put_message_status = client_api()
        self.stack = contextlib.ExitStack()
        self.client = self.stack.enter_context(store_client.attach(params["store_dir"]))
        self.ok = put_message_status.PUT_OK
        self.body = os.urandom(BODY_BYTES)
        self.unique = bool(params.get("unique_keys", True))
        self.key = f"k{index}"  # every message's key, or the prefix of unique ones
        self.path = Path(params["errors_dir"]) / f"put-errors-{index}.json"
        self.counts: dict[str, int] = {}
        self.first: list[str] = []

    def keys(self) -> Iterator[str]:
        """The messages' keys in turn: unique to each (`k<producer>-<seq>`) or the
        producer's one key. A generator costs what the f-string did inline."""
        if not self.unique:
            return itertools.repeat(self.key)
        prefix = self.key
        return (f"{prefix}-{seq}" for seq in itertools.count())

    def add(self, status_name: str, reason: str) -> None:
        self.counts[status_name] = self.counts.get(status_name, 0) + 1
        if not self.first:
            self.first.append(f"{status_name}: {reason}")

    def close(self) -> None:
        self.stack.close()
        if self.counts:
            self.path.write_text(json.dumps({"errors": self.counts, "first": self.first}))


def _put_producer(index: int, params: Mapping[str, Any]) -> Producer:
    session = _Session(index, params)
    put, ok, body, keys = session.client.put, session.ok, session.body, session.keys()
    wait_store = bool(params["wait_store"])

    def step() -> int:
        r = put(TOPIC, body, tags=TAGS, keys=next(keys), wait_store=wait_store)
        if r.status is ok:
            return 1
        session.add(r.status.name, r.reason)
        return 0

    return FnProducer(step, session.close)


def _batch_producer(index: int, params: Mapping[str, Any]) -> Producer:
    session = _Session(index, params)
    put_batch, ok, body, keys = session.client.put_batch, session.ok, session.body, session.keys()
    size = int(params["batch"])

    def step() -> int:
        msgs = [
            {"topic": TOPIC, "body": body, "tags": TAGS, "keys": key}
            for key in itertools.islice(keys, size)
        ]
        done = 0
        for r in put_batch(msgs):
            if r.status is ok:
                done += 1
            else:
                session.add(r.status.name, r.reason)
        return done

    return FnProducer(step, session.close)


def run_puts(
    store: StoreRun,
    name: str,
    producers: int,
    duration_s: float,
    *,
    batch: int = 0,
    unique_keys: bool = True,
    max_messages: int = NO_LIMIT,
) -> RunResult:
    """`producers` processes putting into `store` (`put` with wait_store, or `put_batch`
    of `batch`) for `duration_s` or until `max_messages`; the statuses other than PUT_OK
    they got are in the result's `extra` (`_collect_errors`)."""
    work = store.store_dir.parent / "procs"
    params = {
        "store_dir": str(store.store_dir),
        "wait_store": True,
        "batch": batch,
        "errors_dir": str(work),
        "unique_keys": unique_keys,
    }
    r = run_producers(
        name, _batch_producer if batch else _put_producer, params, producers=producers,
        duration_s=duration_s, work_dir=work, body_bytes=BODY_BYTES, max_messages=max_messages,
    )  # fmt: skip
    r.extra.update(_collect_errors(work))
    return r


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
    extra: Mapping[str, Any] | None = None,
    tag: str = "",
    producers: int,
    duration_s: float,
    batch: int = 0,
    unique_keys: bool = True,
) -> RunResult:
    """One configuration on a fresh store (`extra`: more store settings; `tag` tells
    runs that differ only in them apart), then the producers' load (`run_puts`)."""
    mode = "sync" if sync else "async"
    name = f"{'batch' if batch else mode}_{'pool' if pool else 'nopool'}{tag}"
    with running_store(root, f"{name}-{producers}", sync=sync, pool=pool, extra=extra) as store:
        before = fsync_counters(status(store.store_dir)) if sync else None
        r = run_puts(
            store, name, producers=producers, duration_s=duration_s, batch=batch,
            unique_keys=unique_keys,
        )  # fmt: skip
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
        new_shm = sorted(shm_names(s.store_dir) - s.shm_before)
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
        record = BODY_BYTES + 150  # a little more than the encoded size: marks are minimums
        written = 0
        for mark in marks_bytes:
            todo = max(0, -(-(mark - written) // record))
            r = run_puts(  # one key: the fill only needs bytes in the log
                s, "memory-fill", producers=1, duration_s=3600.0, batch=BATCH,
                unique_keys=False, max_messages=todo,
            )  # fmt: skip
            if "errors" in r.extra:
                raise BenchError(f"memory fill: puts failed: {r.extra}")
            written += r.messages * record
            mem = tree_memory(s.proc.pid, s.store_dir)
            out["marks"].append({"appended_bytes_at_least": written, **mem})
    return out


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
    for sync in (True,) if opts.sync_only else (True, False):
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
    for pool in () if opts.sync_only else (True, False):
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
    mem: dict[str, Any] | None = None
    if not opts.sync_only:
        mem = server_memory(root, marks, pool=True)
        opts.log(f"  memory: {json.dumps(mem)[:400]}")
    return build_report(runs, peer_results, mem, duration, counts, opts.unique_keys)
