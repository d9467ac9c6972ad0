"""`mqstore config show DIR [--config F] [--json]`: effective settings and their sources.

A bad configuration (unknown key, bad value, missing file) exits 3, as `mqstore start`
does (`ExitCode.CONFIG_ERROR`). The broker.conf keys that mqstore does not use are listed
after the table (`"ignored"` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.conf.settings import settings_doc
from mqstore.workers.base import ExitCode
from mqstore.workers.commands._console import make_console

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
        return int(ExitCode.CONFIG_ERROR)
    rows = [(n, v, loaded.source_of(n)) for n, v in settings_doc(loaded.settings).items()]
    if args.json:
        doc = {n: {"value": v, "source": s} for n, v, s in rows}
        print(json.dumps({**doc, "ignored": list(loaded.ignored)}, indent=2))
        return 0
    from rich.table import Table

    t = Table("setting", "value", "source")
    for n, v, s in rows:
        t.add_row(n, str(v), s)
    console = make_console()
    console.print(t)
    if loaded.ignored:
        console.print("ignored (RocketMQ keys mqstore does not use): " + ", ".join(loaded.ignored))
    return 0
