"""`mqstore dump DIR [--from-offset N] [--limit N] [--body text|base64|hex]`: one JSON
object per message record (the body as `_records` says: text where it is valid UTF-8).

Each object holds every field as RocketMQ's `MessageDecoder` reads it
(`DecodedRecord.to_json_dict`): the body in base64, and `properties` null, not `{}`, for
a record without properties. A compressed body (sysFlag 0x1) is printed inflated, its
original bytes, and `compression` names its codec (null: stored as given). BLANK
end-of-file records are not printed. Reads any store
directory, never writing.
At most `--limit` records (default all); when more follow, a line on stderr says so and
names the `--from-offset` of the rest. Exit 0 when the walk reached the end of valid
data or the limit, 1 when it stopped at a corrupt record
(what was printed up to there is valid; the reason goes to stderr), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterator

from mqstore.engine.compression import inflate
from mqstore.engine.logwalk import ScanStop
from mqstore.engine.record_decode import DecodedRecord, decode
from mqstore.engine.storedir import StoreDirError
from mqstore.workers.commands._common import (
    add_store_arguments,
    below_minimum,
    open_store,
    say_cut,
)
from mqstore.workers.commands._records import add_body_argument, print_records

NAME = "dump"
HELP = "print every message record of a store as one JSON object per line"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_arguments(p)
    p.add_argument(
        "--from-offset",
        type=int,
        default=None,
        metavar="N",
        help="physical offset of the first record (default: the log's first)",
    )
    p.add_argument("--limit", type=int, default=None, metavar="N", help="print at most N records")
    add_body_argument(p)


def run(args: argparse.Namespace) -> int:
    if below_minimum(NAME, ("--limit", args.limit, 0), ("--from-offset", args.from_offset, 0)):
        return 2
    store = open_store(NAME, args)
    if store is None:
        return 2
    with store:
        try:
            log = store.commitlog
        except StoreDirError as e:  # a segment of the wrong size, say: `check` lists them
            print(f"mqstore dump: {e}", file=sys.stderr)
            return 1
        if len(log.queue) == 0:
            return 0
        sc = log.scan_chunks(args.from_offset, check_crc=False)
        decoded = (inflate(decode(c.view, p)) for c in sc for p in c.scan.pos)
        last: list[DecodedRecord] = []

        def kept(recs: Iterator[DecodedRecord]) -> Iterator[DecodedRecord]:
            for rec in recs:
                last[:] = [rec]
                yield rec

        printed = print_records(kept(itertools.islice(decoded, args.limit)), args.body)
        if last and printed == args.limit and next(decoded, None) is not None:
            rest = last[0].physical_offset + last[0].size
            say_cut(NAME, args.limit, f"--from-offset {rest} for the rest")
            return 0
        if sc.stop is ScanStop.OFFSET_NOT_FOUND:
            print(f"mqstore dump: offset {sc.from_offset} is in no segment", file=sys.stderr)
            return 2
        if sc.stop is ScanStop.CORRUPT:
            what = "no record starts at" if printed == 0 else "stopped at a corrupt record at"
            print(f"mqstore dump: {what} offset {sc.end_offset}: {sc.reason}", file=sys.stderr)
            return 1
    return 0
