"""`mqstore topic DIR list` and `mqstore topic DIR set T --queues N`.

Topics live in `config/topics.json` (RocketMQ's TopicConfigManager form). A topic is
written there with the default queue count (`default_topic_queue_nums`) by the dispatcher
when its first message is dispatched; `set` changes (or creates) a topic's read and write
queue counts, which producers use to spread puts without a queue id. `list` shows the
configured topics and the queues the consume queues hold. Exit 0, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from mqstore.engine import fileio, topics

NAME = "topic"
HELP = "list topics, or set a topic's queue count"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory")
    p.add_argument("action", choices=("list", "set"))
    p.add_argument("topic", nargs="?", default=None, help="with set: the topic")
    p.add_argument("--queues", type=int, default=None, metavar="N", help="with set")


def _queue_dirs(store_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    root = store_dir / "consumequeue"
    with contextlib.suppress(OSError):
        for t in os.listdir(root):
            with contextlib.suppress(OSError):
                out[t] = sum(1 for q in os.listdir(root / t) if q.isdigit())
    return out


def run(args: argparse.Namespace) -> int:
    if not args.store_dir.is_dir():
        print(f"mqstore topic: {args.store_dir} is not a directory", file=sys.stderr)
        return 2
    if args.action == "set":
        if args.topic is None or args.queues is None:
            print("mqstore topic: set needs a topic and --queues N", file=sys.stderr)
            return 2
        try:
            cfg = topics.set_queue_nums(args.store_dir, args.topic, args.queues)
        except (ValueError, fileio.StoreIOError) as e:
            print(f"mqstore topic: {e}", file=sys.stderr)
            return 2
        print(f"{cfg.topic}: {cfg.write_queue_nums} queues")
        return 0
    try:
        configured = topics.load_topics(args.store_dir)
    except ValueError as e:
        print(f"mqstore topic: config/topics.json: {e}", file=sys.stderr)
        return 2
    on_disk = _queue_dirs(args.store_dir)
    print(f"{'topic':<32} {'read':>5} {'write':>5} {'perm':>4} {'queues on disk':>14}")
    for name in sorted(set(configured) | set(on_disk)):
        tc = configured.get(name)
        r, w, perm = (
            ("-", "-", "-") if tc is None else (tc.read_queue_nums, tc.write_queue_nums, tc.perm)
        )
        print(f"{name:<32} {r!s:>5} {w!s:>5} {perm!s:>4} {on_disk.get(name, 0):>14}")
    return 0
