"""Hostile bytes in a store's files (issue 24): each gives a clear error, never a
traceback; `mqstore check` reports what a start refuses; a start that fails removes what
it created (shared memory, its socket) and leaves the store as it was."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

from mqstore import StoreClient
from mqstore.ipc import channel
from mqstore.ipc.locks import COMMIT_LOCK
from mqstore.workers.base import ExitCode
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store

_END_PHY_OFFSET = 24  # index file header fields (engine/indexfile.py's table)
_INDEX_COUNT = 36


def _mqstore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=120,
    )  # fmt: skip


def _stopped_store_with_keys(make_store: StoreFactory, n: int = 50) -> Store:
    store = make_store()
    with StoreClient.attach(store.path) as client:
        assert all(client.put("t", b"m%d" % i, keys=f"k{i}", queue_id=0).ok for i in range(n))
    store.wait_workers_running()
    assert store.stop() == 0
    return store


def _start_refused(store: Store) -> str:
    """Start the store, expect BOOT_ERROR and nothing left behind; the output."""
    got = _mqstore("start", str(store.path))
    out = got.stdout + got.stderr
    assert got.returncode == ExitCode.BOOT_ERROR, out
    assert "Traceback" not in out, out
    assert store.shm_leftovers() == []
    assert not (store.path / channel.SOCKET_NAME).exists()
    return out


def test_an_index_header_past_its_file_is_refused_and_checked(make_store: StoreFactory) -> None:
    """A header with a huge endPhyOffset and indexCount: the start died with a
    struct.error traceback while `check` said the store was fine."""
    store = _stopped_store_with_keys(make_store)
    (index,) = sorted((store.path / "index").iterdir())
    with open(index, "r+b") as f:
        f.seek(_END_PHY_OFFSET)
        f.write(struct.pack(">q", 1 << 62))
        f.seek(_INDEX_COUNT)
        f.write(struct.pack(">i", 0x7FFF_FFFF))
    out = _start_refused(store)
    assert f"index file {index} is damaged" in out, out
    check = _mqstore("check", str(store.path))
    assert check.returncode == 1, check.stdout
    assert f"index file {index} is damaged" in check.stdout
    # as the message says: with the file moved away, the store starts and serves
    shutil.move(index, store.path.parent / "damaged-index")
    store.start()
    assert store.stop() == 0
    assert [r.body for r in store.read_log() if r.topic == "t"] == [b"m%d" % i for i in range(50)]


def test_a_linked_commit_lock_is_refused_cleanly(make_store: StoreFactory, tmp_path: Path) -> None:
    """`.mqstore-commit.lock` a symbolic link: a traceback, exit 1 and the write pool
    (hundreds of MB) left in /dev/shm."""
    store = _stopped_store_with_keys(make_store)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not the store's")
    lock = store.path / COMMIT_LOCK
    lock.unlink()
    lock.symlink_to(target)
    out = _start_refused(store)
    assert "symbolic link" in out and COMMIT_LOCK in out, out
    assert target.read_bytes() == b"not the store's"
    lock.unlink()
    store.start()
    assert store.stop() == 0


def test_dump_of_a_short_segment_says_why(make_store: StoreFactory) -> None:
    """A 1,000-byte segment in a store of 1 MiB segments: `mqstore dump` raised."""
    store = _stopped_store_with_keys(make_store, 3)
    (first, *_rest) = sorted((store.path / "commitlog").iterdir())
    with open(first, "r+b") as f:
        f.truncate(1000)
    dump = _mqstore("dump", str(store.path))
    assert dump.returncode == 1, dump.stdout + dump.stderr
    assert "Traceback" not in dump.stderr
    assert f"segment file {first} is 1000 bytes" in dump.stderr, dump.stderr
    check = _mqstore("check", str(store.path))
    assert check.returncode == 1 and "is 1000 bytes" in check.stdout, check.stdout
