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


def run(args: argparse.Namespace) -> int:
    store = str(args.store_dir)
    pid = store_lock_holder(store)
    if pid is None:
        print(f"mqstore stop: no supervisor runs for {store}", file=sys.stderr)
        return 1
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
    print(f"mqstore stop: supervisor {pid} still running after {args.timeout} s", file=sys.stderr)
    return 1
