"""Findings: what a `check()` reports.

Every stateful structure (segment, segment queue, commit log, pool, a whole store
directory) can check itself and return a list of findings. Tests call `check()` after
every step; `mqstore check` prints them. An ERROR means the structure breaks a
promise; a WARNING is worth an operator's eye but the store is usable (an empty
trailing pre-allocation, say); INFO is context.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2


class Finding(NamedTuple):
    """One finding. A `NamedTuple`, not a dataclass: the control block's check imports
    this module into every producer, where a dataclass's decoration is compiled at import
    (bench/results/client_start.md)."""

    severity: Severity
    what: str
    file: str | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = []
        if self.file is not None:
            where.append(self.file)
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        loc = f" ({', '.join(where)})" if where else ""
        return f"{self.severity.name}: {self.what}{loc}"


def errors(findings: list[Finding]) -> list[Finding]:
    """The findings that break a promise."""
    return [f for f in findings if f.severity is Severity.ERROR]
