"""Issue 22, item 4: `AsyncStoreClient`'s puts against the blocking client's, same run.

    python -m bench.bench_aio [--n 60000] [--sync-n 20000] [--no-sync] [--no-save]

One producer process per store (a fresh Python, the store's real workers), 1 KiB bodies.
ASYNC_FLUSH: for each call shape (the README's `put(t, body, tags="t", keys=[k])`, and
`keys=k` as a str), `--n` puts three ways, interleaved over two rounds (the best round
counts): blocking `StoreClient.put` one by one; `await AsyncStoreClient.put(...)` one by
one; `asyncio.gather` of `--gather` puts at a time. SYNC_FLUSH: `--sync-n` puts from
`--threads` blocking threads (a StoreClient each) against `asyncio.gather` of
`--gather` awaited sync puts from one loop. Rates and the producer's CPU per put, and
asyncio's own floor: `gather` of futures already resolved, no put (the notes give the
best ratio any gathered put could reach over it).
Goals (ASYNC, README shape): awaited one by one >= 0.5x blocking; gathered >= 0.9x.
Writes `bench/results/aio.{md,json,png}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import report
from bench.report import Column, Goal, Report, command_line
from bench.store_run import REPO, running_store

PAD = b"x" * 1000
# A few hundred MiB of disk, not GiB files; a disk other jobs fill up to 90% (where a
# store refuses writes by default) still takes a run.
STORE_CONFIG = {"segment_size_bytes": 128 << 20, "disk_space_warning_level_ratio": 0.98}
SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    "readme": lambda i: {"tags": "t", "keys": [f"k{i}"]},
    "str_key": lambda i: {"tags": "t", "keys": f"k{i}"},
}


def _bodies(n: int) -> list[bytes]:
    return [b"%023d|" % i + PAD for i in range(n)]


class _Window:
    """The timed part of one way, after its clients are attached: wall and CPU time."""

    def __enter__(self) -> _Window:
        self.c0, self.t0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.cpu_s = time.process_time() - self.c0

    def figures(self, n: int, bad: list[Any]) -> dict[str, Any]:
        """Rate and CPU per put; `bad`: the puts that were not PUT_OK (the first named)."""
        first = f"{bad[0].status.name}: {bad[0].reason}" if bad else ""
        return {
            "msgs_per_s": n / self.seconds,
            "cpu_us": self.cpu_s / n * 1e6,
            "bad": len(bad),
            "first_bad": first,
        }


class _Best(dict[str, dict[str, Any]]):
    """Each way's best round."""

    def keep(self, name: str, got: dict[str, Any]) -> None:
        if name not in self or got["msgs_per_s"] > self[name]["msgs_per_s"]:
            self[name] = got


def _async_child(store: str, n: int, gather: int) -> dict[str, dict[str, Any]]:
    from mqstore import AsyncStoreClient, PutMessageStatus, StoreClient

    OK = PutMessageStatus.PUT_OK
    bodies = _bodies(n)
    out = _Best()

    async def awaited(aio: Any, kw: list[dict[str, Any]]) -> dict[str, Any]:
        bad = []
        with _Window() as w:
            for i in range(n):
                r = await aio.put("t", bodies[i], **kw[i])
                if r.status is not OK:
                    bad.append(r)
        return w.figures(n, bad)

    async def gathered(aio: Any, kw: list[dict[str, Any]]) -> dict[str, Any]:
        bad = []
        with _Window() as w:
            for lo in range(0, n, gather):
                rs = await asyncio.gather(
                    *(aio.put("t", bodies[i], **kw[i]) for i in range(lo, min(n, lo + gather)))
                )
                bad += [r for r in rs if r.status is not OK]
        return w.figures(n, bad)

    async def on_loop(way: Callable[[Any, list[dict[str, Any]]], Any], kw: Any) -> Any:
        async with AsyncStoreClient.attach(store) as aio:
            await aio.put("warm", PAD)
            return await way(aio, kw)

    with StoreClient.attach(store) as client:
        for _ in range(2000):
            client.put("warm", PAD)
        for _round in range(2):
            for shape, args in SHAPES.items():
                kw = [args(i) for i in range(n)]
                bad = []
                with _Window() as w:
                    for i in range(n):
                        r = client.put("t", bodies[i], **kw[i])
                        if r.status is not OK:
                            bad.append(r)
                out.keep(f"{shape} blocking", w.figures(n, bad))
                for name, way in (("awaited", awaited), ("gathered", gathered)):
                    out.keep(f"{shape} {name}", asyncio.run(on_loop(way, kw)))
            out.keep("gather floor (resolved futures, no put)", asyncio.run(_floor(n, gather)))
    return out


