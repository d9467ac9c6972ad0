"""The benchmark harness: `python -m bench [names...] [--quick]` (`make bench`).

Benchmarks, run in this order (the put benchmark reuses the peers' figures of the same
run, and measures them itself when run alone):

* `peers`:  SQLite, LMDB, fdatasync appends, the disk (`bench/peers.py`);
* `put`:    mqstore's put through the public client, sync/async, pool on/off, batch,
            memory (`bench/bench_put.py`); needs the runtime (`mqstore start`);
* `append`: the engine's single-process append (`bench/bench_append.py`);
* `pull`:   one consumer's pull() against one producer's async put, same store
            (`bench/bench_pull.py`); needs the runtime.

Each writes `bench/results/<name>.json`, `<name>.md` (table, goals and their ratios,
command, git commit, machine) and `<name>.png`. Stores and peer files go under one
temporary directory (`--dir` chooses its parent; it must be on the disk being measured),
removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import bench_pull, bench_put, peers, report
from bench.options import Options
from bench.procs import BenchError
from bench.report import RESULTS, Column, Report


def _append(opts: Options) -> Report | None:
    """Issue 2's append benchmark, run as it is; the harness adds only the plot."""
    from bench import bench_append

    argv = ["--quick"] if opts.quick else []
    argv += ["--dir", str(opts.work_root)]
    if opts.shared.get("out_dir") != RESULTS:
        argv.append("--no-save")
    code = bench_append.main(argv)
    if code != 0:
        raise BenchError(f"bench_append exited with {code}")
    path = RESULTS / "append.json"
    if "--no-save" in argv or not path.is_file():
        return None
    doc = json.loads(path.read_text())
    rows = [
        {**r, "label": f"{r['body_bytes']} B {r['path'].split(' ')[0]}"}
        for r in doc["rows"]
        if r.get("ratio_to_floor") is not None
    ]
    rep = Report(
        name="append",
        title="Single-process append (engine)",
        method=[],
        columns=[Column("label", "run", "{}")],
        rows=rows,
    )
    import matplotlib

    matplotlib.use("Agg")
    report.plot(rep, RESULTS / "append.png")
    return None


BENCHMARKS: dict[str, Callable[[Options], Report | None]] = {
    "peers": peers.benchmark,
    "put": bench_put.benchmark,
    "append": _append,
    "pull": bench_pull.benchmark,
}


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("names", nargs="*", help=f"benchmarks (default: all): {', '.join(BENCHMARKS)}")
    ap.add_argument("--quick", action="store_true", help="tiny durations: a smoke run")
    ap.add_argument("--duration", type=float, default=None, help="seconds per configuration")
    ap.add_argument(
        "--producers",
        default=None,
        help="producer counts for the put benchmark, comma separated (default 1,2,4,16,64)",
    )
    ap.add_argument(
        "--keys",
        choices=("unique", "fixed"),
        default="unique",
        help="put: a KEYS value per message (default) or one per producer",
    )
    ap.add_argument(
        "--sync-only",
        action="store_true",
        help="put: only the sync rows and their goals (no async, batch or memory runs)",
    )
    ap.add_argument("--dir", default=None, help="parent of the temporary bench directory")
    ap.add_argument("--out", default=str(RESULTS), help="where results are written")
    args = ap.parse_args(args_list)
    names = args.names or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; known: {list(BENCHMARKS)}")
    names = [n for n in BENCHMARKS if n in names]
    out_dir = Path(args.out).resolve()
    command = " ".join(["python -m bench", *args_list])
    work_root = Path(tempfile.mkdtemp(prefix="mqstore-bench-", dir=args.dir))
    opts = Options(
        quick=args.quick,
        work_root=work_root,
        duration_s=args.duration,
        producers=tuple(int(x) for x in args.producers.split(",")) if args.producers else None,
        unique_keys=args.keys == "unique",
        sync_only=args.sync_only,
    )
    opts.shared["out_dir"] = out_dir
    failed: list[str] = []
    try:
        for name in names:
            opts.log(f"== {name}")
            try:
                rep = BENCHMARKS[name](opts)
            except BenchError as e:
                opts.log(f"!! {name} failed: {e}")
                failed.append(name)
                continue
            except Exception:
                opts.log(f"!! {name} failed:\n{traceback.format_exc()}")
                failed.append(name)
                continue
            if rep is None:
                continue
            paths = report.write(rep, command=command, bench_dir=work_root, out_dir=out_dir)
            if rep.goals:
                opts.log(report.goal_table(rep.goals))
            opts.log(f"   wrote {', '.join(str(p) for p in paths.values())}")
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
