"""A dispatch round's price by its size: what a round costs before its first record.

    python -m bench.profile_dispatch_round [--messages 20000] [--rounds 4,8,32,4096]

Puts `--messages` README-shape messages (1 KiB, `keys=[...]`, tags of three values: the
sync checks' call) into a fresh ASYNC_FLUSH store, then replays its log into fresh
consume queues and index in this process (`bench.bench_dispatch.replay`) once per round
size, each round at most that many records: CPU per record and per round. Under sync
puts the dispatcher's limit is the flushed position, which moves a few records per
flusher round, so the rounds are that small unless it waits between them
(`workers.dispatcher`: 1 ms once a round reached the limit).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.bench_dispatch import replay
from bench.store_run import client_api, running_store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_dispatch_round")
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--rounds", default="4,8,32,4096", help="records per round, comma-separated")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.rounds.split(",")]
    store_client, _ = client_api()
    with tempfile.TemporaryDirectory(prefix="mqs-dispatch-round-") as tmp:
        root = Path(tmp)
        with running_store(root, "store", sync=False, pool=True) as run:
            pad = b"x" * 1000
            with store_client.attach(str(run.store_dir)) as c:
                for i in range(args.messages):
                    body = b"w%04d-m%08d|" % (i % 16, i) + pad
                    c.put("perf", body, keys=[f"k-{i}"], tags=f"t{i % 3}")
            for n, size in enumerate(sizes):
                got = replay(run.store_dir, root / f"replay{n}", 1 << 20, max_records=size)
                print(
                    f"{size:5d} records a round: {got['replay_records']} records, "
                    f"{got['replay_cpu_us_per_record']} µs CPU a record, "
                    f"{got['replay_cpu_us_per_round']} µs a round"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
