"""The fencing steps in C, one process, real shared memory and files: a reservation's
completion against the filler's claim, the fence's seq, the fenced wait, a crashed run's
block retired, and the files a stale mapping can no longer reach (`ipc.fence`)."""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore import _native
from mqstore.engine.segment import Segment, segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.fence import (
    StoreInUse,
    fence,
    fresh_inodes,
    quiesce_leftovers,
    retire_leftovers,
)

SLOTS = 64


@pytest.fixture
def cb(tmp_path: Path) -> Iterator[c.ControlBlock]:
    block = c.ControlBlock.create(tmp_path, 1, c.Geometry(65536, 0, slot_count=SLOTS))
    yield block
    block.close()


def _reserve(cb: c.ControlBlock, n: int, size: int = 100) -> int:
    """Stand in for a producer's reservation of `n` slots (one reservation: the rest
    JOINED), as `mqs_reserve` writes them; returns its first seq."""
    first = cb.get(c.OFF_SEQ)
    at = cb.get(c.OFF_RESERVED)
    for i in range(n):
        state = c.STATE_RESERVED | (c.STATE_JOINED if i else 0)
        row = c.SLOTS_OFF + ((first + i) % SLOTS) * c.SLOT_ROW
        c.SLOT.pack_into(cb.buf, row, at + i * size, 0, 1, size, os.getpid(), -2, state)
    cb.set(c.OFF_RESERVED, at + n * size)
    cb.set(c.OFF_SEQ, first + n)
    return first


def _appender(cb: c.ControlBlock) -> _native.Appender:
    return _native.Appender(cb.buf, None, os.getpid())


def test_a_completed_reservation_is_published_whole(cb: c.ControlBlock) -> None:
    app = _appender(cb)
    try:
        first = _reserve(cb, 3)
        assert app.complete(first, 3) == 0
        assert cb.get(c.OFF_PUBLISHED_SEQ) == 3 and cb.get(c.OFF_PUBLISHED) == 300
        assert [cb.slot_state(s) for s in range(3)] == [
            c.STATE_DONE, c.STATE_DONE | c.STATE_JOINED, c.STATE_DONE | c.STATE_JOINED,
        ]  # fmt: skip
        assert _native.claim(cb.buf, 0) == 0  # done first: nothing to fill
    finally:
        app.close()


def test_the_filler_claims_the_whole_batch_and_its_producer_fails(cb: c.ControlBlock) -> None:
    """The producer copied part of its batch (one joined slot DONE already, as a
    producer marking from the last back leaves it): the claim takes all three, and the
    completion fails; nothing is published until the filler marks them DONE."""
    app = _appender(cb)
    try:
        first = _reserve(cb, 3)
        cb.set_slot_state(2, c.STATE_DONE | c.STATE_JOINED)
        assert _native.claim(cb.buf, first) == 3
        assert [cb.slot_state(s) & c.STATE_MASK for s in range(3)] == [c.STATE_FILLING] * 3
        assert app.complete(first, 3) == _native.FENCED
        assert _native.publish(cb.buf) == 0
        _native.fill_done(cb.buf, first, 3)
        assert _native.publish(cb.buf) == 3
    finally:
        app.close()


def test_a_reservation_past_the_fence_is_never_published(cb: c.ControlBlock) -> None:
    app = _appender(cb)
    try:
        before = _reserve(cb, 1)
        assert fence(cb) == 1 and _native.fence_seq(cb.buf) == 1
        assert cb.get(c.OFF_FLAGS) & (c.FLAG_FENCED | c.FLAG_REFUSE_WRITES)
        after = _reserve(cb, 2)  # a holder stopped inside the lock, resumed
        assert app.complete(after, 2) == _native.FENCED
        assert app.complete(before, 1) == 0  # seen by the fence: drained
        assert cb.get(c.OFF_PUBLISHED_SEQ) == 1  # and nothing past it
        assert fence(cb) == 1  # a second fence keeps the first one's seq
    finally:
        app.close()


