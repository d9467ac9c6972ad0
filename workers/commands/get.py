"""`mqstore get DIR ...`: read messages through the consume queues, the index or ids.

    mqstore get DIR --topic T --queue Q --offset N [--limit N] [--tags "a || b"]
    mqstore get DIR --msg-id ID
    mqstore get DIR --physical-offset N
    mqstore get DIR --topic T --key K [--limit N] [--begin T1] [--end T2]
    mqstore get DIR --topic T --uniq-key ID  (the client message id, PutResult.uniq_key)
    mqstore get DIR --topic T --queue Q --time T [--limit N]  (from the queue offset for a time)

Prints one JSON object per message, as `mqstore dump` does (`--body text|base64|hex`,
see `_records`); a summary (status, next offset) goes to stderr. At most `--limit`
messages (default `DEFAULT_LIMIT`, as `mqstore query`); when more were there, a line on
stderr says so and how to get the rest. Times are epoch milliseconds or ISO 8601. Reads
any store, never writing; a running store is read only up to its flushed offset.

Exit 0 when something was found; 1 when nothing was, with one line on stderr saying what
was not found; 2 on bad arguments (a malformed `--msg-id` is told what a message id
looks like: `engine.recordcodes.parse_msg_id`). `--count` is a deprecated spelling of
`--limit`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.engine import fileio
from mqstore.engine.indexfile import IndexGeometryError
from mqstore.engine.reader import MAX_TIMESTAMP_MS, MaxOffsetFn, StoreReader
from mqstore.engine.record import PROPERTY_UNIQ_KEY
from mqstore.engine.record_decode import RecordFields
from mqstore.engine.segment import SegmentNameError, SegmentSizeError
from mqstore.engine.storedir import read_flushed_offset
from mqstore.ipc.locks import store_lock_holder
from mqstore.workers.commands._common import (
    add_limit_arguments,
    add_time_arguments,
    parse_time_ms,
    say_cut,
    topic_arg,
)
from mqstore.workers.commands._records import add_body_argument, print_records

NAME = "get"
HELP = "read messages by queue offset, message id, physical offset, key or time"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory (mqstore's or RocketMQ's)")
    p.add_argument("--config", type=Path, default=None, help="settings (TOML or broker.conf)")
    p.add_argument("--topic", default=None, type=topic_arg)
    p.add_argument("--queue", type=int, default=None, metavar="Q")
    p.add_argument("--offset", type=int, default=None, metavar="N", help="queue offset")
    add_limit_arguments(p, old="--count")
    p.add_argument("--tags", default=None, help='tag filter, e.g. "a || b"')
    what = p.add_mutually_exclusive_group()
    what.add_argument("--msg-id", default=None)
    what.add_argument("--physical-offset", type=int, default=None, metavar="N")
    what.add_argument("--key", default=None)
    what.add_argument(
        "--uniq-key", default=None, metavar="ID",
        help="the message whose UNIQ_KEY (client message id) is ID, through the index",
    )  # fmt: skip
    what.add_argument("--time", type=parse_time_ms, default=None, metavar="T")
    add_time_arguments(p, end_default=MAX_TIMESTAMP_MS)  # with --key
    add_body_argument(p)


def _bad(msg: str) -> int:
    print(f"mqstore get: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    store = str(args.store_dir)
    if not os.path.isdir(os.path.join(store, "commitlog")):
        return _bad(f"{store} is not a store (no commitlog/)")
    if args.limit < 1:
        return _bad("--limit must be >= 1")
    try:
        settings = load_settings(args.store_dir, args.config, os.environ).settings
    except ConfigError as e:
        return _bad(str(e))
    limit: MaxOffsetFn | None = None
    if store_lock_holder(store) is not None:
        flushed = read_flushed_offset(store)
        if flushed is not None:

            def limit() -> int:
                return read_flushed_offset(store) or 0

    try:
        reader = StoreReader.open(store, settings, max_offset_fn=limit)
    except (SegmentSizeError, SegmentNameError, IndexGeometryError, fileio.StoreIOError) as e:
        return _bad(str(e))
    with reader:
        return _run(reader, args)


def _none(what: str) -> int:
    """Nothing found: one line saying what (stderr), exit 1."""
    print(f"mqstore get: {what}", file=sys.stderr)
    return 1


def _run(r: StoreReader, args: argparse.Namespace) -> int:
    recs: Sequence[RecordFields] = []
    if args.msg_id is not None:
        try:
            rec = r.get_by_msg_id(args.msg_id)
        except ValueError as e:
            return _bad(str(e))
        if rec is None:
            return _none(f"no message with id {args.msg_id} in {args.store_dir}")
        recs = [rec]
    elif args.physical_offset is not None:
        rec = r.get_by_offset(args.physical_offset)
        if rec is None:
            return _none(
                f"no message starts at physical offset {args.physical_offset} (the log holds "
                f"{r.min_log_offset()}..{r.limit()}; `mqstore dump` lists where records start)"
            )
        recs = [rec]
    elif args.uniq_key is not None:
        if args.topic is None:
            return _bad("--uniq-key needs --topic")
        found = r.query_by_key(args.topic, args.uniq_key, 64, args.begin, args.end)
        recs = [x for x in found if x.properties.get(PROPERTY_UNIQ_KEY) == args.uniq_key]
        if not recs:
            return _none(f"no message of topic {args.topic} has UNIQ_KEY {args.uniq_key!r}")
        recs = recs[: args.limit]
    elif args.key is not None:
        if args.topic is None:
            return _bad("--key needs --topic")
        recs = r.query_by_key(args.topic, args.key, args.limit + 1, args.begin, args.end)
        if not recs:
            return _none(f"no message of topic {args.topic} carries key {args.key!r}")
        if len(recs) > args.limit:
            recs = recs[: args.limit]
            say_cut(NAME, args.limit, "more messages carry the key")
    else:
        if args.topic is None or args.queue is None:
            return _bad(
                "give --msg-id, --physical-offset, --key, --uniq-key, or --topic and "
                "--queue with --offset or --time"
            )
        offset = args.offset
        if args.time is not None:
            offset = r.offset_for_time(args.topic, args.queue, args.time)
            print(f"queue offset {offset} for time {args.time}", file=sys.stderr)
        elif offset is None:
            return _bad("--topic/--queue need --offset or --time")
        g = r.get_messages(args.topic, args.queue, offset, args.limit, tags=args.tags)
        print(
            f"{g.status.value}: next offset {g.next_offset} (queue holds {g.min_offset}.."
            f"{g.max_offset})",
            file=sys.stderr,
        )
        recs = g.messages
        if not recs:
            return _none(f"no message in {args.topic} queue {args.queue} at offset {offset}")
        if g.next_offset < g.max_offset:
            say_cut(NAME, args.limit, f"the queue goes on: --offset {g.next_offset} for the next")
    print_records(recs, args.body)
    return 0
