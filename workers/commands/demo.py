"""`mqstore demo DIR`: a load generator against a running store, with a live line.

    mqstore demo DIR [--producers N] [--sync-producers N] [--seconds S | --messages M]
                     [--body-bytes B] [--consumer] [--topic T] [--json]

Starts `--producers` async producers (`wait_store=False`: acknowledged once the record
is in the pool or page cache) and `--sync-producers` sync producers (`wait_store=True`:
under SYNC_FLUSH acknowledged once fsynced), each in its own process with its own
`StoreClient`, for `--seconds` or until `--messages` in all. The live line shows puts/s,
p99 latency per kind and the statuses. `--consumer` adds a process that reads back what
was put, up to the durable offset (the `flushed_offset` file), and checks that every
acknowledged message of this run is there exactly once, through the consume queues
(`engine.reader`) the store's dispatcher writes.

Prints a summary (or one JSON document with `--json`). Exit 0; 1 if any put failed or
the consumer missed or duplicated a message; 2 if no supervisor runs for DIR. Ctrl-C or
SIGTERM (whatever disposition the process inherited: `_signals`) stops the load early
and still prints the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mqstore.engine.storedir import read_flushed_offset
from mqstore.ipc import channel
from mqstore.workers.commands._common import topic_arg
from mqstore.workers.commands._signals import stop_signals

NAME = "demo"
HELP = "load generator against a running store: producers (sync, async), consumer, live line"

REPORT_S = 0.2
_BUCKET = math.log(1.05)  # latency histogram: 5 % wide log buckets over microseconds
CONSUMER_CATCH_UP_S = 60.0


def _bucket(us: float) -> int:
    return int(math.log(us) / _BUCKET) if us >= 1 else 0


def _bucket_us(b: int) -> float:
    return math.exp((b + 1) * _BUCKET)


def percentile(hist: Counter[int], q: float) -> float:
    """The q-quantile (0..1) of a bucketed latency histogram, in µs (bucket upper edge)."""
    n = sum(hist.values())
    if n == 0:
        return 0.0
    want = q * n
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= want:
            return _bucket_us(b)
    return _bucket_us(max(hist))


@dataclass
class DemoOptions:
    producers: int = 2
    sync_producers: int = 2
    seconds: float | None = 10.0
    messages: int | None = None
    body_bytes: int = 256
    consumer: bool = False
    topic: str = "demo"


@dataclass
class KindStats:
    ok: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    hist: Counter[int] = field(default_factory=Counter)

    def add(self, ok: int, statuses: dict[str, int], hist: dict[int, int]) -> None:
        self.ok += ok
        self.statuses.update(statuses)
        self.hist.update(hist)

    @property
    def puts(self) -> int:
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        return self.puts - self.ok


@dataclass
class DemoSummary:
    run_id: str
    seconds: float
    puts: int
    ok: int
    failed: int
    puts_per_s: float
    statuses: dict[str, int]
    latency_us: dict[str, dict[str, float]]
    consumer: dict[str, Any] | None

    @property
    def good(self) -> bool:
        return self.failed == 0 and (self.consumer is None or bool(self.consumer["complete"]))

    def lines(self) -> list[str]:
        out = [
            f"demo {self.run_id}: {self.puts:,} puts in {self.seconds:.1f} s "
            f"({self.puts_per_s:,.0f}/s), {self.ok:,} ok, {self.failed:,} failed",
            "statuses: " + ", ".join(f"{k} {v:,}" for k, v in sorted(self.statuses.items())),
        ]
        for kind, lat in self.latency_us.items():
            out.append(
                f"{kind} put latency p50 / p99 / p99.9: {lat['p50']:,.0f} / {lat['p99']:,.0f}"
                f" / {lat['p999']:,.0f} µs ({lat['count']:,.0f} puts)"
            )
        if self.consumer is not None:
            cons = self.consumer
            out.append(
                f"consumer: read {cons['read']:,} of {cons['expected']:,} acknowledged, "
                f"{cons['duplicates']} duplicates, {cons['missing']} missing"
                + ("" if cons["complete"] else " - INCOMPLETE")
            )
        return out


# --- child processes ------------------------------------------------------------------------


def _body(run_id: str, producer: int, seq: int, size: int) -> bytes:
    head = f"{run_id}:{producer}:{seq}:".encode()
    return head + b"." * max(0, size - len(head))


def _producer(
    store_dir: str,
    run_id: str,
    index: int,
    sync: bool,
    opts: DemoOptions,
    quota: int | None,
    deadline: float | None,
    stop: Any,
    out: Any,
) -> None:
    """One producer process: put until the deadline, the quota or `stop`; report deltas."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    from mqstore.ipc.client import StoreClient

    kind = "sync" if sync else "async"
    ok = 0
    statuses: Counter[str] = Counter()
    hist: Counter[int] = Counter()
    failed_seqs: list[int] = []
    last = time.monotonic()
    seq = 0
    try:
        client = StoreClient.attach(store_dir)
    except (OSError, ValueError) as e:
        out.put(("error", index, f"producer {index}: {e}"))
        out.put(("done", index, kind, 0, {}, {}, []))
        return
    out.put(("ready", index))
    with client:
        while True:
            if quota is not None and seq >= quota:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if seq % 32 == 0 and stop.is_set():
                break
            t0 = time.perf_counter_ns()
            r = client.put(opts.topic, _body(run_id, index, seq, opts.body_bytes), wait_store=sync)
            hist[_bucket((time.perf_counter_ns() - t0) / 1000)] += 1
            statuses[r.status.name] += 1
            if r.ok:
                ok += 1
            else:
                failed_seqs.append(seq)
            seq += 1
            if now - last >= REPORT_S:
                out.put(("stat", index, kind, ok, dict(statuses), dict(hist)))
                ok, statuses, hist, last = 0, Counter(), Counter(), now
    out.put(("done", index, kind, ok, dict(statuses), dict(hist), failed_seqs))


