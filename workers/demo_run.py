"""`make run`: write a small demo store with the engine, then show it with the tools.

    python -m workers.demo_run [DIR] [--messages N]

Writes N messages over three topics into DIR (default `data/demo`, recreated), rolling
over small segments so that the BLANK end-of-file records show, flushes them, writes the
checkpoint, and then runs `mqstore dump DIR --limit 3` and `mqstore check DIR` as a user
would. Exits with `check`'s status.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from engine.checkpoint import StoreCheckpoint
from engine.commitlog import CommitLog
from engine.record import Message
from workers.cli import main as mqstore

DEMO_SEGMENT_BYTES = 64 * 1024  # small, so the demo rolls a few segments


def write_demo_store(root: Path, count: int) -> tuple[int, int]:
    """Append `count` messages; return (messages, bytes appended)."""
    log = CommitLog.open(root / "commitlog", DEMO_SEGMENT_BYTES)
    topics = ("orders", "payments", "audit")
    try:
        for i in range(count):
            topic = topics[i % len(topics)]
            body = f'{{"n": {i}, "topic": "{topic}", "note": "demo message"}}'.encode()
            msg = Message(
                topic,
                body,
                {"TAGS": f"tag{i % 4}", "KEYS": f"{topic}-{i}", "UNIQ_KEY": f"DEMO{i:08d}"},
                queue_id=i % 4,
                born_timestamp=int(time.time() * 1000),
                born_host="127.0.0.1:50000",
            )
            res = log.append(msg)
            if not res.ok:
                raise SystemExit(f"demo append {i} failed: {res.status.name} {res.reason}")
        log.flush(0)
        appended = log.max_offset() - log.min_offset()
        last = log.queue.last()
        store_ts = last.store_timestamp if last is not None else 0
    finally:
        log.close()
    cp = StoreCheckpoint.open_in(root)
    try:
        cp.physic_msg_timestamp = store_ts
        cp.flush()
    finally:
        cp.close()
    return count, appended


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="demo_run", description=__doc__)
    ap.add_argument("store_dir", nargs="?", type=Path, default=Path("data/demo"))
    ap.add_argument("--messages", type=int, default=2000)
    args = ap.parse_args(argv)
    shutil.rmtree(args.store_dir, ignore_errors=True)
    args.store_dir.mkdir(parents=True)
    n, size = write_demo_store(args.store_dir, args.messages)
    print(f"# wrote {n} messages ({size} bytes) into {args.store_dir}\n")
    print(f"$ mqstore dump {args.store_dir} --limit 3")
    sys.stdout.flush()
    mqstore(["dump", str(args.store_dir), "--limit", "3"])
    print(f"\n$ mqstore check {args.store_dir}")
    sys.stdout.flush()
    return mqstore(["check", str(args.store_dir)])


if __name__ == "__main__":
    sys.exit(main())
