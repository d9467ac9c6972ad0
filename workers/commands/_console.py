"""The rich `Console` of the commands: on a terminal its width; anywhere else (a pipe, a
file, a journal) wide enough that no table is ever cut or wrapped (rich would otherwise
assume 80 columns), so `mqstore status DIR > status.txt` keeps every value whole."""

from __future__ import annotations

import sys
from typing import IO, Any

PIPED_WIDTH = 10_000  # tables keep their natural width; nothing is this wide


def make_console(file: IO[str] | None = None) -> Any:
    """A `rich.console.Console` writing to `file` (default stdout)."""
    from rich.console import Console

    out = file if file is not None else sys.stdout
    return Console(file=out, width=None if out.isatty() else PIPED_WIDTH)