class _QueueSource:
    """This run's records through `engine.reader` (the consume queues): pull every queue
    of the topic from where it ended when the run started."""

    def __init__(self, store_dir: str, topic: str, offsets: list[int] | None = None) -> None:
        from mqstore.conf.load import load_settings
        from mqstore.engine.reader import StoreReader

        settings = load_settings(Path(store_dir), None, os.environ).settings
        self.topic = topic
        self.reader = StoreReader.open(
            store_dir,
            settings,
            max_offset_fn=lambda: read_flushed_offset(store_dir) or 0,
        )
        self.queues = range(settings.default_topic_queue_nums)
        self.offsets = (
            list(offsets)
            if offsets is not None
            else [self.reader.max_offset(topic, q) for q in self.queues]
        )
        self.position = 0

    def poll(self) -> Any:
        from mqstore.engine.reader import GetStatus

        moving = (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE, GetStatus.OFFSET_FOUND_NULL)
        for q in self.queues:
            res = self.reader.get_messages(self.topic, q, self.offsets[q], 1000)
            if res.status in moving or res.status is GetStatus.MESSAGE_WAS_REMOVING:
                self.offsets[q] = res.next_offset
            for rec in res.messages:
                self.position = max(self.position, rec.physical_offset + rec.size)
                yield rec

    def close(self) -> None:
        self.reader.close()


