"""Fixtures: a real supervisor subprocess on a temporary store, always stopped after the
test, with /dev/shm checked clean."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqstore.ipc import control as c
from tests.conftest import note_store_dirs
from tests.runtime.harness import Store

StoreFactory = Callable[..., Store]
_LOG_TAIL_LINES = 60


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so a fixture's teardown knows the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def make_store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """`make_store(config=None, env=None, start=True, config_outside=False,
    write_path=True) -> Store`; started, it has answered status and (`write_path`) its
    write path runs (`Store.start`); all stopped at teardown."""
    made: list[Store] = []

    def make(
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        *,
        start: bool = True,
        name: str = "store",
        config_outside: bool = False,
        write_path: bool = True,
    ) -> Store:
        s = Store(tmp_path / f"{name}{len(made)}", config, config_outside=config_outside)
        made.append(s)
        if start:
            s.start(env, write_path=write_path)
        return s

    yield make
    failed = getattr(request.node, "report_call", None)
    if failed is not None and failed.failed:
        for s in made:  # the supervisors' own account of what happened, in the report
            if s.log_path.exists():
                tail = s.log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
                print(f"--- {s.log_path.name} (last {len(tail)} lines) ---", *tail, sep="\n")
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


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users can traverse (pytest's own tmp dir is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="mqstore-access-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    note_store_dirs(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cb(tmp_path: Path) -> Iterator[c.ControlBlock]:
    """A small control block of its own (no store): for tests of the block's fields that
    race a writer process against this one. Its shared memory is gone afterwards."""
    block = c.ControlBlock.create(tmp_path, 1, c.Geometry(65536, 2, slot_count=64))
    yield block
    block.close()
    assert c.leftover_shm(tmp_path) == []
