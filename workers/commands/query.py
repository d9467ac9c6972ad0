"""`mqstore query DIR --topic T --key K [--begin-ms T1] [--end-ms T2] [--max N] [--body F]`.

Messages of topic T carrying key K (its UNIQ_KEY or one of its KEYS) through the index,
as RocketMQ's queryMessage, each re-checked to carry the key. Prints one JSON object per
message, as `mqstore dump` does, physical offsets ascending. On a running store it reads
what is dispatched; on a stopped one, what the files hold. Exit 0 when something was
found, 1 when nothing was, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mqstore.workers.commands._common import below_minimum, topic_arg
from mqstore.workers.commands._reads import open_reads
from mqstore.workers.commands._records import add_body_argument, print_records
from mqstore.workers.commands.get import parse_time_ms

NAME = "query"
HELP = "find messages by key through the index"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory (mqstore's or RocketMQ's)")
    p.add_argument("--config", type=Path, default=None, help="settings (TOML or broker.conf)")
    p.add_argument("--topic", required=True, type=topic_arg)
    p.add_argument("--key", required=True)
    p.add_argument("--begin-ms", type=parse_time_ms, default=0, metavar="T")
    p.add_argument("--end-ms", type=parse_time_ms, default=None, metavar="T", help="default now")
    p.add_argument("--max", type=int, default=32, metavar="N", help="at most N messages")
    add_body_argument(p)


def run(args: argparse.Namespace) -> int:
    if below_minimum(NAME, ("--max", args.max, 1)):
        return 2
    reads = open_reads(NAME, args.store_dir, args.config)
    if reads is None:
        return 2
    with reads:
        recs = reads.query(args.topic, args.key, args.begin_ms, args.end_ms, args.max)
    return 0 if print_records(recs, args.body) else 1
