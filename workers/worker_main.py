"""Entry point of one worker process (see `workers.base`). Started by the supervisor."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from mqstore.conf.load import ConfigError, LoadedSettings, load_settings
from mqstore.conf.settings import StoreSettings
from mqstore.engine import geometry
from mqstore.engine.fileio import StoreIOError
from mqstore.ipc.control import ControlBlock
from mqstore.workers.base import (
    WORKER_RUNNING,
    ExitCode,
    WorkerContext,
    say,
    setup_logging,
)
from mqstore.workers.service import fail_closed


def _store_geometry(name: str, store_dir: str, loaded: LoadedSettings) -> StoreSettings:
    """The settings with the store's recorded geometry (the supervisor recorded or
    checked it at boot): a config file edited since then cannot give a restarted worker
    other file sizes; it is warned about, and the next start refuses it. Raises
    GeometryRecordError."""
    try:
        geometry.check_settings(store_dir, loaded.settings, loaded.source_of)
    except geometry.GeometryMismatch as e:
        say(name, f"{e}; this run keeps the store's", "WARNING")
    return geometry.with_record(store_dir, loaded.settings)


def main(argv: list[str]) -> int:
    name, index_s, store_dir, ctl, pool, target = argv[:6]
    config = Path(argv[6]) if len(argv) > 6 and argv[6] else None
    setup_logging(name)
    try:
        loaded = load_settings(Path(store_dir), config, os.environ)
        settings = _store_geometry(name, store_dir, loaded)
    except (ConfigError, geometry.GeometryRecordError) as e:
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
