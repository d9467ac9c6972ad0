"""The committer copies the pool into the files in steps (`ipc.commit.COMMIT_STEP`), the
committed position moving after each, every step ending between two records: readers
(the dispatcher) and the backlog bound see a large commit progress, not stand still
until a whole segment's range is in the file.

In process, on real shared memory and real files (no workers): the steps, where they
end, and a pwrite that fails mid-commit (nothing advanced past what was written). Then
a real store whose committer is SIGSTOPped while a backlog builds: after SIGCONT the
committed position passes through record ends on its way."""

from __future__ import annotations

import errno
import os
import secrets
import signal
import struct
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mqstore import PutMessageStatus, StoreClient, _native
from mqstore.engine import fileio
from mqstore.engine.segment import segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.commit import COMMIT_STEP, LogFiles
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store, check_chain, wait_for

SEG = 8 << 20
MIB = 1 << 20  # the backlogs below (COMMIT_STEP is 1 MiB)


@contextmanager
def pooled_store() -> Iterator[tuple[Path, c.ControlBlock, LogFiles]]:
    """A store directory with two zeroed segment files and a running control block with
    two pool buffers (no supervisor, no workers)."""
    with tempfile.TemporaryDirectory(prefix="mqs-steps-") as tmp:
        d = Path(tmp)
        (d / "commitlog").mkdir()
        for i in range(2):
            with open(d / "commitlog" / segment_file_name(i * SEG), "wb") as f:
                f.truncate(SEG)
        geo = c.Geometry(segment_size=SEG, pool_buffers=2, slot_count=4096, qtable_capacity=16)
        cb = c.ControlBlock.create(d, 1, geo, token=secrets.token_hex(4))
        cb.set(c.OFF_FLAGS, c.FLAG_RUNNING)
        cb.set(c.OFF_ALLOCATED, 2 * SEG)
        files = LogFiles(str(d), cb, "127.0.0.1:10911")
        try:
            yield d, cb, files
        finally:
            files.close()
            cb.close()


def publish(cb: c.ControlBlock, sizes: list[int]) -> list[int]:
    """Reserve, write (a TOTALSIZE, then a fill byte) and mark DONE records of `sizes`
    in segment 0, let the producers' publish run; the records' ends."""
    at, seq = cb.get(c.OFF_RESERVED), cb.get(c.OFF_SEQ)
    view, ends = cb.pool_view(0), []
    try:
        for size in sizes:
            view[at : at + size] = struct.pack(">i", size) + bytes([seq & 0xFF]) * (size - 4)
            row = c.SLOTS_OFF + (seq % cb.slot_count) * c.SLOT_ROW
            c.SLOT.pack_into(cb.buf, row, at, seq, 1000 + seq, size, os.getpid(), 0, c.STATE_DONE)
            at, seq = at + size, seq + 1
            ends.append(at)
    finally:
        view.release()
    cb.set(c.OFF_RESERVED, at)
    cb.set(c.OFF_SEQ, seq)
    _native.publish(cb.buf)
    return ends


def _sizes(total: int) -> list[int]:
    sizes, n = [], 0
    while sum(sizes) < total:
        sizes.append(200 + (n * 7919) % 60_000)  # 200 B to 60 KB, no two steps alike
        n += 1
    return sizes


def _pool_matches_file(d: Path, cb: c.ControlBlock, upto: int) -> bool:
    view = cb.pool_view(0)
    try:
        pool = bytes(view[:upto])
    finally:
        view.release()
    with open(d / "commitlog" / segment_file_name(0), "rb") as f:
        return f.read(upto) == pool


