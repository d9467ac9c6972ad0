"""The `mqstore` command line.

Every command takes the store directory as its first positional argument
(`mqstore dump DIR`, `mqstore start DIR`). Commands live one per module in
`workers/commands/`; each module defines

    NAME: str                       # the sub-command, e.g. "dump"
    HELP: str                       # one line for `mqstore --help`
    def add_arguments(p: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int   # the exit code

and is found here by name, so adding a command never edits this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

import mqstore
import mqstore.workers.commands


def _command_modules() -> list[ModuleType]:
    mods = []
    for info in pkgutil.iter_modules(mqstore.workers.commands.__path__):
        if info.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"mqstore.workers.commands.{info.name}"))
    return sorted(mods, key=lambda m: str(m.NAME))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqstore",
        description="A multi-process message store with RocketMQ's on-disk format.",
    )
    parser.add_argument("--version", action="version", version=f"mqstore {mqstore.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args._run(args)
    except BrokenPipeError:  # `mqstore dump D | head`
        sys.stderr.close()
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
