"""Fixtures shared by every suite.

The real RocketMQ stores live in `tests/data/rocketmq-real/` (their origins and licences
are in its README); they are always copied before use, never opened in place.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL_STORES = REPO / "tests" / "data" / "rocketmq-real"


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
