"""The one loop every worker runs, and its one way to fail: closed.

A worker is a `Service`: `tick()` does one round of its job and returns how long to
wait before the next (0: at once); `wait(seconds)` sleeps (the context's wait, woken by
a signal, unless the worker has its own wake-up, as the flusher's futex);
`drain_step()` does one step of the drain after a stop and says whether it is done;
`finish()` is the drain's last step, run once whether the drain finished or ran out of
time; `close()` releases its files. `run(ctx, service)` is the shape of every worker
(RocketMQ's ServiceThread, gunicorn's worker loop):

    while not stopping:  beat; wait (the last tick's answer); tick
    drain_step() until it says done or `drain_s` has passed; finish()
    close()

Settings are re-read from `ctx.settings` by each tick (SIGHUP replaces them at the beat).

A `StoreIOError` out of any of these fails the store closed (Kafka's
LogDirFailureChannel): `fail_closed` sets READ_ONLY in the control block, writes the
reason on the supervisor's reason pipe (`REASON_FD_ENV`) as one JSON line, logs it once,
and the worker exits with its service's `failed_exit` (IO_FAILED; FLUSH_FAILED for the
flusher), which the supervisor never restarts. The service's `on_io_error(e)` runs
first (the flusher wakes its sync waiters so they answer FLUSH_DISK_FAILED at once).

Not such a failure: a full disk where a worker only needs new space (a new segment,
consume-queue or index file, the cleaner's status file). The allocator, the dispatcher
and the cleaner wait that out inside their tick (`fileio.is_no_space`), said once per
condition (`base.Condition`); a failed sync is never waited out, whatever its errno.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import time
from typing import ClassVar, Final

from mqstore.engine.fileio import StoreIOError
from mqstore.ipc.control_views import Flags
from mqstore.workers.base import REASON_FD_ENV, ExitCode, WorkerContext, say

DRAIN_PAUSE_S: Final = 0.005  # between drain steps that are not done yet
REASON_MAX_BYTES: Final = 512  # one write(2) to a pipe, well under PIPE_BUF


class Service:
    """One worker's job, as `run` drives it. Subclasses set `name` and override `tick`;
    the rest has defaults (no drain, nothing to close)."""

    name: ClassVar[str] = "worker"
    failed_exit: ClassVar[ExitCode] = ExitCode.IO_FAILED
    drain_s: ClassVar[float] = 2.0

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    def tick(self) -> float:
        """One round of the job; return the seconds to wait before the next."""
        raise NotImplementedError

    def wait(self, seconds: float) -> None:
        self.ctx.wait(seconds)

    def drain_step(self) -> bool:
        """One step of the drain after a stop; True when nothing is left to do."""
        return True

    def finish(self) -> None:
        """The drain's last step (a final flush), after `drain_step` is done or out of time."""

    def on_io_error(self, e: StoreIOError) -> None:
        """Called once before the worker fails closed on `e` (the flag is not set yet)."""

    def close(self) -> None:
        """Release files and mappings; runs on every way out of `run`."""


def run(ctx: WorkerContext, service: Service) -> int:
    """Drive `service` until stopped, drain, close; return the worker's exit code."""
    # What start-up made (modules, settings, the service) lives as long as the worker:
    # out of the collector's generations, a full collection no longer walks it (it did
    # every few thousand rounds of the flusher: ~4% of its CPU under sync load).
    gc.freeze()
    try:
        wait_s = 0.0
        while not ctx.stopping:
            ctx.beat()
            if wait_s > 0:
                service.wait(wait_s)
            wait_s = service.tick()
        deadline = time.monotonic() + service.drain_s
        while not service.drain_step() and time.monotonic() < deadline:
            time.sleep(DRAIN_PAUSE_S)
        service.finish()
        return ExitCode.OK
    except StoreIOError as e:
        service.on_io_error(e)
        return fail_closed(ctx, e, service.failed_exit)
    finally:
        service.close()


def fail_closed(ctx: WorkerContext, e: StoreIOError, code: ExitCode = ExitCode.IO_FAILED) -> int:
    """Mark the store read-only for `e`, tell the supervisor why, return `code` (the
    worker exits with it). Any worker, any time after it mapped the control block."""
    Flags(ctx.cb).mark_read_only()
    reason = read_only_reason(ctx.name, e)
    say(ctx.name, f"I/O error, the store is read-only: {reason['message']}", "ERROR")
    _report_reason(reason)
    return int(code)


def read_only_reason(worker: str, e: StoreIOError) -> dict[str, str]:
    """What the supervisor puts in status and metrics: the worker, the operation, the
    errno's name, the path, and one line saying all of it."""
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    return {
        "worker": worker,
        "op": e.op,
        "errno": name,
        "path": e.path,
        "message": f"{worker}: {e.strerror} ({name})",
    }


def parse_reason(raw: bytes, worker: str) -> dict[str, str]:
    """The reason a worker wrote (`read_only_reason`'s keys), or a stand-in naming the
    worker when it wrote nothing usable (killed before it could, an older worker)."""
    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        doc = None
    keys = ("worker", "op", "errno", "path", "message")
    if isinstance(doc, dict) and all(isinstance(doc.get(k), str) for k in keys):
        return {k: doc[k] for k in keys}
    text = raw.decode("utf-8", "replace").strip()
    return {
        "worker": worker,
        "op": "",
        "errno": "",
        "path": "",
        "message": text or f"{worker}: an I/O error (it said no more)",
    }


def _report_reason(reason: dict[str, str]) -> None:
    """One write on the reason pipe, cut to REASON_MAX_BYTES (the path goes first)."""
    fd = os.environ.get(REASON_FD_ENV, "")
    if not fd.isdigit():
        return
    data = json.dumps(reason).encode("utf-8", "backslashreplace")
    if len(data) > REASON_MAX_BYTES:
        short = {**reason, "path": reason["path"][-64:], "message": reason["message"][-200:]}
        data = json.dumps(short).encode("utf-8", "backslashreplace")[:REASON_MAX_BYTES]
    with contextlib.suppress(OSError):
        os.write(int(fd), data)