async def _floor(n: int, gather: int) -> dict[str, Any]:
    """asyncio's own part of a gathered put: `asyncio.gather` of futures already
    resolved, with no put at all (what no put path can go below)."""
    loop = asyncio.get_running_loop()

    def done(i: int) -> asyncio.Future[int]:
        fut = loop.create_future()
        fut.set_result(i)
        return fut

    with _Window() as w:
        for lo in range(0, n, gather):
            await asyncio.gather(*(done(i) for i in range(lo, min(n, lo + gather))))
    return w.figures(n, [])


def _sync_child(store: str, n: int, gather: int, threads: int) -> dict[str, dict[str, Any]]:
    from mqstore import AsyncStoreClient, PutMessageStatus, StoreClient

    OK = PutMessageStatus.PUT_OK
    bodies = _bodies(n)
    kw = [SHAPES["readme"](i) for i in range(n)]
    per = n // threads
    out = _Best()

    def blocking() -> dict[str, Any]:
        bad: list[Any] = []
        go = threading.Barrier(threads + 1)  # and this thread: once all are attached

        def run(k: int) -> None:
            with StoreClient.attach(store) as c:
                go.wait()
                for i in range(k * per, (k + 1) * per):
                    r = c.put("t", bodies[i], **kw[i])
                    if r.status is not OK:
                        bad.append(r)

        ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        go.wait()
        with _Window() as w:
            for t in ts:
                t.join()
        return w.figures(per * threads, bad)

    async def gathered() -> dict[str, Any]:
        bad = []
        async with AsyncStoreClient.attach(store) as aio:
            with _Window() as w:
                for lo in range(0, per * threads, gather):
                    hi = min(per * threads, lo + gather)
                    rs = await asyncio.gather(
                        *(aio.put("t", bodies[i], **kw[i]) for i in range(lo, hi))
                    )
                    bad += [r for r in rs if r.status is not OK]
        return w.figures(per * threads, bad)

    for _round in range(2):
        out.keep(f"sync blocking x{threads} threads", blocking())
        out.keep("sync gathered", asyncio.run(gathered()))
    return out


