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
from mqstore.engine.geometry import GeometryMismatch, GeometryRecordError, check_settings
from mqstore.ipc.control import ControlBlock
from mqstore.workers.base import (
    WORKER_RUNNING,
    ExitCode,
    WorkerContext,
    say,
    setup_logging,
)
from mqstore.workers.service import fail_closed


def main(argv: list[str]) -> int:
    name, index_s, store_dir, ctl, pool, target = argv[:6]
    config = Path(argv[6]) if len(argv) > 6 and argv[6] else None
    setup_logging(name)
    try:
        loaded = load_settings(Path(store_dir), config, os.environ)
        settings = loaded.settings
        # The store's geometry is the supervisor's, whatever the config file says now.
        check_settings(store_dir, settings, loaded.source_of)
    except (ConfigError, GeometryMismatch, GeometryRecordError) as e:
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
        parent_pid=cb.supervisor_pid,
        config=config,
    )
    ctx.install_signals()
    cb.set_worker_state(ctx.index, WORKER_RUNNING)  # booted: settings loaded, block mapped
    try:
        return int(fn(ctx))
    except StoreIOError as e:  # before its loop (the loop's own are `service.run`'s)
        return fail_closed(ctx, e)
    except Exception:
        logging.getLogger("mqstore").exception("crashed")
        return ExitCode.CRASH
    finally:
        with contextlib.suppress(BufferError):
            cb.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
