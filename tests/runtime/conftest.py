"""Fixtures: a real supervisor subprocess on a temporary store, always stopped after the
test, with /dev/shm checked clean."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.harness import Store

StoreFactory = Callable[..., Store]


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """`make_store(config=None, env=None, start=True, config_outside=False) -> Store`; all
    stopped at teardown."""
    made: list[Store] = []

    def make(
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        *,
        start: bool = True,
        name: str = "store",
        config_outside: bool = False,
    ) -> Store:
        s = Store(tmp_path / f"{name}{len(made)}", config, config_outside=config_outside)
        made.append(s)
        if start:
            s.start(env)
        return s

    yield make
    problems = []
    for s in made:
        s.stop()
        left = s.shm_leftovers()
        if left:
            problems.append(f"{s.path}: shared memory left behind: {left}")
    assert not problems, problems


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """A running SYNC_FLUSH store with the pool on (1 MiB segments, 3 buffers)."""
    return make_store()
