"""Where a pull's time goes: cProfile of one consumer draining a store through `pull()`.

    python -m bench.profile_pull [--messages N] [--max-count 32] [--zero-copy]
                                 [--pool on|off] [--top 25] [--save]

Starts a fresh ASYNC_FLUSH store (as the pull benchmark does), puts `--messages` 1 KiB
messages (tag, unique key) from this process, waits until they are all pullable, reads
them all once without the profiler (the rate), then again under cProfile, and prints the
functions by own time. `--save` writes `bench/results/profile_pull_<label>.txt` (the
command, commit and machine in its head): the evidence where the pull goal is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from bench.bench_pull import QUEUES, _wait_pullable
from bench.profiles import add_profile_arguments, profile_run, profiled_client, report_profile
from bench.store_run import BODY_BYTES, TAGS, TOPIC


def _drain(client: Any, ends: list[int], max_count: int, zero_copy: bool) -> int:
    """Pull every queue from 0 to its end, round robin; the messages read."""
    extra = {"zero_copy": True} if zero_copy else {}
    offsets = [0] * QUEUES
    n = 0
    while any(offsets[q] < ends[q] for q in range(QUEUES)):
        for q in range(QUEUES):
            if offsets[q] < ends[q]:
                got = client.pull(TOPIC, q, offsets[q], max_count, **extra)
                n += len(got.messages)
                offsets[q] = got.next_offset
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_pull", description=__doc__)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--max-count", type=int, default=32)
    ap.add_argument("--zero-copy", action="store_true")
    add_profile_arguments(ap)
    args = ap.parse_args(argv)
    with profiled_client(args, sync=False) as client:
        body = os.urandom(BODY_BYTES)
        refused: dict[str, int] = {}
        for i in range(args.messages):
            r = client.put(TOPIC, body, tags=TAGS, keys=f"k{i}")
            if not r.ok:
                refused[r.status.name] = refused.get(r.status.name, 0) + 1
        if refused:
            print(f"puts refused: {refused}", file=sys.stderr)
        ends = _wait_pullable(client, args.messages - sum(refused.values()))
        rate, prof = profile_run(
            lambda _round: _drain(client, ends, args.max_count, args.zero_copy)
        )
    setting = f"pool {args.pool}, max_count {args.max_count}, zero_copy {args.zero_copy}"
    label = f"{args.max_count}{'_zero_copy' if args.zero_copy else ''}"
    save_as = f"profile_pull_{label}.txt"
    return report_profile("bench.profile_pull", argv, args, prof, rate, setting, save_as)


if __name__ == "__main__":
    raise SystemExit(main())
