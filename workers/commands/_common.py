"""Helpers shared by the commands: store arguments, opening and settings (`dump`, `check`,
`clean`), the argument types of topic and group names and of times (every command that
takes one), the one spelling of the options several commands share (`--limit`,
`--begin`/`--end`) and the line saying an output was cut, and the order of DIR and
ACTION (`topic`, `group`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


def parse_time_ms(text: str) -> int:
    """argparse `type=` for a time: epoch milliseconds (`1700000000000`) or ISO 8601
    (`2026-11-22T10:00`; UTC unless it carries an offset, `Z` too)."""
    raw = text.strip()
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither epoch milliseconds nor an ISO 8601 time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


DEFAULT_LIMIT = 32  # messages a reading command prints unless --limit says otherwise


class _Deprecated(argparse.Action):
    """A hidden, deprecated spelling of another option: same destination, and a line on
    stderr naming the spelling to use."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog}: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated(p: argparse.ArgumentParser, old: str, new: str, dest: str, **kw: Any) -> None:
    """`old` as a hidden spelling of the option `new` (whose destination is `dest`)."""
    p.add_argument(
        old, dest=dest, action=_Deprecated, new=new, default=argparse.SUPPRESS,
        help=argparse.SUPPRESS, **kw,
    )  # fmt: skip


def add_limit_arguments(
    p: argparse.ArgumentParser, *, default: int | None = DEFAULT_LIMIT, old: str | None = None
) -> None:
    """`--limit N`: at most N messages (`old`: its deprecated spelling in this command)."""
    shown = "all" if default is None else str(default)
    p.add_argument(
        "--limit", type=int, default=default, metavar="N", help=f"at most N messages ({shown})"
    )
    if old is not None:
        add_deprecated(p, old, "--limit", "limit", type=int, metavar="N")


def add_time_arguments(
    p: argparse.ArgumentParser,
    *,
    begin_default: int | None = 0,
    end_default: int | None = None,
    old: tuple[str, str] | None = None,
    dests: tuple[str, str] = ("begin", "end"),
) -> None:
    """`--begin T` and `--end T`: a time range (epoch ms or ISO 8601, `parse_time_ms`),
    into `dests` (`old`: their deprecated spellings in this command)."""
    p.add_argument(
        "--begin", dest=dests[0], type=parse_time_ms, default=begin_default,
        metavar="T", help="from this time (epoch ms or ISO 8601, UTC unless it says)",
    )  # fmt: skip
    p.add_argument(
        "--end", dest=dests[1], type=parse_time_ms, default=end_default, metavar="T",
        help="up to this time (default: no end)",
    )  # fmt: skip
    if old is not None:
        for spelling, new, dest in zip(old, ("--begin", "--end"), dests, strict=True):
            add_deprecated(p, spelling, new, dest, type=parse_time_ms, metavar="T")


def say_cut(cmd: str, limit: int, rest: str) -> None:
    """The line (stderr) of a command that stopped at its `--limit` while more was there:
    `rest` says how to get the rest."""
    print(f"mqstore {cmd}: stopped at --limit {limit}; {rest}", file=sys.stderr)