def test_a_sync_waiter_of_an_ended_generation_is_fenced(cb: c.ControlBlock) -> None:
    app = _appender(cb)
    try:
        assert app.wait_flushed(100, 30_000_000) == 1  # not flushed: timed out
        fence(cb)
        cb.set(c.OFF_FLAGS, cb.get(c.OFF_FLAGS) | c.FLAG_STOPPED)
        t0 = time.monotonic()
        assert app.wait_flushed(100, 10**10) == 3
        assert time.monotonic() - t0 < 5
        cb.set(c.OFF_FLUSHED, 100)
        assert app.wait_flushed(100, 10**10) == 0  # flushed by the last drain: acked
    finally:
        app.close()


def test_a_crashed_runs_block_is_fenced_before_it_is_removed(tmp_path: Path) -> None:
    old = c.ControlBlock.create(tmp_path, 7, c.Geometry(65536, 1, slot_count=SLOTS))
    app = _native.Appender(old.buf, old.pool_buf, os.getpid())
    try:
        first = _reserve(old, 2)  # a producer that sleeps mid-copy
        names, stale = retire_leftovers(str(tmp_path))
        assert sorted(names) == sorted([old.ctl_name, old.pool_name]) and stale == -1
        assert c.leftover_shm(tmp_path) == []
        flags = old.get(c.OFF_FLAGS)
        assert flags & c.FLAG_FENCED and flags & c.FLAG_STOPPED
        assert app.complete(first, 2) == _native.FENCED  # it resumes: its put failed
        assert app.wait_flushed(200, 10**10) == 3
    finally:
        app.close()
        old.close()


def test_a_stale_mapping_writes_into_an_unlinked_inode(tmp_path: Path) -> None:
    """`fresh_inodes`: the file from the recovered end on is a new inode with the same
    bytes below the end; a mapping of the old one writes where nobody reads, and the
    files after it are gone (the allocator makes new ones)."""
    size = 1 << 16
    log = tmp_path / "commitlog"
    log.mkdir()
    for i in range(3):
        Segment.create(log, i * size, size).close()
    path = log / segment_file_name(size)
    with open(path, "r+b") as f:
        f.write(b"r" * 5000)
        f.flush()
        stale = mmap.mmap(f.fileno(), size)
    try:
        done = fresh_inodes(str(tmp_path), size, size + 4000, size + 4000)
        assert done == [str(path), str(log / segment_file_name(2 * size))]
        stale[3000:5000] = b"x" * 2000  # the sleeper's copy, after the restart
        data = path.read_bytes()
        assert len(data) == size
        assert data[:4000] == b"r" * 4000 and data[4000:5000] == bytes(1000)
    finally:
        stale.close()
    assert sorted(os.listdir(log)) == [segment_file_name(0), segment_file_name(size)]


def test_a_live_supervisors_block_is_never_called_left_by_a_crash(tmp_path: Path) -> None:
    """Its supervisor (this process: the block records our pid, and we map it) is alive:
    refused, the block untouched. Once nobody it names maps it, it is fenced at once."""
    old = c.ControlBlock.create(tmp_path, 3, c.Geometry(65536, 0, slot_count=SLOTS))
    try:
        with pytest.raises(StoreInUse, match=f"pid {os.getpid()}"):
            quiesce_leftovers(str(tmp_path), 5.0)
        assert not old.get(c.OFF_FLAGS) & c.FLAG_FENCED
        old.set(c.OFF_SUP_PID, 2**22 + 7)  # a pid nobody has: the supervisor is gone
        old.set_worker(0, "committer", os.getpid(), 0, 2)  # a worker still draining...
        t0 = time.monotonic()
        assert quiesce_leftovers(str(tmp_path), 0.3) == [os.getpid()]  # ...waited for
        assert time.monotonic() - t0 >= 0.3
        assert old.get(c.OFF_FLAGS) & c.FLAG_FENCED
    finally:
        old.close()
