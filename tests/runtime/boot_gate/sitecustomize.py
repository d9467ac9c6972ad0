"""Holds one worker of a test's store at interpreter start, before it boots, until a
file exists: `MQS_TEST_HOLD_WORKER=NAME:PATH` in the environment, this directory on
PYTHONPATH (`test_attach_during_boot.py`). Only a process running `mqstore.workers.worker_main NAME`
waits (at most 60 s); every other one goes on at once."""

from __future__ import annotations

import os
import time


def _hold() -> None:
    spec = os.environ.get("MQS_TEST_HOLD_WORKER", "")
    name, sep, gate = spec.partition(":")
    if not sep:
        return
    try:
        with open("/proc/self/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return
    main = b"mqstore.workers.worker_main"
    if main not in args or args[args.index(main) + 1 :][:1] != [name.encode()]:
        return
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)


_hold()
