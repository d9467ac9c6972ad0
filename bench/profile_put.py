"""Where a put's time goes: cProfile of one producer's puts through the public client.

    python -m bench.profile_put [--mode async|sync] [--pool on|off] [--keys unique|fixed]
                                [--puts N] [--batch K] [--top 25] [--save]

Starts a fresh store (as the put benchmark does), warms the client with 1000 puts, then
profiles `--puts` puts (or `put_batch` calls of `--batch` messages) and prints the
functions by own time, with the rate measured without the profiler first. `--save`
writes `bench/results/profile_put_<mode>_<pool>_<keys>.txt` (the command, commit and
machine in its head), the evidence behind a goal that pure Python cannot reach.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench.profiles import add_profile_arguments, profile_run, profiled_client, report_profile
from bench.store_run import BODY_BYTES, TAGS, TOPIC


def _puts(client: Any, n: int, batch: int, unique: bool, start: int) -> int:
    body = os.urandom(BODY_BYTES)
    if batch:
        done = 0
        for call in range(max(1, n // batch)):
            base = start + call * batch
            msgs = [
                {
                    "topic": TOPIC,
                    "body": body,
                    "tags": TAGS,
                    "keys": f"k{base + i}" if unique else "k",
                }
                for i in range(batch)
            ]
            done += len(client.put_batch(msgs))
        return done
    put = client.put
    for i in range(start, start + n):
        put(TOPIC, body, tags=TAGS, keys=f"k{i}" if unique else "k")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_put", description=__doc__)
    ap.add_argument("--mode", choices=("async", "sync"), default="async")
    ap.add_argument("--keys", choices=("unique", "fixed"), default="unique")
    ap.add_argument("--puts", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=0)
    add_profile_arguments(ap)
    args = ap.parse_args(argv)
    unique = args.keys == "unique"
    with profiled_client(args, sync=args.mode == "sync") as client:
        _puts(client, 1000, args.batch, unique, 0)
        rate, prof = profile_run(  # keys of each round apart: k1000000..., k2000000...
            lambda round_: _puts(client, args.puts, args.batch, unique, round_ * 10**6)
        )
    setting = f"mode {args.mode}, pool {args.pool}, keys {args.keys}, batch {args.batch or '-'}"
    save_as = f"profile_put_{args.mode}_{args.pool}_{args.keys}.txt"
    return report_profile("bench.profile_put", argv, args, prof, rate, setting, save_as)


if __name__ == "__main__":
    raise SystemExit(main())
