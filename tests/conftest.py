"""Fixtures shared by every suite.

The real RocketMQ stores live in `tests/data/rocketmq-real/` (their origins and licences
are in its README); they are always copied before use, never opened in place.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL_STORES = REPO / "tests" / "data" / "rocketmq-real"
SHM = Path("/dev/shm")
_SHM_AT_START: set[str] = set()


def _store_segments() -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith("mqs-")} if SHM.is_dir() else set()


def _mapped_anywhere(names: set[str]) -> set[str]:
    """The names among `names` that some process still maps (or holds open)."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        used.update(n for n in names if f"/dev/shm/{n}" in maps)
    return used


def pytest_sessionstart(session: pytest.Session) -> None:
    _SHM_AT_START.update(_store_segments())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Shared memory is never left behind: a store segment that appeared during this
    session and that no process maps any more is a supervisor's that died uncleanly
    (a crash test's); it is unlinked, and named, so the machine stays clean. Only the
    controlling process does it, never an xdist worker while others still run."""
    if hasattr(session.config, "workerinput"):
        return
    new = _store_segments() - _SHM_AT_START
    for name in sorted(new - _mapped_anywhere(new)):
        (SHM / name).unlink(missing_ok=True)
        print(f"\nremoved a store's shared memory left behind by a test: {name}")


@pytest.fixture(scope="session")
def real_stores_dir() -> Path:
    if not REAL_STORES.is_dir():
        pytest.fail(f"the real RocketMQ stores are missing: expected them at {REAL_STORES}")
    return REAL_STORES


@pytest.fixture
def real_store_copy(tmp_path: Path, real_stores_dir: Path) -> Callable[[str], Path]:
    """Return a function that copies one real store (by folder name) into tmp_path."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(real_stores_dir / name, dst)
        return dst

    return copy
