"""`mqstore stop DIR [--timeout S]`: stop the store's supervisor gracefully and wait."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from mqstore.ipc.locks import store_lock_holder

NAME = "stop"
HELP = "stop the store's supervisor gracefully (drain, checkpoint) and wait for it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")


def _reservation_holder(store: str) -> str:
    """Who holds the reservation lock now ("" if nobody), as status says it: a stopped
    producer there is what a slow stop waits out, so the stop names it."""
    from mqstore.ipc import channel
    from mqstore.workers.commands.status import describe_holder

    try:
        holder = channel.request(store, {"op": "status"}, timeout_s=2.0).get("reservation_holder")
    except (channel.SupervisorUnavailable, OSError, ValueError):
        return ""
    return describe_holder(holder) if holder else ""


def run(args: argparse.Namespace) -> int:
    store = str(args.store_dir)
    pid = store_lock_holder(store)
    if pid is None:
        print(f"mqstore stop: no supervisor runs for {store}", file=sys.stderr)
        return 1
    holder = _reservation_holder(store)
    if holder:
        print(f"mqstore stop: the reservation lock is {holder}; stopping without it")
    if pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    else:
        from mqstore.ipc import channel

        try:
            channel.request(store, {"op": "stop"})
        except channel.SupervisorUnavailable as e:
            print(f"mqstore stop: {e}", file=sys.stderr)
            return 1
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if store_lock_holder(store) is None:
            print(f"mqstore stop: supervisor {pid} stopped")
            return 0
        time.sleep(0.05)
    why = f" (the reservation lock {holder})" if holder else ""
    print(
        f"mqstore stop: supervisor {pid} still running after {args.timeout} s{why}",
        file=sys.stderr,
    )
    return 1
