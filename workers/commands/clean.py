"""`mqstore clean DIR [--now] [--json]`: run retention on a store now.

On a store that is not running, one clean runs in this process (`workers.cleaner.
clean_once`): with `--now` whatever the hour and the disk (RocketMQ's manual delete:
expired files only, unless the disk is over the force ratio), without it only if the
delete hour or the disk calls for it. On a running store, `--now` asks the cleaner
process (a request file it polls every second) and waits for its report.
Prints each deleted file with its reason, then a summary. Exit 0; 1 on an I/O error or
when a running store's cleaner did not answer; 2 for bad settings or not a store.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mqstore.engine import fileio
from mqstore.engine.segment import SegmentNameError, SegmentSizeError
from mqstore.workers.cleaner import REQUEST_FILE, clean_once, read_status, store_is_running
from mqstore.workers.commands._common import store_settings

NAME = "clean"
HELP = "delete expired commit-log segments (and consume-queue/index files below them) now"
WAIT_S = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory")
    p.add_argument("--config", type=Path, default=None, help="TOML or broker.conf settings")
    p.add_argument("--now", action="store_true", help="clean whatever the hour and the disk")
    p.add_argument("--json", action="store_true", help="print the clean report as JSON")


def _print(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    for d in doc["deleted"]:
        print(f"deleted {d['path']} ({d['size_bytes']:,} B, {d['reason']}): {d['detail']}")
    for h in doc["held"]:
        print(f"held by a reader, destroyed later: {h}")
    disk = doc.get("disk") or {}
    unconsumed = doc["unconsumed_bytes_deleted"]
    print(
        f"{doc['files_deleted']} files, {doc['bytes_deleted']:,} bytes deleted"
        f" ({'unknown' if unconsumed is None else f'{unconsumed:,}'} bytes no consumer had"
        f" read); disk: {disk.get('reason', '?')}; min offset {doc['min_offset_after']}"
    )
    for n in doc["notes"]:
        print(f"  {n}")


def _ask_running(store: str, as_json: bool) -> int:
    asked = time.time_ns() // 1_000_000
    path = os.path.join(store, REQUEST_FILE)
    fd = fileio.open_file(path, create=True)
    fileio.close(fd, path)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        st = read_status(store)
        last = (st or {}).get("last_clean")
        if last is not None and last["started_ms"] >= asked:
            _print(last, as_json)
            return 0
        time.sleep(0.1)
    print(
        f"mqstore clean: the cleaner of {store} did not answer in {WAIT_S:.0f} s", file=sys.stderr
    )
    return 1


def run(args: argparse.Namespace) -> int:
    store = str(args.store_dir)
    settings = store_settings("clean", args)
    if settings is None:
        return 2
    if store_is_running(store):
        if not args.now:
            st = read_status(store)
            if st and st.get("last_clean"):
                _print(st["last_clean"], args.json)
            else:
                print("mqstore clean: the store is running; its cleaner has not run yet")
            return 0
        return _ask_running(store, args.json)
    try:
        report = clean_once(store, settings, now=args.now)
    except (SegmentSizeError, SegmentNameError) as e:
        print(f"mqstore clean: {e}", file=sys.stderr)
        return 2
    except fileio.StoreIOError as e:
        print(f"mqstore clean: {e}", file=sys.stderr)
        return 1
    _print(report.to_json_dict(), args.json)
    return 0
