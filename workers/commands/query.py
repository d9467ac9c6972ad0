"""`mqstore query DIR --topic T --key K [--begin T1] [--end T2] [--limit N] [--body F]`.

Messages of topic T carrying key K (its UNIQ_KEY or one of its KEYS) through the index,
as RocketMQ's queryMessage, each re-checked to carry the key. Prints one JSON object per
message, as `mqstore dump` does, physical offsets ascending: at most `--limit` (default
32, as `mqstore get`), and when more carry the key, a line on stderr says so. On a
running store it reads what is dispatched; on a stopped one, what the files hold. Exit 0
when something was found; 1 when nothing was, with one line on stderr saying so; 2 on
bad arguments. `--begin-ms`, `--end-ms` and `--max` are deprecated spellings of
`--begin`, `--end` and `--limit`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mqstore.workers.commands._common import (
    add_limit_arguments,
    add_time_arguments,
    below_minimum,
    say_cut,
    topic_arg,
)
from mqstore.workers.commands._reads import open_reads
from mqstore.workers.commands._records import add_body_argument, print_records

NAME = "query"
HELP = "find messages by key through the index"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory (mqstore's or RocketMQ's)")
    p.add_argument("--config", type=Path, default=None, help="settings (TOML or broker.conf)")
    p.add_argument("--topic", required=True, type=topic_arg)
    p.add_argument("--key", required=True)
    add_time_arguments(p, old=("--begin-ms", "--end-ms"))
    add_limit_arguments(p, old="--max")
    add_body_argument(p)


def run(args: argparse.Namespace) -> int:
    if below_minimum(NAME, ("--limit", args.limit, 1)):
        return 2
    reads = open_reads(NAME, args.store_dir, args.config)
    if reads is None:
        return 2
    with reads:
        recs = reads.query(args.topic, args.key, args.begin, args.end, args.limit + 1)
    if not recs:
        print(f"mqstore {NAME}: no message of topic {args.topic} carries key {args.key!r}",
              file=sys.stderr)  # fmt: skip
        return 1
    if len(recs) > args.limit:
        say_cut(NAME, args.limit, "more messages carry the key")
    print_records(recs[: args.limit], args.body)
    return 0
