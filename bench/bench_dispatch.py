"""Dispatch: does the dispatcher keep up with the producers' full async rate?

    python -m bench.bench_dispatch [--producers 2] [--seconds 5] [--rates 0]
                                   [--configs pool-off] [--consumers 0]
                                   [--profile] [--replay-mib 256] [--out bench/results]

For each configuration (`CONFIGS`) and target rate (messages/s over all producers; 0 =
as fast as they go, the runtime's async throughput) a fresh ASYNC_FLUSH store is started
with `bench.store_run.running_store`. `--producers` processes put 1 KiB messages
(`StoreClient.put`, tag `TagA`, KEYS of two tokens: a key unique to the message and a
second one shared by 16 messages, so two index keys per message; queues spread by the
client over 4) and note, per message, (queue id, queue offset, CLOCK_MONOTONIC ns at the
put's return). Measured in the same run:

- **catch-up**: the parent samples the control block every `SAMPLE_S` (published,
  committed, dispatched position, records dispatched, the store time of the last
  record dispatched). After the producers stop, the log's end is final; catch-up = the
  first sample whose dispatched position covers it, minus the last put's return. Pulls
  stop at the dispatched position (`ipc.reads`), so this is when every message became
  pullable (to the sampling step); a pull of each queue's last offset then checks that
  it is. Goal <= 100 ms.
- **dispatch lag** while the producers run: the supervisor's
  `mqstore_dispatch_behind_seconds` (0 when the dispatcher has caught up with its limit,
  else now minus the store time of the oldest record it has yet to dispatch), computed
  from each sample exactly as `workers.metrics` does; p50 / p99 / max (and, in the JSON,
  the p99 of the metric as it was before issue 13's fix: now minus the store time of
  the last record dispatched). Goal p99 <= 50 ms. Also the dispatcher's
  backlog (published - dispatched, KiB: what it has yet to do) p50 / p99, the behind
  p99 counted only while that backlog was not empty (`with work`), and the p99 of the
  dispatcher's own per-record histogram (`mqstore_dispatch_lag_seconds`, power-of-two
  ms buckets: the bucket's upper bound), over this run's records.
- **dispatch rate**: records dispatched per second while the dispatcher was behind
  (from the first put to catch-up), against the put rate; and, after the run, the
  dispatcher alone (`engine.dispatch.Dispatcher` in this process, one core, the store
  idle) replaying the first `--replay-mib` MiB of the run's log into fresh consume
  queues and index.
- `--profile`: py-spy samples the dispatcher process (waits included: `--idle`) while the
  producers run; the functions with the most samples (own and inclusive) go to
  `dispatch_profile.txt`.
- Before the timed part one message per queue is put and dispatched, so that the
  consume-queue files and the index file exist, as in a running store (`--cold`: not).
- `--consumers N` (default 0): N processes also pull everything (`pull(max_count=64)`)
  and the per-message lag put return -> pull return is reported (p50 / p99 / max).

The machine is shared: the load average is recorded before and after each run.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.dispatch_report import GOAL_BEHIND_P99_MS, GOAL_CATCH_UP_MS, write
from bench.report import command_line
from bench.store_run import running_store

TOPIC = "DispatchBench"
QUEUES = 4
BODY = b"x" * 1024
SHARED_KEY_EVERY = 16  # the second key is shared by this many consecutive messages
SAMPLE_S = 0.002
CATCH_UP_TIMEOUT_S = 120.0
REPO = Path(__file__).resolve().parent.parent

CONFIGS: dict[str, tuple[bool, dict[str, Any]]] = {
    # name: (pool on, extra settings)
    "pool-off": (False, {}),
    "pool-on": (True, {}),  # RocketMQ's commitIntervalCommitLog: 200 ms
    "pool-on-commit-10ms": (
        True,
        {"commit_interval_ms": 10, "commit_thorough_interval_ms": 10, "commit_least_pages": 0},
    ),
}


# --- the producer and consumer processes --------------------------------------------------


def _write_columns(out: str, *cols: array[int]) -> None:
    with open(out, "wb") as f:
        for a in cols:
            f.write(len(a).to_bytes(8, "little"))
            a.tofile(f)


def _read_columns(path: Path, n: int) -> list[array[int]]:
    cols = []
    with path.open("rb") as f:
        for _ in range(n):
            a = array("q")
            a.fromfile(f, int.from_bytes(f.read(8), "little"))
            cols.append(a)
    return cols


def _producer(
    store: str, idx: int, seconds: float, rate: float, out: str, ready: Any, go: Any
) -> None:
    from mqstore.ipc.client import StoreClient

    client = StoreClient.attach(store)
    qids, qoffs, ts = array("q"), array("q"), array("q")
    ready.put(idx)
    go.wait()
    start = time.monotonic()
    n = 0
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        if rate > 0:
            ahead = n / rate - (now - start)
            if ahead > 0:
                time.sleep(ahead)
        keys = f"u{idx}-{n} s{idx}-{n // SHARED_KEY_EVERY}"
        r = client.put(TOPIC, BODY, tags="TagA", keys=keys, wait_store=False)
        t = time.monotonic_ns()
        if r.ok:
            qids.append(r.queue_id)
            qoffs.append(r.queue_offset)
            ts.append(t)
        n += 1
    client.close()
    _write_columns(out, qids, qoffs, ts)


def _consumer(store: str, queues: list[int], seconds: float, out: str, ready: Any, go: Any) -> None:
    from mqstore.ipc.client import StoreClient
    from mqstore.ipc.reads import for_client

    client = StoreClient.attach(store)
    reads = for_client(client)
    nxt = dict.fromkeys(queues, 0)  # a fresh store: from the start, however late we come
    qids, qoffs, ts = array("q"), array("q"), array("q")
    ready.put(-1)
    go.wait()
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        for q in queues:
            res = reads.pull(TOPIC, q, nxt[q], 64, wait_ms=20 if len(queues) == 1 else 0)
            t = time.monotonic_ns()
            for m in res.messages:
                qids.append(q)
                qoffs.append(m.queue_offset)
                ts.append(t)
            nxt[q] = res.next_offset
        if len(queues) > 1:
            time.sleep(0.0005)
    reads.close()
    client.close()
    _write_columns(out, qids, qoffs, ts)


# --- sampling the control block -----------------------------------------------------------


@dataclass
class Samples:
    """Control-block samples: CLOCK_MONOTONIC ns, wall ms, and the positions."""

    t_ns: array[int] = field(default_factory=lambda: array("q"))
    wall_ms: array[int] = field(default_factory=lambda: array("q"))
    published: array[int] = field(default_factory=lambda: array("q"))
    committed: array[int] = field(default_factory=lambda: array("q"))
    dispatched: array[int] = field(default_factory=lambda: array("q"))
    records: array[int] = field(default_factory=lambda: array("q"))
    dispatched_ts: array[int] = field(default_factory=lambda: array("q"))
    oldest_ts: array[int] = field(default_factory=lambda: array("q"))  # 0: caught up

    def behind_ms(self, i: int, *, of_published: bool = False) -> float:
        """`workers.metrics`' mqstore_dispatch_behind_seconds at sample i, in ms: now
        minus the store time of the oldest record the dispatcher could dispatch and has
        not (`metrics.oldest_undispatched_ms`); with `of_published`, counted only while
        it had published records to do."""
        ts = self.oldest_ts[i]
        if not ts or (of_published and self.dispatched[i] >= self.published[i]):
            return 0.0
        return float(max(0, self.wall_ms[i] - ts))

    def behind_last_ms(self, i: int) -> float:
        """The metric as it was before (issue 13): now minus the store time of the last
        record dispatched while dispatched < committed (the whole idle time at the first
        put after one; what a SYNC_FLUSH store waits for its flush)."""
        dts = self.dispatched_ts[i]
        if self.dispatched[i] < self.committed[i] and dts:
            return float(max(0, self.wall_ms[i] - dts))
        return 0.0


def _sample(client: Any, s: Samples, stop: threading.Event) -> None:
    from mqstore.ipc.control_views import DispatchStats, Positions
    from mqstore.workers.metrics import oldest_undispatched_ms

    cb = client.live_control_block()
    pos, stats = Positions(cb), DispatchStats(cb)
    store = str(client.store_dir)
    while not stop.wait(SAMPLE_S):
        s.t_ns.append(time.monotonic_ns())
        s.wall_ms.append(time.time_ns() // 1_000_000)
        s.published.append(pos.published)
        s.committed.append(pos.committed)
        s.dispatched.append(pos.dispatched)
        s.records.append(stats.records)
        s.dispatched_ts.append(stats.last_ts)
        s.oldest_ts.append(oldest_undispatched_ms(store, cb, sync_flush=False) or 0)


def _warm(client: Any) -> None:
    """One message per queue, dispatched before the timed part: the consume-queue files
    and the index file exist, as in a store that has been running."""
    from mqstore.ipc.control_views import Positions

    for q in range(QUEUES):
        client.put(TOPIC, BODY, tags="TagA", keys=f"warm-{q}", queue_id=q, wait_store=False)
    pos = Positions(client.live_control_block())
    end = pos.published
    deadline = time.monotonic() + 60
    while pos.dispatched < end:
        if time.monotonic() > deadline:
            raise RuntimeError("the warm-up messages were not dispatched in 60 s")
        time.sleep(0.01)


def _lag_histogram(client: Any) -> list[int]:
    from mqstore.ipc.control_views import Histograms

    return Histograms(client.live_control_block()).dispatch_lag_ms()


def _hist_p99_ms(before: list[int], after: list[int]) -> float | None:
    """The upper bound (ms) of the bucket holding the 99th percentile of the records
    counted between the two histograms (bucket i: within 2^i ms; the last: beyond)."""
    delta = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(delta)
    if not total:
        return None
    seen = 0
    for i, n in enumerate(delta):
        seen += n
        if seen >= 0.99 * total:
            return float(2**i) if i < len(delta) - 1 else float("inf")
    return float("inf")


# --- profiling the dispatcher process -------------------------------------------------------


def _running_dispatcher(client: Any) -> int:
    """The dispatcher worker's pid, once the supervisor says it runs (it may still be
    importing when the store first accepts clients)."""
    from mqstore.ipc import control as c

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for i in range(c.MAX_WORKERS):
            name, pid, _hb, _restarts, state = client.live_control_block().worker(i)
            if name == "dispatcher" and c.WORKER_STATE_NAMES.get(state) == "running":
                return int(pid)
        time.sleep(0.05)
    raise RuntimeError("the dispatcher worker did not come up")


def _py_spy() -> str | None:
    """py-spy's path (PATH, or beside this interpreter), None if it is not installed."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def _start_profile(pid: int, seconds: float, raw: Path) -> subprocess.Popen[bytes]:
    spy = _py_spy()
    assert spy is not None  # main() refuses --profile without it
    return subprocess.Popen(
        [spy, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "200",
         "-f", "raw", "-o", str(raw), "--nonblocking", "--idle"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def summarize_profile(raw: Path, top: int = 25) -> str:
    """The functions with the most samples in a py-spy raw (collapsed) profile: own
    samples (the function was running) and inclusive ones (it was on the stack)."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        total += count
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                  + ")" if " (" in f else f for f in stack.split(";")]  # fmt: skip
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    lines = [f"samples: {total}", "", "own samples (where the time is spent):"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    lines += ["", "inclusive samples (on the stack):"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in incl.most_common(top)]
    return "\n".join(lines) + "\n"


# --- the dispatcher alone -----------------------------------------------------------------


def replay(
    store_dir: Path, work: Path, mib: int, max_records: int = 4096, *, plain_c: bool = True
) -> dict[str, Any]:
    """Dispatch the first `mib` MiB of a store's log into fresh consume queues and
    index, in this process, in rounds of at most `max_records`: the dispatcher's own
    rate with nothing else running. `plain_c=False`: every batch through the Python path
    (`Dispatcher.plain_c`), for A/B."""
    from mqstore.conf.settings import StoreSettings
    from mqstore.engine.dispatch import Dispatcher
    from mqstore.engine.reader import Geometry

    work.mkdir(parents=True)
    os.symlink(store_dir / "commitlog", work / "commitlog")
    geometry = Geometry.of(store_dir, StoreSettings())
    disp = Dispatcher.open(work, geometry)
    disp.plain_c = plain_c
    try:
        limit = min(mib * 1024 * 1024, disp.log.max_offset())
        offset, records, keys, rounds = 0, 0, 0, 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while offset < limit:
            res = disp.dispatch(offset, limit, max_records=max_records)
            if res.next_offset <= offset:
                break
            offset, records, keys = res.next_offset, records + res.records, keys + res.index_keys
            rounds += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        disp.close()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "replay_bytes": offset,
        "replay_records": records,
        "replay_index_keys": keys,
        "replay_records_per_s": round(records / wall, 1) if wall else None,
        "replay_cpu_us_per_record": round(cpu / records * 1e6, 2) if records else None,
        "replay_cpu_us_per_round": round(cpu / rounds * 1e6, 1) if rounds else None,
    }


# --- one run --------------------------------------------------------------------------------


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def _check_pullable(client: Any, last: dict[int, int]) -> int:
    """How many queues return their last message when pulled at its offset."""
    from mqstore.ipc.reads import for_client

    reads = for_client(client)
    try:
        ok = 0
        for q, qo in last.items():
            res = reads.pull(TOPIC, q, qo, 1)
            ok += bool(res.messages) and res.messages[0].queue_offset == qo
        return ok
    finally:
        reads.close()


def _wait_caught_up(s: Samples, end: int) -> int | None:
    """Index of the first sample whose dispatched position covers `end`."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    i = 0
    while time.monotonic() < deadline:
        while i < len(s.dispatched):
            if s.dispatched[i] >= end:
                return i
            i += 1
        time.sleep(SAMPLE_S)
    return None


def _rate_series(s: Samples, t0_ns: int, step_s: float = 0.1) -> list[tuple[float, float]]:
    """(seconds since t0, records dispatched per second over the last step)."""
    out: list[tuple[float, float]] = []
    j = 0
    for i in range(1, len(s.t_ns)):
        if (s.t_ns[i] - s.t_ns[j]) / 1e9 >= step_s:
            rate = (s.records[i] - s.records[j]) / ((s.t_ns[i] - s.t_ns[j]) / 1e9)
            out.append((round((s.t_ns[i] - t0_ns) / 1e9, 3), round(rate, 1)))
            j = i
    return out


def run_once(root: Path, args: argparse.Namespace, config: str, rate: float) -> dict[str, Any]:
    from mqstore.ipc.client import StoreClient
    from mqstore.ipc.control_views import DispatchStats, Positions

    ctx = mp.get_context("spawn")
    load_before = os.getloadavg()
    pool, extra = CONFIGS[config]
    name = f"dispatch-{config}-{int(rate)}"
    work = root / f"w-{name}"
    work.mkdir(exist_ok=True)
    with running_store(root, name, sync=False, pool=pool, extra=extra) as run:
        store = str(run.store_dir)
        go, ready = ctx.Event(), ctx.Queue()
        per_rate = rate / args.producers if rate else 0.0
        prods = [
            ctx.Process(
                target=_producer,
                args=(store, i, args.seconds, per_rate, str(work / f"p{i}"), ready, go),
            )
            for i in range(args.producers)
        ]
        for p in prods:
            p.start()
        shares = [[q for q in range(QUEUES) if q % args.consumers == k]
                  for k in range(args.consumers)]  # fmt: skip
        cons = [
            ctx.Process(
                target=_consumer,
                args=(store, qs, args.seconds + 3.0, str(work / f"c{k}"), ready, go),
            )
            for k, qs in enumerate(shares)
        ]
        for cp in cons:
            cp.start()
        for _ in prods + cons:  # spawn + attach, outside the timed part
            ready.get(timeout=120)
        with StoreClient.attach(store) as client:
            dispatcher_pid = _running_dispatcher(client)
            if args.warm:
                _warm(client)
            samples = Samples()
            sampling = threading.Event()
            sampler = threading.Thread(target=_sample, args=(client, samples, sampling))
            hist_before = _lag_histogram(client)
            records_before = DispatchStats(client.live_control_block()).records
            sampler.start()
            spy = None
            if args.profile:
                spy = _start_profile(dispatcher_pid, args.seconds + 2, work / "profile.raw")
            go.set()
            t_go = time.monotonic_ns()
            try:
                for p in prods:
                    p.join(args.seconds + 120)
                running_samples = len(samples.t_ns)
                end = Positions(client.live_control_block()).published
                caught = _wait_caught_up(samples, end)
            finally:
                sampling.set()
                sampler.join()
            hist_after = _lag_histogram(client)
            records_after = DispatchStats(client.live_control_block()).records
            for p in prods + cons:
                p.join(args.seconds + 120)
                if p.exitcode != 0:
                    raise RuntimeError(f"a bench process exited with {p.exitcode}")
            puts = [_read_columns(work / f"p{i}", 3) for i in range(args.producers)]
            last_offsets: dict[int, int] = {}
            for qids, qoffs, _ts in puts:
                for q, qo in zip(qids, qoffs, strict=True):
                    last_offsets[q] = max(last_offsets.get(q, -1), qo)
            pullable = _check_pullable(client, last_offsets)
            if spy is not None:
                spy.wait(60)
        replayed = replay(run.store_dir, work / "replay", args.replay_mib)
    messages = sum(len(ts) for _q, _o, ts in puts)
    last_put_ns = max(ts[-1] for _q, _o, ts in puts if ts)
    first_put_ns = min(ts[0] for _q, _o, ts in puts if ts)
    put_seconds = (last_put_ns - first_put_ns) / 1e9
    behind = sorted(samples.behind_ms(i) for i in range(running_samples))
    own = sorted(samples.behind_ms(i, of_published=True) for i in range(running_samples))
    before = sorted(samples.behind_last_ms(i) for i in range(running_samples))
    backlog = sorted(
        max(0, samples.published[i] - samples.dispatched[i]) / 1024 for i in range(running_samples)
    )
    caught_ms = None
    dispatch_rate = None
    if caught is not None:
        caught_ms = max(0.0, (samples.t_ns[caught] - last_put_ns) / 1e6)
        span = (samples.t_ns[caught] - first_put_ns) / 1e9
        dispatch_rate = (records_after - records_before) / span if span > 0 else None
    row: dict[str, Any] = {
        "config": config,
        "target_rate": rate,
        "producers": args.producers,
        "messages": messages,
        "put_rate": round(messages / put_seconds, 1) if put_seconds else None,
        "index_keys_per_message": 2,
        "log_bytes": end,
        "catch_up_ms": None if caught_ms is None else round(caught_ms, 1),
        "queues_pullable_at_end": f"{pullable}/{len(last_offsets)}",
        "behind_ms_p50": round(_pct(behind, 0.5), 1),
        "behind_ms_p99": round(_pct(behind, 0.99), 1),
        "behind_ms_max": round(behind[-1], 1) if behind else None,
        "behind_with_work_ms_p99": round(_pct(own, 0.99), 1),
        "behind_last_dispatched_ms_p99": round(_pct(before, 0.99), 1),
        "lag_hist_p99_ms_bound": _hist_p99_ms(hist_before, hist_after),
        "backlog_kib_p50": round(_pct(backlog, 0.5)),
        "backlog_kib_p99": round(_pct(backlog, 0.99)),
        "dispatch_records_per_s": None if dispatch_rate is None else round(dispatch_rate, 1),
        "dispatch_rate_series": _rate_series(samples, first_put_ns),
        "behind_ms_series": [
            (round((samples.t_ns[i] - t_go) / 1e9, 3), samples.behind_ms(i))
            for i in range(0, len(samples.t_ns), 5)
        ],
        "last_put_s": round((last_put_ns - t_go) / 1e9, 3),
        **replayed,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    row["goal_catch_up_met"] = caught_ms is not None and caught_ms <= GOAL_CATCH_UP_MS
    row["goal_behind_p99_met"] = bool(behind) and _pct(behind, 0.99) <= GOAL_BEHIND_P99_MS
    if args.consumers:
        row.update(_pull_lags(work, puts, args.consumers))
    if args.profile and (work / "profile.raw").exists():
        row["profile"] = summarize_profile(work / "profile.raw")
    return row


def _pull_lags(work: Path, puts: list[list[array[int]]], consumers: int) -> dict[str, Any]:
    """Per message: pull return - put return (ms), matched by (queue id, queue offset)."""
    put_at = {
        (q, o): t for qids, qoffs, ts in puts for q, o, t in zip(qids, qoffs, ts, strict=True)
    }
    pulled: dict[tuple[int, int], int] = {}
    for k in range(consumers):
        qids, qoffs, ts = _read_columns(work / f"c{k}", 3)
        pulled.update(((q, o), t) for q, o, t in zip(qids, qoffs, ts, strict=True))
    lags = sorted((pulled[k] - t) / 1e6 for k, t in put_at.items() if k in pulled)
    return {
        "consumers": consumers,
        "pulled": len(lags),
        "pull_lag_ms_p50": round(_pct(lags, 0.5), 3),
        "pull_lag_ms_p99": round(_pct(lags, 0.99), 3),
        "pull_lag_ms_max": round(lags[-1], 3) if lags else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_dispatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--consumers", type=int, default=0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rates", default="0", help="msg/s over all producers; 0 = max")
    p.add_argument("--configs", default="pool-off", help=f"of {', '.join(CONFIGS)}")
    p.add_argument("--profile", action="store_true", help="py-spy the dispatcher process")
    p.add_argument("--replay-mib", type=int, default=256)
    p.add_argument(
        "--cold",
        dest="warm",
        action="store_false",
        help="no warm-up: the first round also creates the consume-queue and index files",
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--dir", type=Path, default=None, help="parent of the temporary stores")
    args = p.parse_args(argv)
    if args.profile and _py_spy() is None:
        p.error("--profile needs py-spy (pip install py-spy)")
    runs = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="mqstore-bench-dispatch-") as tmp:
        for config in args.configs.split(","):
            for rate in (float(x) for x in args.rates.split(",")):
                r = run_once(Path(tmp), args, config, rate)
                brief = {k: v for k, v in r.items() if not k.endswith("_series")}
                print(json.dumps({k: v for k, v in brief.items() if k != "profile"}), flush=True)
                runs.append(r)
    command = command_line("bench.bench_dispatch", argv)
    write(runs, command=command, bench_dir=args.dir or Path(tempfile.gettempdir()), out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
