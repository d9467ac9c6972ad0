"""`mqstore offsets DIR [--group G] [--json]`: every consumer group's progress (or G's).

One row per (group, topic, queue) of `config/consumerOffset.json`: the committed offset,
the queue's max offset (what is pullable: dispatched on a running store) and the lag
(max - committed, never below 0). Exit 0, 2 when DIR is no store or the file is broken.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mqstore.engine.offsets import ConsumerOffsets
from mqstore.workers.commands._reads import open_reads

NAME = "offsets"
HELP = "consumer groups' committed offsets, max offsets and lag"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory (mqstore's or RocketMQ's)")
    p.add_argument("--config", type=Path, default=None, help="settings (TOML or broker.conf)")
    p.add_argument("--group", default=None, metavar="G", help="only group G")
    p.add_argument("--json", action="store_true", help="one JSON object per row")


def run(args: argparse.Namespace) -> int:
    try:
        table = ConsumerOffsets(args.store_dir).table()
    except ValueError as e:
        print(f"mqstore offsets: config/consumerOffset.json: {e}", file=sys.stderr)
        return 2
    reads = open_reads(NAME, args.store_dir, args.config)
    if reads is None:
        return 2
    rows = []
    with reads:
        for group in sorted(g for g in table if args.group in (None, g)):
            for (topic, q), committed in sorted(table[group].items()):
                mx = reads.max_offset(topic, q)
                rows.append(
                    {
                        "group": group,
                        "topic": topic,
                        "queue_id": q,
                        "committed": committed,
                        "max_offset": mx,
                        "lag": max(mx - committed, 0),
                    }
                )
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    if not rows:
        which = "" if args.group is None else f" of group {args.group}"
        print(f"no consumer offsets{which} (config/consumerOffset.json is missing or empty)")
        return 0
    head = ("group", "topic", "queue", "committed", "max offset", "lag")
    cells = [
        (r["group"], r["topic"], r["queue_id"], r["committed"], r["max_offset"], r["lag"])
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *cells, strict=False)]
    for line in [head, *cells]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    return 0
