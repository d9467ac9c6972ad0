"""Where a group consumer's time goes: cProfile of one member draining a store through
`Consumer.poll` + `ack` (issue 25's keep-up goal).

    python -m bench.profile_groups [--messages N] [--max-count 64] [--pool on|off]
                                   [--ack-many | --iterate] [--top 25] [--save]

Starts a fresh ASYNC_FLUSH store, puts `--messages` 1 KiB messages from this process,
waits until they are all pullable, then a fresh group (one member, `retry=False`) drains
them with poll(max_count) and an ack per message (`--ack-many`: one `ack_many` per poll;
`--iterate`: `for msg in consumer`, which acks each when asked for the next): once
without the profiler (the rate),
once more (another group) under cProfile. The CPU time per message (this process's,
the membership thread included) is the figure to compare: the rate follows the load. `--save` writes
`bench/results/profile_groups_<max_count>.txt`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from bench.bench_pull import _wait_pullable
from bench.profiles import add_profile_arguments, profile_run, profiled_client, report_profile
from bench.store_run import BODY_BYTES, TAGS, TOPIC


def _drain(client: Any, n: int, max_count: int, group: str, how: str, cpu: list[float]) -> int:
    got = 0
    with client.consumer(group, TOPIC, retry=False) as consumer:
        c0 = time.process_time()
        if how == "iterate":
            for _msg in consumer:
                got += 1
                if got >= n:
                    break
        while got < n:
            batch = consumer.poll(max_count, 1.0)
            if how == "ack_many":
                consumer.ack_many(batch)
            else:
                for m in batch:
                    consumer.ack(m)
            got += len(batch)
        cpu.append(time.process_time() - c0)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_groups", description=__doc__)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--max-count", type=int, default=64)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--ack-many", action="store_true", help="ack each batch with ack_many")
    how.add_argument("--iterate", action="store_true", help="for msg in consumer")
    add_profile_arguments(ap)
    args = ap.parse_args(argv)
    with profiled_client(args, sync=False) as client:
        body = os.urandom(BODY_BYTES)
        refused = 0
        for i in range(args.messages):
            if not client.put(TOPIC, body, tags=TAGS, keys=f"k{i}").ok:
                refused += 1
        if refused:
            print(f"puts refused: {refused}", file=sys.stderr)
        n = args.messages - refused
        _wait_pullable(client, n)
        cpu: list[float] = []
        how_ = "ack_many" if args.ack_many else "iterate" if args.iterate else "ack"
        rate, prof = profile_run(
            lambda r: _drain(client, n, args.max_count, f"profile{r}", how_, cpu)
        )
    setting = (
        f"pool {args.pool}, one member, "
        + (
            "for msg in consumer (acks each)"
            if args.iterate
            else f"poll({args.max_count}) + "
            + ("ack_many per batch" if args.ack_many else "ack each")
        )
        + ", "
        f"CPU {cpu[0] * 1e6 / n:.2f} µs per message (process time, no profiler)"
    )
    save_as = (
        "profile_groups_iterate.txt"
        if args.iterate
        else f"profile_groups_{args.max_count}{'_ack_many' if args.ack_many else ''}.txt"
    )
    return report_profile("bench.profile_groups", argv, args, prof, rate, setting, save_as)


if __name__ == "__main__":
    raise SystemExit(main())
