"""`mqstore bench [names...] [--quick]`: run the benchmarks (`python -m bench`) and write
bench/results/REPORT.md (`python -m bench.summary`), both from the source tree."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

NAME = "bench"
HELP = "run the benchmarks (bench/) and write bench/results/REPORT.md"

REPO = Path(__file__).resolve().parent.parent.parent


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="benchmarks (default: all; see python -m bench -h)")
    p.add_argument("--quick", action="store_true", help="tiny durations: a smoke run")
    p.add_argument("--out", type=Path, default=None, help="results directory (bench/results)")
    p.add_argument("--dir", type=Path, default=None, help="parent of the temporary bench dir")
    p.add_argument(
        "--report-only", action="store_true", help="only rewrite REPORT.md from the results"
    )


def run(args: argparse.Namespace) -> int:
    if not (REPO / "bench" / "__main__.py").is_file():
        print("mqstore bench: needs the source tree (bench/ not found)", file=sys.stderr)
        return 2
    out = ["--out", str(args.out)] if args.out else []
    code = 0
    if not args.report_only:
        argv = [sys.executable, "-m", "bench", *args.names, *out]
        if args.quick:
            argv.append("--quick")
        if args.dir:
            argv += ["--dir", str(args.dir)]
        code = subprocess.call(argv, cwd=REPO)
    summary = subprocess.call([sys.executable, "-m", "bench.summary", *out], cwd=REPO)
    return code or summary
