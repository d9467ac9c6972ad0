"""`mqstore check DIR [--json]`: verify every record, the file chain and the checkpoint.

Prints one line per finding (severity, offset, file, what is wrong), then a summary:
records, of which fillers (what the publisher wrote over a dead producer's reservation,
`engine.filler`; not messages, but sound records) and compressed ones (sysFlag 0x1; a
compressed body that does not inflate with its codec is a WARNING), segments, the valid
data's range.
ERROR findings are faults and make the exit status 1; WARNING and INFO lines are
reported (an empty trailing pre-allocated segment, an abort file, zeros after the last
record) without failing, unless `--strict`, where warnings fail too. Exit 2: not a store
or bad settings. Never writes. On a running store (its supervisor holds `lock`) the
`abort` note says so instead of reporting an unclean shutdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from mqstore.engine.findings import Severity
from mqstore.ipc.locks import store_lock_holder
from mqstore.workers.commands._common import add_store_arguments, open_store

NAME = "check"
HELP = "verify every record (CRC included), the file chain and the checkpoint of a store"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")
    p.add_argument("--strict", action="store_true", help="warnings fail the check too")


def run(args: argparse.Namespace) -> int:
    store = open_store(NAME, args)
    if store is None:
        return 2
    with store:
        findings, summary = store.check(running_pid=store_lock_holder(str(args.store_dir)))
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    failed = counts[Severity.ERROR] > 0 or (args.strict and counts[Severity.WARNING] > 0)
    if args.json:
        doc = {
            "store": str(args.store_dir),
            "ok": not failed,
            "summary": dataclasses.asdict(summary),
            "findings": [
                {"severity": f.severity.name, "offset": f.offset, "file": f.file, "what": f.what}
                for f in findings
            ],
        }
        print(json.dumps(doc, indent=2))
    else:
        for f in findings:
            where = f"offset {f.offset}" if f.offset is not None else "-"
            print(f"{f.severity.name:<7} {where:<18} {f.file or '-'}: {f.what}")
        verdict = "FAILED" if failed else "ok"
        compressed = f", {summary.compressed} compressed" if summary.compressed else ""
        print(
            f"{verdict}: {summary.records} records ({summary.fillers} fillers){compressed} in "
            f"{summary.segments} segments of "
            f"{summary.segment_size_bytes} bytes, valid data {summary.min_offset}.."
            f"{summary.end_offset}; {counts[Severity.ERROR]} errors, "
            f"{counts[Severity.WARNING]} warnings, {counts[Severity.INFO]} notes"
        )
    return 1 if failed else 0