def test_a_large_commit_moves_committed_in_steps_that_end_between_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pooled_store() as (d, cb, files):
        ends = publish(cb, _sizes(6 * MIB + 12345))
        pub = ends[-1]
        steps: list[tuple[int, int, int]] = []  # (file offset, bytes, committed before)
        real = fileio.pwrite

        def spy(fd: int, data: memoryview, offset: int, *args: object, **kw: int) -> int:
            steps.append((offset, len(data), cb.get(c.OFF_COMMITTED)))
            return real(fd, data, offset, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(fileio, "pwrite", spy)
        assert files.commit(0) == pub
        assert 4 <= len(steps) <= 7, steps
        at = 0
        for offset, n, committed_before in steps:
            assert offset == at == committed_before  # each step starts where the last moved it
            at += n
            assert at in ends  # ... and ends between two records
            assert n >= COMMIT_STEP or at == pub
            assert n < COMMIT_STEP + 60_000 or at == pub  # the last: up to 2 steps, no walk
        assert steps[-1][1] <= 2 * COMMIT_STEP
        assert at == pub == cb.get(c.OFF_COMMITTED)
        assert cb.get(c.OFF_COMMITTED_SEQ) == cb.get(c.OFF_PUBLISHED_SEQ) == len(ends)
        assert _pool_matches_file(d, cb, pub)


def test_a_pwrite_that_fails_mid_commit_leaves_committed_at_the_last_step_written() -> None:
    with pooled_store() as (d, cb, files):
        ends = publish(cb, _sizes(5 * MIB))
        seq0 = cb.get(c.OFF_COMMITTED_SEQ)

        def eio() -> BaseException:
            return OSError(errno.EIO, "injected EIO in pwrite")

        fileio.set_fault("pwrite", eio, after=2)
        try:
            with pytest.raises(fileio.StoreIOError):
                files.commit(0)
        finally:
            fileio.clear_faults()
        committed = cb.get(c.OFF_COMMITTED)
        assert committed in ends and 2 * COMMIT_STEP <= committed < 2 * COMMIT_STEP + 120_000
        assert cb.get(c.OFF_COMMITTED_SEQ) == seq0  # the stamp covers only a whole commit
        assert _pool_matches_file(d, cb, committed)
        assert files.commit(0) == ends[-1] - committed  # the rest, once the disk is back
        assert cb.get(c.OFF_COMMITTED) == ends[-1]
        assert cb.get(c.OFF_COMMITTED_SEQ) == len(ends)
        assert _pool_matches_file(d, cb, ends[-1])


def test_garbage_sizes_commit_the_range_in_one_step() -> None:
    """Bytes that are no records (never published ones): no size to follow, the range
    goes in one step, as before steps."""
    with pooled_store() as (d, cb, files):
        view = cb.pool_view(0)
        view[: 3 * MIB] = b"\xff" * (3 * MIB)
        view.release()
        row = c.SLOTS_OFF
        c.SLOT.pack_into(cb.buf, row, 0, 0, 1, 3 * MIB, os.getpid(), 0, c.STATE_DONE)
        cb.set(c.OFF_RESERVED, 3 * MIB)
        cb.set(c.OFF_SEQ, 1)
        _native.publish(cb.buf)
        assert files.commit(0) == 3 * MIB == cb.get(c.OFF_COMMITTED)
        assert _pool_matches_file(d, cb, 3 * MIB)


def _backlog(st: Store, client: StoreClient, puts: int) -> tuple[int, set[int], dict[str, Any]]:
    """Put one record and wait for its commit, SIGSTOP the committer, put `puts` records
    of 200 KiB (`puts` * 200 KiB of backlog); (where committed stood, every record end,
    the committer's status row). The caller SIGCONTs it."""
    body = b"s" * (200 << 10)
    committer = next(w for w in st.status()["workers"] if w["name"] == "committer")
    first = client.put("steps", body, wait_store=False)
    assert first.status is PutMessageStatus.PUT_OK, first
    start = first.physical_offset + first.size
    wait_for(lambda: client.positions()["committed"] >= start, 30, "the first commit")
    os.kill(committer["pid"], signal.SIGSTOP)
    try:
        ends = {start}
        for i in range(puts):
            r = client.put("steps", body + b"%d" % i, wait_store=False)
            assert r.status is PutMessageStatus.PUT_OK, r
            ends.add(r.physical_offset + r.size)
        assert client.positions()["committed"] == start  # it stood still
    except BaseException:
        os.kill(committer["pid"], signal.SIGCONT)
        raise
    return start, ends, committer


STEPS_CONFIG = {
    "flush_disk_type": "ASYNC_FLUSH",
    "segment_size_bytes": 32 << 20,
    "transient_store_pool_size": 2,
    "commit_backlog_max_bytes": 0,
}


def test_a_committer_whose_pwrite_fails_mid_backlog_committed_the_steps_before(
    make_store: StoreFactory,
) -> None:
    """A backlog of 24 MiB in one segment (the committer SIGSTOPped while it built), then
    the committer's 8th pwrite fails: it had moved the committed position over the steps
    it wrote (a record's end between where it stood and the backlog's end), not over
    nothing (one pwrite of the whole range, as before steps), and the store is read-only."""
    st = make_store(
        STEPS_CONFIG,
        env={
            "MQSTORE_FAULTS": "pwrite:EIO",
            "MQSTORE_FAULTS_AFTER": "8",
            "MQSTORE_FAULTS_FOR": "committer",
        },
    )
    st.wait_workers_running()  # a committer stopped while booting is killed, not waited on
    with StoreClient.attach(st.path) as client:
        start, ends, committer = _backlog(st, client, 120)
        os.kill(committer["pid"], signal.SIGCONT)
        wait_for(lambda: st.status().get("read_only"), 60, "the failed pwrite's read-only")
        committed = client.positions()["committed"]
    assert committed in ends, committed
    # seven steps of about COMMIT_STEP (the first pwrite was the first record's commit)
    assert start + 6 * MIB <= committed < start + 10 * MIB < max(ends), (start, committed)
    assert st.stop() == 5
    assert max(r.physical_offset + r.size for r in st.read_log()) >= committed


def test_a_stopped_committer_catches_up_through_record_ends(make_store: StoreFactory) -> None:
    """The same backlog, committed: the committed position is only ever seen at a
    record's end on its way (the dispatcher reads up to it), and the log is one chain."""
    st = make_store(STEPS_CONFIG)
    st.wait_workers_running()
    with StoreClient.attach(st.path) as client:
        start, ends, committer = _backlog(st, client, 120)
        last = max(ends)
        os.kill(committer["pid"], signal.SIGCONT)
        seen = {start}
        deadline = time.monotonic() + 60
        while (at := client.positions()["committed"]) < last:
            seen.add(at)
            assert time.monotonic() < deadline, f"committed stood at {at}, not {last}"
        seen.add(at)
    assert seen <= ends, sorted(seen - ends)  # only ever between two records
    assert st.stop() == 0
    recs = st.read_log(keep_fillers=True)
    assert len(recs) == 121
    check_chain(recs, 32 << 20)
