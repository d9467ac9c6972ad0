"""`mqstore start DIR [--config F] [--create]`: run the supervisor in the foreground.

DIR must exist unless `--create` is given (exit 4 otherwise), so that a mistyped path
never becomes a new, empty store while the real one sits elsewhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "start"
HELP = "run the store's supervisor in the foreground (stop it with SIGTERM or `mqstore stop`)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path)
    p.add_argument("--config", type=Path, default=None, help="mqstore.toml or broker.conf")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on metrics_host:N (overrides metrics_port; 0 = off)",
    )
    p.add_argument(
        "--create", action="store_true", help="create DIR (and its parents) when it does not exist"
    )


def run(args: argparse.Namespace) -> int:
    from mqstore.workers.supervisor import run_supervisor

    return run_supervisor(args.store_dir, args.config, args.metrics_port, args.create)
