"""Which stage holds a message back from readers: the log's positions, sampled.

    python -m bench.trace_positions STORE_DIR [--every-ms 1] [--seconds 60] [--out FILE]
    python -m bench.trace_positions --report FILE [--last-put EPOCH_S]

Attaches to a running store's control block (read only) and writes one line every
`--every-ms`: the wall time, then `reserved`, `published`, `committed`, `flushed` and
`dispatched`, until the store stops or `--seconds` pass. Under ASYNC_FLUSH a message is
pullable once `dispatched` passes it; `dispatched` can only follow `committed` (pool on)
or `published` (pool off). `--report` reads such a file: for each position the longest
times it stood still, and at `--last-put` (a producer's last put, epoch seconds) how far
each stage trailed the one before it. The stage with the large gap at the last put is
the tail: published - committed is the committer (its CPU, its run-queue wait),
committed - dispatched the dispatcher (`bench/results/dispatch_lag.md`).
"""

from __future__ import annotations

import argparse
import time
from itertools import pairwise
from pathlib import Path

from mqstore.ipc import control as c
from mqstore.ipc.access import read_names
from mqstore.ipc.control_views import Positions

COLUMNS = ("reserved", "published", "committed", "flushed", "dispatched")


def sample(store_dir: str, out: Path, every_s: float, seconds: float) -> int:
    """Write the positions every `every_s` until the store stops or `seconds` pass;
    return the lines written."""
    names = read_names(store_dir)
    cb = c.ControlBlock.attach(names["ctl"], names.get("pool") or "")
    pos = Positions(cb)
    n = 0
    end = time.monotonic() + seconds
    try:
        with out.open("w") as f:
            while time.monotonic() < end:
                row = (pos.reserved, pos.published, pos.committed, pos.flushed, pos.dispatched)
                f.write(f"{time.time():.4f} {' '.join(map(str, row))}\n")
                n += 1
                if not (Path(store_dir) / ".mqstore-ipc.json").exists():
                    break
                time.sleep(every_s)
    finally:
        cb.close()
    return n


def report(path: Path, last_put: float | None) -> list[str]:
    """The report `--report` prints (module doc)."""
    rows = [[float(v) for v in line.split()] for line in path.read_text().splitlines() if line]
    if not rows:
        return ["no samples"]
    t0 = rows[0][0] if last_put is None else last_put
    out = [f"{len(rows)} samples over {rows[-1][0] - rows[0][0]:.2f} s"]
    for col, name in enumerate(COLUMNS, start=1):
        moves = [r[0] for a, r in pairwise(rows) if r[col] != a[col]]
        still = sorted(((b - a, a - t0) for a, b in pairwise(moves)), reverse=True)
        shown = ", ".join(f"{d * 1000:.0f} ms at {at:+.2f} s" for d, at in still[:5])
        out.append(f"{name:10} longest still: {shown or '-'}")
    if last_put is not None:
        at = next((r for r in rows if r[0] >= last_put), rows[-1])
        mb = [(at[i] - at[i + 1]) / 1e6 for i in (1, 2)] + [(at[3] - at[5]) / 1e6]
        out.append(
            f"at the last put: reserved-published {mb[0]:.1f} MB, published-committed "
            f"{mb[1]:.1f} MB, committed-dispatched {mb[2]:.1f} MB"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.trace_positions", description=__doc__)
    ap.add_argument("store", nargs="?")
    ap.add_argument("--every-ms", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("positions.txt"))
    ap.add_argument("--report", type=Path)
    ap.add_argument("--last-put", type=float)
    args = ap.parse_args()
    if args.report is not None:
        print("\n".join(report(args.report, args.last_put)))
        return 0
    if not args.store:
        ap.error("a store directory, or --report FILE")
    n = sample(args.store, args.out, args.every_ms / 1000, args.seconds)
    print(f"{n} samples in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
