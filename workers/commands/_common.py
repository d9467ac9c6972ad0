"""Helpers shared by the read-only commands (`dump`, `check`): arguments and opening."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.engine.storedir import StoreDir, StoreDirError


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory (mqstore's or RocketMQ's)")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="settings (TOML or RocketMQ broker.conf) for the geometry the files do not tell",
    )


def open_store(cmd: str, args: argparse.Namespace) -> StoreDir | None:
    """Open `args.store_dir` read-only, or print why not (to stderr) and return None."""
    try:
        loaded = load_settings(args.store_dir, args.config, os.environ)
        configured = None
        if loaded.source_of("segment_size_bytes") != "default":
            configured = loaded.settings.segment_size_bytes
        return StoreDir(args.store_dir, segment_size_bytes=configured)
    except (ConfigError, StoreDirError, OSError) as e:
        print(f"mqstore {cmd}: {e}", file=sys.stderr)
        return None
