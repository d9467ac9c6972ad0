"""Helpers shared by the commands: store arguments and opening (`dump`, `check`), the
argument types of topic and group names (every command that takes one), and the order of
DIR and ACTION (`topic`, `group`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.engine.names import group_problem, topic_problem
from mqstore.engine.storedir import StoreDir, StoreDirError


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory (mqstore's or RocketMQ's)")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="settings (TOML or RocketMQ broker.conf) for the geometry the files do not tell",
    )


def action_first(args: argparse.Namespace, actions: tuple[str, ...]) -> bool:
    """Take `mqstore CMD ACTION DIR` as `mqstore CMD DIR ACTION` (both orders are in use:
    the store directory first, as every command; the action first, as `pipeline`).
    Swaps `args.store_dir` and `args.action` when needed; False when neither is an action."""
    if args.action not in actions and str(args.store_dir) in actions:
        args.store_dir, args.action = Path(args.action), str(args.store_dir)
    return bool(args.action in actions)


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


def topic_arg(value: str) -> str:
    """argparse `type=` for a topic: RocketMQ's name rule (`engine.names`), else the
    command exits 2 with the reason, before it touches the store."""
    why = topic_problem(value)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return value


def group_arg(value: str) -> str:
    """argparse `type=` for a consumer group (`engine.names`)."""
    why = group_problem(value)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return value
