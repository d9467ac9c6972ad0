"""Fixtures shared by every suite.

The real RocketMQ stores live in `tests/data/rocketmq-real/` (their origins and licences
are in its README); they are always copied before use, never opened in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest

from mqstore.ipc.control import store_hash

REPO = Path(__file__).resolve().parent.parent
REAL_STORES = REPO / "tests" / "data" / "rocketmq-real"
SHM = Path("/dev/shm")
_SHM_AT_START: set[str] = set()
# The runtime-name stems (`ipc.control.store_hash`) of every directory this process's
# tests could have run a store in: only those stores' segments are ever removed here.
_OUR_STEMS: set[str] = set()
_STORE_PARTS: Final = frozenset({"commitlog", "consumequeue", "index", "config"})


def _store_segments() -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith("mqs-")} if SHM.is_dir() else set()


def note_store_dirs(root: Path) -> None:
    """Remember `root` and every directory under it (but a store's own parts) as one this
    session's tests may have run a store in; call it before removing a directory made
    outside pytest's tmp paths (a `tempfile.mkdtemp` store)."""
    for dirpath, dirnames, _files in os.walk(root):
        _OUR_STEMS.add(store_hash(dirpath))
        dirnames[:] = [d for d in dirnames if d not in _STORE_PARTS]


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


def ours(names: set[str], stems: set[str]) -> set[str]:
    """The segment names among `names` that belong to a store whose directory's stem is
    in `stems` (`mqs-<stem>-<generation>[-<token>]-ctl|pool`)."""
    return {n for n in names if n.split("-", 2)[1:2] and n.split("-", 2)[1] in stems}


def pytest_sessionstart(session: pytest.Session) -> None:
    _SHM_AT_START.update(_store_segments())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if isinstance(tmp, Path):
        note_store_dirs(tmp)  # before teardown: a fixture may remove a store's directory
    yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Shared memory is never left behind: a segment that appeared during this session,
    of a store this process's tests ran (its directory under this session's tmp paths,
    or one a fixture noted: `note_store_dirs`), that no process maps any more is a
    supervisor's that died uncleanly (a crash test's); it is unlinked, and named, so the
    machine stays clean. Segments of other sessions' stores (another worktree's tests,
    another xdist worker's) are never touched, mapped or not: each process, worker or
    not, cleans up after its own tests."""
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's tmp_path_factory
    if isinstance(factory, pytest.TempPathFactory):
        with contextlib.suppress(OSError):
            note_store_dirs(factory.getbasetemp())
    new = ours(_store_segments() - _SHM_AT_START, _OUR_STEMS)
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