def _child(store: Path, args: argparse.Namespace, sync: bool) -> dict[str, dict[str, Any]]:
    argv = [sys.executable, "-m", "bench.bench_aio", "--child", str(store)]
    argv += ["--n", str(args.sync_n if sync else args.n), "--gather", str(args.gather)]
    argv += ["--threads", str(args.threads)] + (["--child-sync"] if sync else [])
    got = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=1800)
    if got.returncode != 0 or got.stderr.strip():
        raise SystemExit(f"producer failed ({got.returncode}):\n{got.stderr[-2000:]}")
    doc: dict[str, dict[str, Any]] = json.loads(got.stdout.strip().splitlines()[-1])
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_aio", description=__doc__)
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--sync-n", type=int, default=20_000)
    ap.add_argument("--gather", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--no-sync", action="store_true")
    ap.add_argument("--dir", type=Path, default=None, help="parent of the stores (the disk)")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--child", type=str, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-sync", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        if args.child_sync:
            doc = _sync_child(args.child, args.n, args.gather, args.threads)
        else:
            doc = _async_child(args.child, args.n, args.gather)
        print(json.dumps(doc))
        return 0
    root = Path(tempfile.mkdtemp(prefix="mqs-aio-", dir=args.dir))
    rows: list[dict[str, Any]] = []
    try:
        with running_store(root, "async", sync=False, pool=True, extra=STORE_CONFIG) as run:
            got = _child(run.store_dir, args, sync=False)
        if not args.no_sync:
            with running_store(root, "sync", sync=True, pool=True, extra=STORE_CONFIG) as run:
                got.update(_child(run.store_dir, args, sync=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for label, m in got.items():
        rows.append({"label": label, **m})
        line = f"{label:32} {m['msgs_per_s']:10,.0f} msgs/s  {m['cpu_us']:6.1f} µs CPU/put"
        print(f"{line}  bad {m['bad']:.0f} {m['first_bad']}".rstrip())

    def rate(label: str) -> float:
        return float(got[label]["msgs_per_s"])

    base = rate("readme blocking")
    goals = [
        Goal("README shape, awaited one by one", rate("readme awaited"), 0.5 * base, "msgs/s",
             basis="0.5x blocking, same run"),
        Goal("README shape, gathered", rate("readme gathered"), 0.9 * base, "msgs/s",
             basis="0.9x blocking, same run"),
    ]  # fmt: skip
    notes = []
    for shape in SHAPES:
        blocking = rate(f"{shape} blocking")
        notes.append(
            f"{shape}: awaited / blocking = {rate(f'{shape} awaited') / blocking:.2f}, "
            f"gathered / blocking = {rate(f'{shape} gathered') / blocking:.2f}"
        )
    floor_us = got["gather floor (resolved futures, no put)"]["cpu_us"]
    for shape in SHAPES:
        put_us = got[f"{shape} blocking"]["cpu_us"]
        notes.append(
            f"{shape}: gathered can reach at most {put_us / (put_us + floor_us):.2f}x blocking "
            f"(CPU: a blocking put {put_us:.2f} µs + asyncio.gather's own {floor_us:.2f} µs "
            "per future)"
        )
    sync_blocking = f"sync blocking x{args.threads} threads"
    if sync_blocking in got:
        notes.append(
            f"SYNC_FLUSH: gathered / {args.threads} blocking threads = "
            f"{rate('sync gathered') / rate(sync_blocking):.2f}"
        )
    print("\n".join(notes))
    print(
        "goals: "
        + ", ".join(f"{g.name} {g.ratio:.2f} ({'met' if g.met else 'NOT met'})" for g in goals)
    )
    if any(m["bad"] for m in got.values()):
        print("some puts were not PUT_OK")
        return 1
    if not args.no_save:
        rep = Report(
            name="aio",
            title="AsyncStoreClient puts against the blocking client's, same run",
            method=[
                f"one producer process, 1 KiB bodies; ASYNC_FLUSH: {args.n} puts per way and "
                f"shape, best of two interleaved rounds; gathered: asyncio.gather of "
                f"{args.gather} at a time; both shapes (README: keys as a list; `str_key`: "
                "keys as a str) are one C call; a gathered put pays asyncio.gather's own "
                "cost per future (the floor row: gather of resolved futures, no put), which "
                "bounds gathered / blocking from above (notes);",
                f"SYNC_FLUSH (pool on): {args.sync_n} README-shape puts from {args.threads} "
                f"blocking threads, a StoreClient each, against gather of {args.gather} "
                "on one loop.",
            ],
            columns=[
                Column("label", "way", "{}"),
                Column("msgs_per_s", "msgs/s"),
                Column("cpu_us", "CPU µs/put", "{:.1f}"),
            ],
            rows=rows,
            goals=goals,
            notes=notes,
        )
        report.write(rep, command=command_line("bench.bench_aio", argv), bench_dir=root)
    return 0 if all(g.met for g in goals) else 1


if __name__ == "__main__":
    raise SystemExit(main())
