"""Entry point of one worker process (see `workers.base`). Started by the supervisor."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.engine.fileio import StoreIOError
from mqstore.ipc import control as c
from mqstore.ipc.control import ControlBlock
from mqstore.workers.base import (
    REASON_FD_ENV,
    WORKER_RUNNING,
    ExitCode,
    WorkerContext,
    say,
    setup_logging,
)


def main(argv: list[str]) -> int:
    name, index_s, store_dir, ctl, pool, target = argv[:6]
    config = Path(argv[6]) if len(argv) > 6 and argv[6] else None
    setup_logging(name)
    try:
        settings = load_settings(Path(store_dir), config, os.environ).settings
    except ConfigError as e:
        say(name, str(e), "ERROR")
        return ExitCode.CONFIG_ERROR
    try:
        mod_name, _, fn_name = target.partition(":")
        fn: Callable[[WorkerContext], int] = getattr(importlib.import_module(mod_name), fn_name)
        cb = ControlBlock.attach(ctl, pool)
    except (ImportError, AttributeError, OSError, ValueError) as e:
        say(name, f"cannot boot: {e}", "ERROR")
        return ExitCode.BOOT_ERROR
    # The supervisor's pid from the control block, not getppid(): if the supervisor died
    # while this process was still booting, getppid() would already be init's.
    ctx = WorkerContext(
        name,
        int(index_s),
        store_dir,
        settings,
        cb,
        parent_pid=cb.get(c.OFF_SUP_PID),
        config=config,
    )
    ctx.install_signals()
    cb.set_worker_state(ctx.index, WORKER_RUNNING)  # booted: settings loaded, block mapped
    try:
        return int(fn(ctx))
    except StoreIOError as e:
        # Fail closed (Kafka's LogDirFailureChannel): no more writes, the reason where
        # the supervisor puts it in status, and an exit code that is not restarted.
        cb.set_flag(c.FLAG_READ_ONLY)
        reason = f"{name}: {e}"
        say(name, f"I/O error, the store is read-only: {reason}", "ERROR")
        _report_reason(reason)
        return ExitCode.IO_FAILED
    except Exception:
        logging.getLogger("mqstore").exception("crashed")
        return ExitCode.CRASH
    finally:
        with contextlib.suppress(BufferError):
            cb.close()


def _report_reason(reason: str) -> None:
    """Tell the supervisor why this worker fails (one write, at most PIPE_BUF bytes)."""
    fd = os.environ.get(REASON_FD_ENV, "")
    if fd.isdigit():
        with contextlib.suppress(OSError):
            os.write(int(fd), reason.encode("utf-8", "backslashreplace")[:512])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
