"""Dispatch lag: from a put's return until `pull` returns the message.

    python -m bench.bench_dispatch [--producers 3] [--consumers 2] [--seconds 8]
                                   [--rates 0,5000] [--out bench/results]

For each configuration (`CONFIGS`: pool off; pool on with RocketMQ's 200 ms commit
interval, which bounds how soon data reaches the files and so the dispatcher; pool on
with a 10 ms commit interval) and target rate (messages/s over all producers; 0 = as
fast as they go, the runtime's async throughput) a fresh ASYNC_FLUSH store is started
with `bench.bench_put.running_store`. `--producers` processes put 1 KiB messages
(`StoreClient.put`, tag and a unique key, queue spread by the client over 4 queues) and
note, per message, (queue id, queue offset, CLOCK_MONOTONIC ns at the put's return).
`--consumers` processes pull their share of the 4 queues through `ipc.reads.ClientReads`
(`pull(max_count=64, wait_ms=20)`) and note, per message, the clock when the pull
returned it. While the producers run, the parent samples every 20 ms how far the
dispatcher is behind the committed position (bytes): a backlog near 0 with a large lag
means the consumers, not the dispatcher, fall behind. Lag = pull return - put return,
matched by (queue id, queue offset); CLOCK_MONOTONIC is one clock for the whole
machine. Reports count, p50, p99, max; the goal is p99 <= 50 ms. The machine is
shared: the load average is recorded before and after each run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any

from bench.bench_put import running_store
from bench.report import git_commit, machine_line

TOPIC = "DispatchBench"
QUEUES = 4
BODY = b"x" * 1024
GOAL_P99_MS = 50.0
REPO = Path(__file__).resolve().parent.parent


def _producer(store: str, idx: int, seconds: float, rate: float, out: str, go: Any) -> None:
    from mqstore.ipc.client import StoreClient

    client = StoreClient.attach(store)
    qids, qoffs, ts = array("q"), array("q"), array("q")
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
        r = client.put(TOPIC, BODY, tags="TagA", keys=[f"p{idx}-{n}"])
        t = time.monotonic_ns()
        if r.ok:
            qids.append(r.queue_id)
            qoffs.append(r.queue_offset)
            ts.append(t)
        n += 1
    client.close()
    with open(out, "wb") as f:
        for a in (qids, qoffs, ts):
            f.write(len(a).to_bytes(8, "little"))
            a.tofile(f)


def _consumer(store: str, queues: list[int], stop_at: float, out: str, go: Any) -> None:
    from mqstore.ipc.client import StoreClient
    from mqstore.ipc.reads import for_client

    client = StoreClient.attach(store)
    reads = for_client(client)
    nxt = dict.fromkeys(queues, 0)  # a fresh store: from the start, however late we come
    qids, qoffs, ts = array("q"), array("q"), array("q")
    go.wait()
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
    with open(out, "wb") as f:
        for a in (qids, qoffs, ts):
            f.write(len(a).to_bytes(8, "little"))
            a.tofile(f)


def _sample_backlog(store: str, out: list[int], stop: threading.Event) -> None:
    """Every 20 ms while the producers run: committed - dispatched (bytes the dispatcher
    has yet to do), from the control block."""
    from mqstore.ipc import control as c
    from mqstore.ipc.client import StoreClient

    with StoreClient.attach(store) as client:
        while not stop.wait(0.02):
            cb = client._cb
            out.append(max(cb.get(c.OFF_COMMITTED) - cb.get(c.OFF_DISPATCHED), 0))


def _load(path: str) -> dict[tuple[int, int], int]:
    with open(path, "rb") as f:
        cols = []
        for _ in range(3):
            n = int.from_bytes(f.read(8), "little")
            a = array("q")
            a.fromfile(f, n)
            cols.append(a)
    return {(q, o): t for q, o, t in zip(*cols, strict=True)}


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


CONFIGS: dict[str, tuple[bool, dict[str, Any]]] = {
    # name: (pool on, extra settings)
    "pool-off": (False, {}),
    "pool-off-commit-10ms": (
        False,
        {"commit_interval_ms": 10, "commit_thorough_interval_ms": 10, "commit_least_pages": 0},
    ),
    "pool-on": (True, {}),  # RocketMQ's commitIntervalCommitLog: 200 ms
    "pool-on-commit-10ms": (
        True,
        {"commit_interval_ms": 10, "commit_thorough_interval_ms": 10, "commit_least_pages": 0},
    ),
}


def run_once(root: Path, args: argparse.Namespace, config: str, rate: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    load_before = os.getloadavg()
    pool, extra = CONFIGS[config]
    name = f"dispatch-{config}-{int(rate)}"
    with running_store(root, name, sync=False, pool=pool, extra=extra) as run:
        store = str(run.store_dir)
        go = ctx.Event()
        work = root / f"w-{name}"
        work.mkdir(exist_ok=True)
        stop_at_slack = 3.0
        per_rate = rate / args.producers if rate else 0.0
        prods = [
            ctx.Process(
                target=_producer,
                args=(store, i, args.seconds, per_rate, str(work / f"p{i}"), go),
            )
            for i in range(args.producers)
        ]
        shares = [
            [q for q in range(QUEUES) if q % args.consumers == k] for k in range(args.consumers)
        ]
        for p in prods:
            p.start()
        time.sleep(1.0)  # spawn + attach, outside the timed part
        stop_at = time.monotonic() + 1.0 + args.seconds + stop_at_slack
        cons = [
            ctx.Process(target=_consumer, args=(store, qs, stop_at, str(work / f"c{k}"), go))
            for k, qs in enumerate(shares)
        ]
        for c in cons:
            c.start()
        time.sleep(1.0)
        backlog: list[int] = []
        sampling = threading.Event()
        sampler = threading.Thread(target=_sample_backlog, args=(store, backlog, sampling))
        sampler.start()
        go.set()
        t0 = time.monotonic()
        try:
            for p in prods:
                p.join(args.seconds + 120)
        finally:
            sampling.set()
            sampler.join()
        for p in prods + cons:
            p.join(args.seconds + 120)
            if p.exitcode != 0:
                raise RuntimeError(f"a bench process exited with {p.exitcode}")
        elapsed = time.monotonic() - t0
        puts: dict[tuple[int, int], int] = {}
        for i in range(args.producers):
            puts.update(_load(str(work / f"p{i}")))
        pulls: dict[tuple[int, int], int] = {}
        for k in range(args.consumers):
            pulls.update(_load(str(work / f"c{k}")))
    backlog.sort()
    lags = sorted((pulls[k] - t) / 1e6 for k, t in puts.items() if k in pulls)
    missing = sum(1 for k in puts if k not in pulls)
    return {
        "config": config,
        "target_rate": rate,
        "producers": args.producers,
        "consumers": args.consumers,
        "messages": len(puts),
        "put_rate": round(len(puts) / args.seconds, 1),
        "pulled": len(lags),
        "not_pulled_in_time": missing,
        "lag_ms_p50": round(_pct(lags, 0.5), 3),
        "lag_ms_p99": round(_pct(lags, 0.99), 3),
        "lag_ms_max": round(lags[-1], 3) if lags else None,
        "dispatch_backlog_bytes_p99": _pct([float(b) for b in backlog], 0.99),
        "dispatch_backlog_bytes_max": backlog[-1] if backlog else None,
        "goal_p99_ms": GOAL_P99_MS,
        "goal_met": bool(lags) and missing == 0 and _pct(lags, 0.99) <= GOAL_P99_MS,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "elapsed_s": round(elapsed, 2),
    }


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Dispatch lag: put return -> pull returns the message (ASYNC_FLUSH)",
        "",
        f"- command: `{doc['command']}`",
        f"- commit: `{doc['commit']}`, {doc['when']}",
        f"- machine: {doc['machine']}. **Shared machine**: other jobs ran during the",
        "  measurement (load averages below); figures are what this load allowed.",
        f"- goal: p99 <= {GOAL_P99_MS:g} ms",
        "",
        "| config | target rate | put rate (msg/s) | messages | pulled | p50 ms | p99 ms "
        "| max ms | goal | dispatcher backlog p99 (KiB) | load avg before / after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["runs"]:
        target = "max (async throughput)" if not r["target_rate"] else f"{r['target_rate']:,.0f}/s"
        lines.append(
            f"| {r['config']} | {target} | {r['put_rate']:,.0f} | {r['messages']:,} | "
            f"{r['pulled']:,} | "
            f"{r['lag_ms_p50']} | {r['lag_ms_p99']} | {r['lag_ms_max']} | "
            f"{'yes' if r['goal_met'] else '**no**'} | "
            f"{r['dispatch_backlog_bytes_p99'] / 1024:,.0f} | "
            f"{r['load_avg_before']} / {r['load_avg_after']} |"
        )
    lines += ["", *NOTES]
    return "\n".join(lines) + "\n"


NOTES = [
    "How to read it:",
    "",
    "- With the pool on, the dispatcher follows the committed position (ASYNC_FLUSH): with",
    "  RocketMQ's `commitIntervalCommitLog` of 200 ms every pull moves in 200 ms steps",
    "  (p50 ~130 ms, p99 ~220 ms: the cadence, not the dispatcher, whose backlog stays",
    "  ~1 MiB); with a 10 ms commit interval a pull sees a message ~11 ms after its put.",
    "- With the pool off, published records are already in the files' mappings, so the",
    "  dispatcher and readers follow the published end: ~3 ms p50, ~5 ms p99 at 5,000/s.",
    "- At the producers' full async rate (3 producers, ~32k msg/s) the dispatcher (one",
    "  process, a consume-queue unit and an index entry per message, ~1/3 of a core here",
    "  beside 3 producers, 2 consumers, the committer and the flusher) falls behind by tens",
    "  of MiB and the lag grows for the whole run (seconds): the goal is not met there.",
    "- `pulled` < `messages`: the rest was not pullable within 3 s after the producers",
    "  stopped.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_dispatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--producers", type=int, default=3)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rates", default="0,5000", help="msg/s over all producers; 0 = max")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"of {', '.join(CONFIGS)}")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--dir", type=Path, default=None, help="parent of the temporary stores")
    args = p.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="mqstore-bench-dispatch-") as tmp:
        for config in args.configs.split(","):
            for rate in (float(x) for x in args.rates.split(",")):
                r = run_once(Path(tmp), args, config, rate)
                print(json.dumps(r), flush=True)
                runs.append(r)
    doc = {
        "command": "python -m bench.bench_dispatch "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_line(),
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dispatch.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "dispatch.md").write_text(_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
