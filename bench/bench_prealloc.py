"""Issue 12, item 6: under SYNC_FLUSH, is a new segment better only fallocated, or also
written with zeros by the allocator (off the hot path)?

    python -m bench.bench_prealloc [--duration 3] [--producers 1 16 64] [--no-save]

A fallocated file has unwritten extents: the first fdatasync after writing into each of
them must also commit the journal (the extent becomes written). Zeros written ahead (here
by the allocator's warm-up, `warm_mapped_file_enable`: a zero per page through the
mapping, forced every `flush_least_pages_when_warm` pages, RocketMQ's warmMappedFile)
leave fdatasync nothing but data. Each configuration runs sync puts through the public
client on a fresh store, the two kinds of file side by side in the same run, with the
real allocator, committer and flusher. Writes `bench/results/prealloc.{md,json,png}`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench import report
from bench.bench_put import put_run
from bench.report import (
    FSYNC_COLUMNS,
    RATE_COLUMNS,
    RESULTS,
    Column,
    Report,
    command_line,
    latency_columns,
)

KINDS = {"fallocate only": {}, "zeros written": {"warm_mapped_file_enable": True}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_prealloc", description=__doc__)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--producers", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--pool", choices=("on", "off"), default="off")
    ap.add_argument("--dir", type=Path, default=None, help="parent of the stores (the disk)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqs-prealloc-", dir=args.dir))
    rows: list[dict[str, Any]] = []
    try:
        for n in args.producers:
            for kind, extra in KINDS.items():
                r = put_run(
                    root, sync=True, pool=args.pool == "on", producers=n,
                    duration_s=args.duration, extra=extra, tag="_zeros" if extra else "",
                )  # fmt: skip
                row = {**r.to_dict(), **r.extra, "label": kind}
                rows.append(row)
                print(
                    f"{kind:15} x{n:<3} {r.msgs_per_s:10,.0f} msgs/s  p99 {r.lat_p99_us:9,.0f} µs"
                )
        notes = []
        for n in args.producers:
            got = {r["label"]: r["msgs_per_s"] for r in rows if r["producers"] == n}
            ratio = got["zeros written"] / got["fallocate only"]
            notes.append(f"{n} producers: zeros written / fallocate only = {ratio:.2f}x")
        rep = Report(
            name="prealloc",
            title="Segment pre-allocation under SYNC_FLUSH: fallocate only vs zeros written",
            method=[
                f"sync puts (SYNC_FLUSH, wait_store), 1 KiB bodies, pool {args.pool}, "
                f"{args.duration:g} s per configuration, a fresh store each;",
                "zeros written = the allocator's warm-up (warm_mapped_file_enable) on every "
                "new segment, including those made at boot.",
            ],
            columns=[
                Column("label", "segments", "{}"),
                Column("producers", "producers"),
                RATE_COLUMNS[0],
                *latency_columns()[:2],
                *FSYNC_COLUMNS,
            ],
            rows=rows,
            notes=notes,
        )
        print("\n".join(notes))
        if not args.no_save:
            cmd = command_line("bench.bench_prealloc", argv)
            report.write(rep, command=cmd, bench_dir=root, out_dir=RESULTS)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
