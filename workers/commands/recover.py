"""`mqstore recover DIR [--config F] [--dry-run] [--json] [--keep-abort]`: offline recovery.

Runs `engine.recovery.recover_store` on a store that is not running, holding the same
exclusive lock the supervisor takes (`<store>/lock`, `ipc.locks.take_store_lock`), prints
the report and keeps it as `<store>/recovery.json` for `mqstore status`. After a
successful recovery the `abort` file is removed (the store is consistent again) unless
`--keep-abort`. `--dry-run` opens everything read-only and changes nothing.

Exit codes: 0 recovered (or would recover), 1 an I/O error stopped it (the store is left
as the error found it; run it again), 2 bad arguments, a running store or an unreadable
store.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio
from mqstore.engine.indexfile import IndexGeometryError
from mqstore.engine.recovery import RecoveryReport, recover_store, write_report
from mqstore.engine.recovery_progress import ProgressReporter
from mqstore.engine.segment import SegmentNameError, SegmentSizeError
from mqstore.ipc.locks import StoreLockHeld, store_lock_holder, take_store_lock
from mqstore.workers.commands._common import store_settings

NAME = "recover"
HELP = "recover a stopped store offline (validate, cut a torn tail, rebuild queues and index)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory (mqstore's or RocketMQ's)")
    p.add_argument("--config", type=Path, default=None, help="settings (TOML or broker.conf)")
    p.add_argument("--dry-run", action="store_true", help="say what would be done; write nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--keep-abort", action="store_true", help="leave the abort file (next start recovers again)"
    )


def _say(line: str) -> None:
    print(f"mqstore recover: {line}", file=sys.stderr, flush=True)


class _Refused(Exception):
    """Exit 2 with this message: a running store."""


def run(args: argparse.Namespace) -> int:
    settings = store_settings(NAME, args)
    if settings is None:
        return 2
    try:
        report = _recover_locked(str(args.store_dir), settings, args)
    except (_Refused, StoreLockHeld, SegmentSizeError, SegmentNameError, IndexGeometryError) as e:
        print(f"mqstore recover: {e}", file=sys.stderr)
        return 2
    except fileio.StoreIOError as e:
        print(f"mqstore recover: I/O error, nothing more was done: {e}", file=sys.stderr)
        return 1
    print(report.to_json() if args.json else report.summary())
    return 0


def _recover_locked(
    store: str, settings: StoreSettings, args: argparse.Namespace
) -> RecoveryReport:
    """Recover holding the store lock (a dry run only checks that no one holds it) and
    keep the report. Raises _Refused, StoreLockHeld and what `recover_store` raises."""
    lock_fd = -1
    if args.dry_run:
        holder = store_lock_holder(store)
        if holder is not None:
            raise _Refused(f"the store is running (pid {holder})")
    else:
        lock_fd = take_store_lock(store)
    # a dry run writes nothing, not even the progress file `mqstore status` reads
    progress = ProgressReporter(None if args.dry_run else store, _say)
    try:
        report = recover_store(
            store,
            settings,
            dry_run=args.dry_run,
            progress=progress,
            clear_abort=not args.keep_abort and not args.dry_run,
        )
        if not args.dry_run:
            write_report(store, report)
        return report
    finally:
        progress.close()
        if lock_fd >= 0:
            os.close(lock_fd)