def _consumer(
    store_dir: str,
    run_id: str,
    topic: str,
    queue_starts: list[int],
    expected: Any,
    stop: Any,
    out: Any,
) -> None:
    """Read back this run's messages up to the durable offset (the `flushed_offset`
    file); when `stop` is set, keep going until `expected` messages were seen, or
    CONSUMER_CATCH_UP_S have passed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prefix = f"{run_id}:".encode()
    seen: set[tuple[int, int]] = set()
    dups = 0
    src = _QueueSource(store_dir, topic, queue_starts)
    last = 0.0
    give_up = 0.0
    try:
        while True:
            got = 0
            for rec in src.poll():
                got += 1
                if rec.topic != topic or not rec.body.startswith(prefix):
                    continue
                _r, p, s, _rest = rec.body.split(b":", 3)
                key = (int(p), int(s))
                if key in seen:
                    dups += 1
                else:
                    seen.add(key)
            now = time.monotonic()
            if now - last >= REPORT_S:
                out.put(("cons", len(seen), dups, src.position))
                last = now
            if stop.is_set():
                give_up = give_up or now + CONSUMER_CATCH_UP_S
                if len(seen) >= expected.value or now >= give_up:
                    break
            if not got:
                time.sleep(0.005)
    finally:
        src.close()
    out.put(("cons_done", sorted(seen), dups, src.position))


# --- the parent -----------------------------------------------------------------------------


@dataclass
class _Live:
    kinds: dict[str, KindStats] = field(
        default_factory=lambda: {"sync": KindStats(), "async": KindStats()}
    )
    consumed: int = 0
    consumer_pos: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self, elapsed: float, window: Counter[str]) -> str:
        parts = []
        total = sum(k.puts for k in self.kinds.values())
        parts.append(f"{total:,} puts, {total / max(elapsed, 1e-6):,.0f}/s")
        for name, k in self.kinds.items():
            if k.puts:
                parts.append(f"{name} p99 {percentile(k.hist, 0.99):,.0f} µs")
        bad = {s: n for s, n in window.items() if s != "PUT_OK"}
        parts.append("all PUT_OK" if not bad else ", ".join(f"{s} {n}" for s, n in bad.items()))
        if self.consumed:
            parts.append(f"consumed {self.consumed:,}")
        return " | ".join(parts)


Extra = Callable[[], Any]


def run_demo(
    store_dir: str | os.PathLike[str],
    opts: DemoOptions,
    *,
    show: bool = True,
    extra: Extra | None = None,
) -> DemoSummary:
    """Run the load; `show` draws a rich progress bar (with `extra()`'s renderable under
    it, e.g. the store's status). Raises channel.SupervisorUnavailable."""
    store = os.path.realpath(os.fspath(store_dir))
    channel.request(store, {"op": "status"})  # SupervisorUnavailable before any process starts
    run_id = secrets.token_hex(4)
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    stop = ctx.Event()
    expected = ctx.Value("q", 1 << 62)
    queue_starts: list[int] = []
    if opts.consumer:  # where each queue ends before any put of this run
        first = _QueueSource(store, opts.topic)
        queue_starts = list(first.offsets)
        first.close()
    nprod = opts.producers + opts.sync_producers
    quotas: list[int | None] = [None] * nprod
    if opts.messages is not None:
        share, extra_n = divmod(opts.messages, max(nprod, 1))
        quotas = [share + (1 if i < extra_n else 0) for i in range(nprod)]
    procs = [
        ctx.Process(
            target=_producer,
            args=(store, run_id, i, i >= opts.producers, opts, quotas[i], None, stop, out),
            name=f"mqstore-demo-producer-{i}",
            daemon=True,
        )
        for i in range(nprod)
    ]
    cons = None
    if opts.consumer:
        cons = ctx.Process(
            target=_consumer,
            args=(store, run_id, opts.topic, queue_starts, expected, stop, out),
            name="mqstore-demo-consumer",
            daemon=True,
        )
    live = _Live()
    failed_seqs: set[tuple[int, int]] = set()
    acked_by: Counter[int] = Counter()
    cons_result: tuple[list[tuple[int, int]], int, int] | None = None
    done = 0
    for p in [*procs, *([cons] if cons else [])]:
        p.start()
    # The load's seconds count from when every producer has attached (or failed to):
    # starting a spawned interpreter can take longer than a short run on a busy machine.
    t0 = time.monotonic()
    deadline: float | None = None
    started = 0

    def handle(msg: tuple[Any, ...], window: Counter[str]) -> None:
        nonlocal done, cons_result, started, t0, deadline
        tag = msg[0]
        if tag in ("ready", "error"):
            started += 1
            if started == nprod:
                t0 = time.monotonic()
                deadline = None if opts.seconds is None else t0 + opts.seconds
        if tag in ("stat", "done"):
            k = live.kinds[msg[2]]
            k.add(msg[3], msg[4], {int(b): n for b, n in msg[5].items()})
            acked_by[msg[1]] += msg[3]
            window.update(msg[4])
            if tag == "done":
                done += 1
                failed_seqs.update((msg[1], s) for s in msg[6])
        elif tag == "cons":
            live.consumed, live.consumer_pos = msg[1], msg[3]
        elif tag == "cons_done":
            cons_result = ([tuple(x) for x in msg[1]], msg[2], msg[3])
            live.consumed = len(msg[1])
        elif tag == "error":
            live.errors.append(msg[2])

    progress_ctx: Any = contextlib.nullcontext()
    progress: Any = None
    if show:
        from rich.console import Group
        from rich.live import Live
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(
            TextColumn("[bold]demo"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
        )
        total = opts.messages if opts.messages is not None else (opts.seconds or 0)
        task = progress.add_task("demo", total=total)
        status_line = ["starting producers"]

        def renderable() -> Any:
            from rich.text import Text

            parts = [progress, Text(status_line[0], overflow="fold")]
            return Group(*parts, extra()) if extra is not None else Group(*parts)

        progress_ctx = Live(renderable(), refresh_per_second=4, transient=False)
    window: Counter[str] = Counter()
    try:
        with progress_ctx as lv:
            while done < nprod:
                now = time.monotonic()
                if deadline is not None and now >= deadline and not stop.is_set():
                    stop.set()
                with contextlib.suppress(queue.Empty):
                    handle(out.get(timeout=0.1), window)
                if not any(p.is_alive() for p in procs) and done < nprod:
                    with contextlib.suppress(queue.Empty):
                        while True:
                            handle(out.get(timeout=0.5), window)
                    if done < nprod:
                        live.errors.append("a producer process died without reporting")
                        break
                if progress is not None:
                    elapsed = time.monotonic() - t0
                    completed = (
                        sum(k.puts for k in live.kinds.values())
                        if opts.messages is not None
                        else min(elapsed, opts.seconds or 0)
                    )
                    progress.update(task, completed=completed)
                    status_line[0] = live.line(elapsed, window)
                    lv.update(renderable())
            stop.set()
            elapsed = time.monotonic() - t0
            if cons is not None:
                expected.value = sum(k.ok for k in live.kinds.values())
                while cons_result is None and cons.is_alive():
                    with contextlib.suppress(queue.Empty):
                        handle(out.get(timeout=0.1), window)
                    if progress is not None:
                        status_line[0] = live.line(elapsed, window) + " (consumer catching up)"
                        lv.update(renderable())
                with contextlib.suppress(queue.Empty):
                    while cons_result is None:
                        handle(out.get(timeout=1.0), window)
    except KeyboardInterrupt:
        stop.set()
        elapsed = time.monotonic() - t0
        deadline_join = time.monotonic() + 30
        while done < nprod and time.monotonic() < deadline_join:
            with contextlib.suppress(queue.Empty, KeyboardInterrupt):
                handle(out.get(timeout=0.1), window)
    finally:
        stop.set()
        for p in [*procs, *([cons] if cons else [])]:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        out.close()
        out.join_thread()
    puts = sum(k.puts for k in live.kinds.values())
    ok = sum(k.ok for k in live.kinds.values())
    statuses: Counter[str] = Counter()
    for k in live.kinds.values():
        statuses.update(k.statuses)
    lat = {
        name: {
            "count": float(k.puts),
            "p50": round(percentile(k.hist, 0.5), 1),
            "p99": round(percentile(k.hist, 0.99), 1),
            "p999": round(percentile(k.hist, 0.999), 1),
        }
        for name, k in live.kinds.items()
        if k.puts
    }
    consumer_doc = None
    if opts.consumer:
        got = set(cons_result[0]) if cons_result else set()
        dups = cons_result[1] if cons_result else 0
        acked_missing = 0
        # every acknowledged (producer, seq) must have been read; a failed put may or
        # may not be in the log (a flush timeout is written, not promised)
        for pidx, n_ok in acked_by.items():
            total_p = n_ok + sum(1 for f in failed_seqs if f[0] == pidx)
            for s in range(total_p):
                if (pidx, s) not in failed_seqs and (pidx, s) not in got:
                    acked_missing += 1
        consumer_doc = {
            "read": len(got),
            "expected": ok,
            "duplicates": dups,
            "missing": acked_missing,
            "complete": cons_result is not None and acked_missing == 0 and dups == 0,
        }
    return DemoSummary(
        run_id=run_id,
        seconds=round(elapsed, 3),
        puts=puts,
        ok=ok,
        failed=puts - ok + len(live.errors),
        puts_per_s=round(puts / max(elapsed, 1e-6), 1),
        statuses=dict(statuses),
        latency_us=lat,
        consumer=consumer_doc,
    )


# --- the command ----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory of a running supervisor")
    p.add_argument("--producers", type=int, default=2, help="async producers (default 2)")
    p.add_argument("--sync-producers", type=int, default=2, help="sync producers (default 2)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--seconds", type=float, default=None, help="run this long (default 10)")
    g.add_argument("--messages", type=int, default=None, help="put this many in all")
    p.add_argument("--body-bytes", type=int, default=256, help="message body size (256)")
    p.add_argument("--consumer", action="store_true", help="read back and verify the puts")
    p.add_argument("--topic", default="demo", type=topic_arg, help="topic to put to (default demo)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON doc")


def options_from(args: argparse.Namespace) -> DemoOptions:
    """The options of the command line (each of DemoOptions' fields is an argument); 10 s
    when neither --seconds nor --messages bounds the run."""
    given = {f.name: getattr(args, f.name) for f in fields(DemoOptions)}
    if given["seconds"] is None and given["messages"] is None:
        given["seconds"] = 10.0
    return DemoOptions(**given)


def run(args: argparse.Namespace) -> int:
    opts = options_from(args)
    if opts.producers < 0 or opts.sync_producers < 0 or opts.producers + opts.sync_producers == 0:
        print("mqstore demo: need at least one producer", file=sys.stderr)
        return 2
    try:
        with stop_signals():
            summary = run_demo(args.store_dir, opts, show=not args.json and sys.stdout.isatty())
    except channel.SupervisorUnavailable as e:
        print(f"mqstore demo: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**asdict(summary), "good": summary.good}, indent=2))
    else:
        print("\n".join(summary.lines()))
    return 0 if summary.good else 1
