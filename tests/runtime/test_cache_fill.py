"""The allocator reads new segments into the page cache ahead of the committer (pool on,
segments not zero-written: `workers.allocator.CacheFill`), so the committer's pwrite
copies into pages that exist instead of allocating each one (bench/results/commit_cost.md)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore import StoreClient
from mqstore.engine import fileio
from mqstore.engine.segment import Segment, segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Positions
from mqstore.workers.allocator import CacheFill
from tests.engine.extents import resident_bytes
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for

SEG = 1 << 16


@pytest.fixture
def cb(tmp_path: Path) -> Iterator[c.ControlBlock]:
    block = c.ControlBlock.create(tmp_path, 1, c.Geometry(SEG, 2, slot_count=8))
    yield block
    block.close()
    assert c.leftover_shm(tmp_path) == []


def _segments(log_dir: Path, n: int) -> list[Path]:
    log_dir.mkdir(exist_ok=True)
    for i in range(n):
        Segment.create(log_dir, i * SEG, SEG).close()
    return [log_dir / segment_file_name(i * SEG) for i in range(n)]


def test_read_into_cache_reads_the_range_and_stops_at_the_end_of_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f"
    fileio.preallocate(path, 3 * 4096 + 100)
    fd = fileio.open_file(path, create=False, read_only=True)
    try:
        assert fileio.read_into_cache(fd, 4096, 8192, bytearray(4096), path) == 8192
        assert fileio.read_into_cache(fd, 8192, 1 << 20, bytearray(4096), path) == 4096 + 100
        assert fileio.read_into_cache(fd, 1 << 20, 4096, bytearray(4096), path) == 0
    finally:
        fileio.close(fd)


def test_read_into_cache_raises_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fileio.preallocate(path, 8192)
    fd = fileio.open_file(path, create=False, read_only=True)
    fileio.set_fault("pread", lambda: OSError(errno.EIO, "injected"))
    try:
        with pytest.raises(fileio.StoreIOError) as e:
            fileio.read_into_cache(fd, 0, 8192, bytearray(4096), path)
        assert (e.value.op, e.value.errno, e.value.path) == ("pread", errno.EIO, str(path))
    finally:
        fileio.clear_faults()
        fileio.close(fd)


def test_the_fill_covers_the_allocated_segments_from_the_committed_position(
    tmp_path: Path, cb: c.ControlBlock
) -> None:
    paths = _segments(tmp_path / "commitlog", 3)
    if resident_bytes(paths[2]) == SEG:
        pytest.skip("this file system keeps every page in memory (tmpfs)")
    pos = Positions(cb)
    pos.raise_allocated(3 * SEG)
    pos.advance_committed(SEG + 4096)  # segment 0 and a page of segment 1 are committed
    fill = CacheFill(str(tmp_path / "commitlog"))
    try:
        assert fill.step(cb)  # segment 1 from the committed page on: segment 2 is left
        assert resident_bytes(paths[0]) == 0
        assert resident_bytes(paths[1]) >= SEG - 4096
        assert resident_bytes(paths[2]) == 0
        assert not fill.step(cb)  # segment 2: nothing is left below `allocated`
        assert resident_bytes(paths[2]) == SEG
        assert fill.filled == 3 * SEG
        assert not fill.step(cb)  # until the allocator makes the next one
    finally:
        fill.close()


def test_the_fill_skips_a_segment_file_that_is_not_there(
    tmp_path: Path, cb: c.ControlBlock
) -> None:
    paths = _segments(tmp_path / "commitlog", 2)
    paths[0].unlink()
    Positions(cb).raise_allocated(2 * SEG)
    fill = CacheFill(str(tmp_path / "commitlog"))
    try:
        assert fill.step(cb)
        assert not fill.step(cb)
        assert fill.filled == 2 * SEG
    finally:
        fill.close()


@pytest.mark.parametrize("pool", [True, False], ids=["pool-on", "pool-off"])
def test_segments_made_ahead_under_async_flush_are_read_into_the_cache_with_the_pool_on(
    make_store: StoreFactory, pool: bool
) -> None:
    """With the pool on the allocator's segments made ahead are in the page cache before a
    put reaches them; with it off nothing reads them (producers store into the mapping,
    and a page read in ahead would be a large folio a store dirties whole)."""
    store = make_store({"flush_disk_type": "ASYNC_FLUSH", "transient_store_pool_enable": pool})
    log_dir = store.path / "commitlog"
    with StoreClient.attach(store.path) as client:
        for _ in range(24):  # 1.5 segments: the allocator makes the next ones ahead
            assert client.put("t", b"x" * 65536, queue_id=0, wait_store=False).ok
        wait_for(lambda: len(list(log_dir.iterdir())) >= 4, 60, "segments made ahead")
        newest = sorted(log_dir.iterdir())[-1]  # made ahead, never written by a put
        size = newest.stat().st_size
        if pool:
            wait_for(lambda: resident_bytes(newest) == size, 30, "the newest segment cached")
        else:
            assert resident_bytes(newest) < size
    assert store.stop() == 0
    assert os.path.exists(newest)
