"""Helpers shared by the commands: store arguments, opening and settings (`dump`, `check`,
`clean`), the
argument types of topic and group names (every command that takes one), and the order of
DIR and ACTION (`topic`, `group`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.conf.settings import StoreSettings
from mqstore.engine import geometry
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


def add_action_arguments(p: argparse.ArgumentParser, actions: tuple[str, ...]) -> None:
    """`DIR ACTION`, for a command with actions (`topic`, `group`); see `action_first`."""
    p.add_argument("store_dir", type=Path, help="the store directory")
    choices = f"{', '.join(actions[:-1])} or {actions[-1]}"
    p.add_argument("action", metavar="ACTION", help=choices)


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
        recorded = geometry.read_record(args.store_dir)  # the store's own, if any
        s = loaded.settings
        configured: int | None = None  # None: the files tell
        if recorded is not None:
            configured = recorded.segment_size_bytes
            index = (recorded.hash_slot_num, recorded.index_num)
        else:
            if loaded.source_of("segment_size_bytes") != "default":
                configured = s.segment_size_bytes
            index = (s.max_hash_slot_num, s.max_index_num)
        return StoreDir(args.store_dir, segment_size_bytes=configured, index_geometry=index)
    except (ConfigError, StoreDirError, OSError, geometry.GeometryRecordError) as e:
        print(f"mqstore {cmd}: {e}", file=sys.stderr)
        return None


def store_settings(cmd: str, args: argparse.Namespace) -> StoreSettings | None:
    """The settings of the store at `args.store_dir` (with `args.config` and the
    environment), or print why not (not a store, a bad setting) to stderr and return None."""
    if not (Path(args.store_dir) / "commitlog").is_dir():
        print(f"mqstore {cmd}: {args.store_dir} is not a store (no commitlog/)", file=sys.stderr)
        return None
    try:
        settings = load_settings(args.store_dir, args.config, os.environ).settings
        return geometry.with_record(args.store_dir, settings)
    except (ConfigError, geometry.GeometryRecordError) as e:
        print(f"mqstore {cmd}: {e}", file=sys.stderr)
        return None


def below_minimum(cmd: str, *options: tuple[str, int | None, int]) -> bool:
    """For each (option, value, minimum): a value given below its minimum is printed as
    `mqstore CMD: OPTION must be >= MINIMUM` (stderr); True when one was (exit 2)."""
    for option, value, minimum in options:
        if value is not None and value < minimum:
            print(f"mqstore {cmd}: {option} must be >= {minimum}", file=sys.stderr)
            return True
    return False


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
