"""`mqstore config show DIR [--config F] [--json]`: effective settings and their sources."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from enum import Enum
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings

NAME = "config"
HELP = "show the effective store settings and where each came from"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["show"])
    p.add_argument("store_dir", type=Path)
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_settings(args.store_dir, args.config, os.environ)
    except ConfigError as e:
        print(f"mqstore config: {e}", file=sys.stderr)
        return 2
    rows = []
    for f in dataclasses.fields(loaded.settings):
        v = getattr(loaded.settings, f.name)
        v = v.value if isinstance(v, Enum) else list(v) if isinstance(v, tuple) else v
        rows.append((f.name, v, loaded.source_of(f.name)))
    if args.json:
        print(json.dumps({n: {"value": v, "source": s} for n, v, s in rows}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table("setting", "value", "source")
    for n, v, s in rows:
        t.add_row(n, str(v), s)
    Console().print(t)
    return 0
