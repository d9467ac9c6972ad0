"""Run N producer processes against one target for a fixed time; collect rate and latency.

Every benchmark in `bench/` (the peers and mqstore's own puts) measures the same way:

1. The parent forks `producers` children. Each child calls `factory(index, params)`,
   which does its setup (open the database, attach the client, build the body) and
   returns a `Producer`: a callable doing one operation and returning how many messages
   it wrote (1 for a put, K for a batch of K), plus a `close`.
2. All children and the parent meet at a barrier, so that setup is never timed.
3. Each child runs operations until its own clock passes `duration_s`, timing every
   operation with `time.perf_counter_ns` (CLOCK_MONOTONIC, one clock for the whole
   machine), and writes its latencies (ns, int64) and counts to files in `work_dir`.
4. The parent joins the children (killing, by pid, any that overstay), merges the
   files, and returns a `RunResult`: messages / (last end - first start) and latency
   p50 / p99 / max over every operation of every producer.

The cost of the timing itself (two clock reads and an array append, ~0.1 µs) is paid by
every benchmark alike. Children that fail make the run fail: a benchmark that cannot
run says so rather than report a figure.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import time
import traceback
from array import array
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

NO_LIMIT = 1 << 62  # `max_messages` of a run bounded by its time only


class Producer(Protocol):
    def __call__(self) -> int:
        """Do one operation; return how many messages it wrote."""
        ...

    def close(self) -> None: ...


class FnProducer:
    """A `Producer` from a step function and an optional close function."""

    def __init__(self, step: Callable[[], int], close: Callable[[], None] | None = None) -> None:
        self._step = step
        self._close = close

    def __call__(self) -> int:
        return self._step()

    def close(self) -> None:
        if self._close is not None:
            self._close()


ProducerFactory = Callable[[int, Mapping[str, Any]], Producer]


# The points of the latency distribution every run keeps (the report's CDF plot).
CDF_QUANTILES: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999,
    0.9999, 1.0,
)  # fmt: skip


class BenchError(RuntimeError):
    """A benchmark could not run (a child failed, timed out, or a put was refused)."""


@dataclass
class RunResult:
    """One measured configuration."""

    name: str
    producers: int
    messages: int
    operations: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    lat_p50_us: float
    lat_p99_us: float
    lat_max_us: float
    lat_mean_us: float
    body_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)
    # latency (µs) at each of CDF_QUANTILES, per operation (a batch call counts once)
    lat_cdf_us: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("seconds", "msgs_per_s", "mb_per_s"):
            d[k] = round(d[k], 4 if k == "seconds" else 1)
        for k in ("lat_p50_us", "lat_p99_us", "lat_max_us", "lat_mean_us"):
            d[k] = round(d[k], 2)
        d["lat_cdf_us"] = [round(x, 2) for x in self.lat_cdf_us]
        return d


def _child(
    index: int,
    factory: ProducerFactory,
    params: Mapping[str, Any],
    barrier: Any,
    duration_ns: int,
    max_messages: int,
    work_dir: str,
) -> None:
    out = Path(work_dir)
    try:
        producer = factory(index, params)
    except BaseException:
        (out / f"err-{index}.txt").write_text(traceback.format_exc())
        barrier.abort()
        os._exit(2)
    lat = array("q")
    add = lat.append
    clock = time.perf_counter_ns
    count = 0
    ops = 0
    try:
        barrier.wait(timeout=300)
        start = clock()
        deadline = start + duration_ns
        now = start
        while now < deadline and count < max_messages:
            count += producer()
            t = clock()
            add(t - now)
            now = t
            ops += 1
        end = now
        producer.close()
    except BaseException:
        (out / f"err-{index}.txt").write_text(traceback.format_exc())
        barrier.abort()
        os._exit(3)
    (out / f"lat-{index}.bin").write_bytes(lat.tobytes())
    (out / f"res-{index}.json").write_text(
        json.dumps({"messages": count, "operations": ops, "start_ns": start, "end_ns": end})
    )
    os._exit(0)


def run_producers(
    name: str,
    factory: ProducerFactory,
    params: Mapping[str, Any],
    *,
    producers: int,
    duration_s: float,
    work_dir: Path,
    body_bytes: int,
    max_messages: int = NO_LIMIT,
    bytes_per_message: int | None = None,
) -> RunResult:
    """Fork `producers` children running `factory`'s producer for `duration_s`; merge.

    `max_messages` caps each producer (for runs that must write a bounded amount).
    `bytes_per_message` (default `body_bytes`) is what MB/s counts.
    Raises BenchError if any child fails or overstays by a minute.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    for f in work_dir.glob("*"):
        if f.name.startswith(("lat-", "res-", "err-")):
            f.unlink()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(producers + 1)
    procs = [
        ctx.Process(
            target=_child,
            args=(
                i,
                factory,
                params,
                barrier,
                int(duration_s * 1e9),
                max_messages,
                str(work_dir),
            ),
            daemon=True,
        )
        for i in range(producers)
    ]
    for p in procs:
        p.start()
    try:
        # a child's failure aborts the barrier; its error file says why
        with contextlib.suppress(Exception):
            barrier.wait(timeout=300)
        limit = time.monotonic() + duration_s + 60
        for p in procs:
            p.join(timeout=max(0.1, limit - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=10)
    errors = [p.read_text() for p in sorted(work_dir.glob("err-*.txt"))]
    if errors:
        # the producer that failed first; the others saw only the barrier break
        errors.sort(key=lambda t: "BrokenBarrierError" in t)
        raise BenchError(f"{name}: producer failed:\n{errors[0]}")
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise BenchError(f"{name}: producers exited with {bad}")
    results = [json.loads((work_dir / f"res-{i}.json").read_text()) for i in range(producers)]
    lats = [
        np.frombuffer((work_dir / f"lat-{i}.bin").read_bytes(), dtype=np.int64)
        for i in range(producers)
    ]
    for i in range(producers):
        (work_dir / f"lat-{i}.bin").unlink()
        (work_dir / f"res-{i}.json").unlink()
    lat_all = np.concatenate(lats) if lats else np.zeros(0, dtype=np.int64)
    messages = sum(int(r["messages"]) for r in results)
    ops = sum(int(r["operations"]) for r in results)
    start = min(int(r["start_ns"]) for r in results)
    end = max(int(r["end_ns"]) for r in results)
    seconds = max(1e-9, (end - start) / 1e9)
    per_msg = body_bytes if bytes_per_message is None else bytes_per_message
    cdf: list[float] = []
    if lat_all.size:
        p50, p99 = (float(x) / 1e3 for x in np.percentile(lat_all, [50, 99]))
        lat_max = float(lat_all.max()) / 1e3
        lat_mean = float(lat_all.mean()) / 1e3
        cdf = [float(x) / 1e3 for x in np.quantile(lat_all, CDF_QUANTILES)]
    else:
        p50 = p99 = lat_max = lat_mean = 0.0
    return RunResult(
        name=name,
        producers=producers,
        messages=messages,
        operations=ops,
        seconds=seconds,
        msgs_per_s=messages / seconds,
        mb_per_s=messages * per_msg / seconds / 1e6,
        lat_p50_us=p50,
        lat_p99_us=p99,
        lat_max_us=lat_max,
        lat_mean_us=lat_mean,
        body_bytes=body_bytes,
        extra={"load_1m": round(os.getloadavg()[0], 2)},
        lat_cdf_us=cdf,
    )
