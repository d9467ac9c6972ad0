"""CPU per consumed-and-acked message of a group consumer, in each of its three forms
(issue 25's keep-up goal: well under a put's ~1.3 µs).

    python -m bench.cpu_groups [--messages 100000] [--reps 3] [--forms ack,ack_many,iterate]

Starts a fresh ASYNC_FLUSH store (pool on), puts `--messages` 1 KiB messages from this
process and waits until they are all pullable; then, for each form, `--reps` fresh
groups (one member, `retry=False`) each drain them all:

- `ack`: `poll(64)`, then `ack` each message;
- `ack_many`: `poll(64)`, then one `ack_many` per batch;
- `iterate`: `for msg in consumer` (asking for the next acks the one before).

The figure is this process's CPU time (`time.process_time`: the member's membership
thread included) per message, over the drain only; the machine is shared, so the least
of the reps is the one to compare (a rate follows the load, CPU per message much less).
Prints one JSON line per form, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from bench.bench_pull import _wait_pullable
from bench.profiles import profiled_client
from bench.store_run import BODY_BYTES, TAGS, TOPIC

FORMS = ("ack", "ack_many", "iterate")


def drain(client: Any, n: int, form: str, group: str) -> float:
    """Drain `n` messages as group `group` in `form`: the CPU seconds it took."""
    got = 0
    with client.consumer(group, TOPIC, retry=False) as consumer:
        c0 = time.process_time()
        if form == "iterate":
            for _msg in consumer:
                got += 1
                if got >= n:
                    break
        while got < n:
            batch = consumer.poll(64, 1.0)
            if form == "ack_many":
                consumer.ack_many(batch)
            else:
                for m in batch:
                    consumer.ack(m)
            got += len(batch)
        return time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_groups", description=__doc__)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--pool", choices=("on", "off"), default="on")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    forms = args.forms.split(",")
    for f in forms:
        if f not in FORMS:
            ap.error(f"unknown form {f!r}: {', '.join(FORMS)}")
    with profiled_client(args, sync=False) as client:
        body = os.urandom(BODY_BYTES)
        for i in range(args.messages):
            if not client.put(TOPIC, body, tags=TAGS, keys=f"k{i}").ok:
                print("a put was refused", file=sys.stderr)
                return 1
        _wait_pullable(client, args.messages)
        k = 0
        for form in forms:
            us = []
            for _ in range(args.reps):
                k += 1
                us.append(drain(client, args.messages, form, f"cpu{k}") * 1e6 / args.messages)
            print(
                json.dumps(
                    {
                        "form": form,
                        "messages": args.messages,
                        "cpu_us_per_msg_min": round(min(us), 3),
                        "cpu_us_per_msg_median": round(statistics.median(us), 3),
                        "reps": [round(u, 3) for u in us],
                        "loadavg": os.getloadavg(),
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
