"""What `python -m bench` passes to every benchmark."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Options:
    """Settings of one harness run.

    `work_root` is the temporary directory every benchmark writes under (removed by the
    harness); `duration_s` overrides each benchmark's time per configuration; `shared`
    carries results between benchmarks of the same run (the put benchmark reuses the
    peers' figures when `peers` ran first). `unique_keys` gives every put its own KEYS
    value (the default, as real producers do); off, each producer reuses one key.
    `sync_only` restricts the put benchmark to its sync rows (an A/B of the sync path).
    """

    quick: bool
    work_root: Path
    duration_s: float | None = None
    producers: tuple[int, ...] | None = None
    unique_keys: bool = True
    sync_only: bool = False
    shared: dict[str, Any] = field(default_factory=dict)

    def log(self, msg: str) -> None:
        print(msg, flush=True)
