"""After a pause, how long until a put is pullable: the idle workers' wake-up.

    python -m bench.wake_latency [--sync] [--puts 15] [--pause 0.4]

Starts a fresh store with the pool on (`bench.store_run.running_store`), then `--puts`
times: sleeps `--pause` seconds (the committer and dispatcher go idle), puts one 1 KiB
message and pulls it at its queue offset until it is there (`ipc.reads`), timing put to
pullable. Under ASYNC_FLUSH that is the committer's and the dispatcher's wake-up; under
SYNC_FLUSH the flush and the dispatcher's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.store_run import client_api, running_store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wake_latency")
    ap.add_argument("--sync", action="store_true", help="SYNC_FLUSH (default ASYNC_FLUSH)")
    ap.add_argument("--puts", type=int, default=15)
    ap.add_argument("--pause", type=float, default=0.4)
    args = ap.parse_args(argv)
    from mqstore.ipc.reads import for_client

    store_client, _ = client_api()
    lats: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="mqs-wake-") as tmp,
        running_store(Path(tmp), "store", sync=args.sync, pool=True) as run,
        store_client.attach(str(run.store_dir)) as c,
    ):
        reads = for_client(c)
        try:
            for _ in range(args.puts):
                time.sleep(args.pause)  # nothing to wait for but the idle workers' back-off
                t0 = time.perf_counter()
                r = c.put("wake", b"x" * 1024)
                while not reads.pull("wake", r.queue_id, r.queue_offset, 1).messages:
                    time.sleep(0.0002)
                lats.append((time.perf_counter() - t0) * 1000)
        finally:
            reads.close()
    print(
        f"{'SYNC' if args.sync else 'ASYNC'}_FLUSH: a put after {args.pause} s idle is "
        f"pullable after {statistics.median(lats):.1f} ms median, {max(lats):.1f} max "
        f"({', '.join(f'{x:.1f}' for x in lats)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
