"""Holds or crashes one worker of a test's store at interpreter start, before it boots
(`test_attach_during_boot.py`, with this directory on PYTHONPATH). Only a process running
`mqstore.workers.worker_main NAME` is touched; every other one goes on at once.

* `MQS_TEST_HOLD_WORKER=NAME:PATH`: NAME waits until the file PATH exists (at most 60 s),
  at each start (a restart too);
* `MQS_TEST_CRASH_WORKER=NAME`: NAME exits with 1 (a crash: the supervisor restarts it
  with backoff), at each start: a crash loop."""

from __future__ import annotations

import os
import time


def _worker_name() -> bytes:
    """The NAME of `python -m mqstore.workers.worker_main NAME ...`, else b""."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return b""
    main = b"mqstore.workers.worker_main"
    if main not in args:
        return b""
    rest = args[args.index(main) + 1 :]
    return rest[0] if rest else b""


def _gate() -> None:
    hold, sep, gate = os.environ.get("MQS_TEST_HOLD_WORKER", "").partition(":")
    crash = os.environ.get("MQS_TEST_CRASH_WORKER", "")
    if not sep and not crash:
        return
    name = _worker_name()
    if not name:
        return
    if crash and name == crash.encode():
        os._exit(1)
    if sep and name == hold.encode():
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.005)


_gate()
