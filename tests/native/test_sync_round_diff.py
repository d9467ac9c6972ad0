"""The flusher's flush step in C (`ipc/native/mqs_round.c`): its SYNC_FLUSH round
(`_native.sync_round`, called by `LogFiles.sync_round`) against its Python reference
(`LogFiles.sync_round_py`), its timed flush (`_native.flush_step`, called by
`LogFiles.flush_and_wake` and `flush`) against `flush_and_wake_py`, and the futex wake
mask (`_native.wake_mask`) against `ipc.commit.wake_mask`.

Two stores on real shared memory and real files take the same published records, round
after round (the committer sometimes committing ahead, records crossing into the next
segment, which the C step forces too): the control blocks (but the fsync's duration),
the commit-log files and `flushed_offset` must stay equal byte for byte. The Python
references run only here: `no_python` makes any call of them in `LogFiles`' production
methods fail."""

from __future__ import annotations

import errno
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import fileio, storedir
from mqstore.engine.segment import segment_file_name
from mqstore.ipc import commit
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles

SEG = 1 << 16
SEGMENTS = 3
TIME_FIELDS = {c.OFF_FSYNC_NS} | {c.OFF_FSYNC_HIST + 8 * i for i in range(c.FSYNC_HIST_BUCKETS)}


@contextmanager
def store(pool: bool, segments: int = SEGMENTS) -> Iterator[tuple[Path, c.ControlBlock, LogFiles]]:
    """A store directory with `segments` zeroed segment files and a running control block
    (no supervisor, no workers)."""
    with tempfile.TemporaryDirectory(prefix="mqs-round-") as tmp:
        d = Path(tmp)
        (d / "commitlog").mkdir()
        for i in range(segments):
            (d / "commitlog" / segment_file_name(i * SEG)).write_bytes(bytes(SEG))
        geo = c.Geometry(segment_size=SEG, pool_buffers=2 if pool else 0, slot_count=256,
                         qtable_capacity=16)  # fmt: skip
        cb = c.ControlBlock.create(d, 1, geo, token=secrets.token_hex(4))
        cb.set(c.OFF_FLAGS, c.FLAG_RUNNING)
        cb.set(c.OFF_ALLOCATED, segments * SEG)
        files = LogFiles(str(d), cb, "127.0.0.1:10911")
        try:
            yield d, cb, files
        finally:
            files.close()
            cb.close()


def publish(d: Path, cb: c.ControlBlock, sizes: list[int], fill: int) -> None:
    """Reserve, write and mark DONE records of `sizes` (a record that would leave less
    than a BLANK's room in its segment gets one first), then let the producers' publish
    run and ask for a flush of their end, as a sync producer does."""
    at, seq = cb.get(c.OFF_RESERVED), cb.get(c.OFF_SEQ)
    for size in sizes:
        room = SEG - at % SEG
        if size + 8 > room:
            write_slot(d, cb, seq, at, room, fill)  # the BLANK that ends the segment
            at, seq = at + room, seq + 1
        if at + size > cb.get(c.OFF_ALLOCATED) - 8:
            break
        write_slot(d, cb, seq, at, size, fill + seq)
        at, seq = at + size, seq + 1
    cb.set(c.OFF_RESERVED, at)
    cb.set(c.OFF_SEQ, seq)
    _native.publish(cb.buf)
    cb.set(c.OFF_SYNC_REQUEST, at)


def write_slot(d: Path, cb: c.ControlBlock, seq: int, at: int, size: int, fill: int) -> None:
    data = bytes([fill & 0xFF]) * size
    index, pos = divmod(at, SEG)
    if cb.pool_buffers:
        view = cb.pool_view(index)
        view[pos : pos + size] = data
        view.release()
    else:  # the producers write the file's mapping; the same bytes through the file here
        fd = os.open(d / "commitlog" / segment_file_name(index * SEG), os.O_WRONLY)
        os.pwrite(fd, data, pos)
        os.close(fd)
    row = c.SLOTS_OFF + (seq % cb.slot_count) * c.SLOT_ROW
    c.SLOT.pack_into(cb.buf, row, at, seq, 1000 + seq, size, os.getpid(), 0, c.STATE_DONE)


def state(d: Path, cb: c.ControlBlock) -> tuple[dict[int, int], list[bytes], bytes]:
    ctl = {off: cb.get(off) for off in range(8, 448, 8) if off not in TIME_FIELDS}
    ctl[c.OFF_FLUSH_SEQ] = cb.get(c.OFF_FLUSH_SEQ) & 0xFFFF_FFFF
    logs = [p.read_bytes() for p in sorted((d / "commitlog").iterdir())]
    off = d / storedir.FLUSHED_OFFSET_FILE
    return ctl, logs, off.read_bytes() if off.exists() else b""


rounds = st.lists(
    st.tuples(
        st.lists(st.integers(60, 9000), min_size=0, max_size=12),  # records before the round
        st.booleans(),  # the committer commits them first
        st.integers(0, 3),  # gather for this many more messages (0: no gather)
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(pool=st.booleans(), plan=rounds)
def test_the_c_round_matches_its_python_twin(
    pool: bool, plan: list[tuple[list[int], bool, int]]
) -> None:
    assert fileio.seams_quiet("pwrite", "fdatasync")  # else both rounds are the twin's
    with store(pool) as (da, a, fa), store(pool) as (db, b, fb):
        for i, (sizes, committer_first, gather) in enumerate(plan):
            for d, cb, files in ((da, a, fa), (db, b, fb)):
                publish(d, cb, sizes, fill=i)
                if committer_first:
                    files.commit(0)
            want = a.get(c.OFF_PUBLISHED_SEQ) + gather if gather else 0
            got = fa.sync_round(want, 1000)
            twin = fb.sync_round_py(want, 1000)
            assert (got is None) == (twin is None)
            assert state(da, a) == state(db, b)
            assert a.get(c.OFF_FLUSHED) == a.get(c.OFF_COMMITTED) >= a.get(c.OFF_SYNC_REQUEST)


timed = st.lists(
    st.tuples(
        st.lists(st.integers(60, 9000), min_size=0, max_size=12),  # records before the flush
        st.sampled_from([0, 0, 1, 2, 4, 16]),  # least pages
        st.booleans(),  # flush() (bytes) rather than flush_and_wake() (times)
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(pool=st.booleans(), plan=timed)
def test_the_c_timed_flush_matches_its_python_reference(
    pool: bool, plan: list[tuple[list[int], int, bool]]
) -> None:
    """The timed flush (ASYNC_FLUSH's interval flush, the SYNC_FLUSH flusher's timed one,
    the supervisor's drain): the least-pages rule, segment boundaries, the statistics,
    the positions, flushed_offset and the wake, in C as in Python."""
    with store(pool) as (da, a, fa), store(pool) as (db, b, fb):
        for i, (sizes, least, as_bytes) in enumerate(plan):
            for d, cb, files in ((da, a, fa), (db, b, fb)):
                publish(d, cb, sizes, fill=i)
                files.commit(0)  # the committer's step
            if as_bytes:  # flush() is flush_and_wake() returning the bytes it forced
                before = b.get(c.OFF_FLUSHED)
                fb.flush_and_wake_py(least)
                assert fa.flush(least) == b.get(c.OFF_FLUSHED) - before
            else:
                got, ref = fa.flush_and_wake(least), fb.flush_and_wake_py(least)
                assert (got is None) == (ref is None)
            assert state(da, a) == state(db, b)


@pytest.mark.parametrize("step", ["flush", "sync_round"])
def test_a_range_over_more_files_than_one_call_takes(
    step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[flushed, committed) over 11-12 files, more than one C call takes (ROUND_SEGS): every
    file is forced, in order, and the step ends where the reference does (positions,
    flushed_offset); it counts a force per call."""
    n = 12
    watch = _Watch()
    with store(False, n) as (da, a, fa), store(False, n) as (db, b, fb):
        sizes = [6000] * (11 * SEG // 6000)
        for d, cb in ((da, a), (db, b)):
            publish(d, cb, sizes, fill=5)
        fb.commit(0)
        fb.flush_and_wake_py(0)
        forbid_python(monkeypatch)
        fileio.set_sync_watch(watch)
        try:
            if step == "flush":
                fa.commit(0)
                assert fa.flush(0) == a.get(c.OFF_COMMITTED) > 10 * SEG
            else:
                assert fa.sync_round(0, 0) is not None
        finally:
            fileio.set_sync_watch(None)
        forced = [name for name, _data in watch.synced if name.isdigit()]
        last = (a.get(c.OFF_COMMITTED) - 1) // SEG
        assert last > 8 and forced == [segment_file_name(i * SEG) for i in range(last + 1)]
        fields = (c.OFF_FLUSHED, c.OFF_FLUSHED_SEQ, c.OFF_FLUSHED_TS, c.OFF_FSYNC_MSGS)
        assert [a.get(f) for f in fields] == [b.get(f) for f in fields]
        assert a.get(c.OFF_FLUSHED) == a.get(c.OFF_COMMITTED)
        assert a.get(c.OFF_FSYNC_COUNT) == 2 and b.get(c.OFF_FSYNC_COUNT) == 1
        assert state(da, a)[1:] == state(db, b)[1:]  # the files, flushed_offset


@pytest.mark.usefixtures("no_python")
def test_a_missing_file_under_committed_bytes_fails_the_step() -> None:
    """Committed bytes in a file that is not there (deleted under the store): the C step
    forces what it can and then fails as opening the file would, ENOENT."""
    with store(False) as (d, cb, files):
        publish(d, cb, [9000] * 10, fill=2)  # into the second segment
        files.commit(0)
        (d / "commitlog" / segment_file_name(SEG)).unlink()
        with pytest.raises(fileio.StoreIOError) as ei:
            files.flush(0)
        assert (ei.value.op, ei.value.errno) == ("open", errno.ENOENT)
        assert ei.value.path.endswith(segment_file_name(SEG))
        assert cb.get(c.OFF_FLUSHED) == SEG  # the first file's end: a record boundary


@pytest.mark.usefixtures("no_python")
@pytest.mark.parametrize("pool", [True, False])
def test_a_file_made_after_the_step_looked_is_found(pool: bool) -> None:
    """The C step's files are opened once and kept; one that was not there yet (the
    allocator behind) is looked for again when a round needs it."""
    with store(pool) as (d, cb, files):
        nxt = d / "commitlog" / segment_file_name(SEG)
        nxt.rename(d / "aside")
        cb.set(c.OFF_ALLOCATED, SEG)
        publish(d, cb, [1000], fill=1)
        assert files.sync_round(0, 0) is not None  # segment 1: looked for, not there
        (d / "aside").rename(nxt)
        cb.set(c.OFF_ALLOCATED, 2 * SEG)
        publish(d, cb, [9000] * 8, fill=2)  # into segment 1
        assert files.sync_round(0, 0) is not None
        assert cb.get(c.OFF_FLUSHED) == cb.get(c.OFF_COMMITTED) == cb.get(c.OFF_PUBLISHED)
        assert cb.get(c.OFF_FLUSHED) > SEG


@settings(max_examples=500, deadline=None)
@given(st.integers(-5, 1 << 40), st.integers(-(1 << 18), 1 << 18))
def test_the_wake_bits_match_their_python_twins(start: int, n: int) -> None:
    assert _native.wake_mask(start, start + n) == commit.wake_mask(start, start + n)
    assert _native.wait_bits(start + n) == commit.wait_bits(start + n)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 1 << 40), st.integers(1, 1 << 18), st.integers(0, 1 << 18))
def test_a_flush_wakes_every_waiter_it_covered(start: int, n: int, k: int) -> None:
    """The waiter for any end in (start, start + n] sleeps with a bit of the mask; one
    beyond, in a bucket that does not alias a covered one modulo 32, does not (it sleeps
    on)."""
    mask = commit.wake_mask(start, start + n)
    end = start + 1 + k % n
    assert mask & commit.wait_bits(end)
    shift = commit.WAKE_SHIFT
    first, last = (start + 1) >> shift, (start + n) >> shift
    beyond = start + n + 1 + k
    ahead = (beyond >> shift) - last  # buckets past the last one covered
    if mask != commit.WAKE_ANY and 1 <= ahead <= 31 - (last - first):
        assert not mask & commit.wait_bits(beyond)


def test_a_failed_write_moves_nothing_and_says_which_call() -> None:
    with store(pool=True) as (d, cb, _files):
        publish(d, cb, [1000, 2000], fill=1)
        path = d / "commitlog" / segment_file_name(0)
        ro = os.open(path, os.O_RDONLY)
        lock = os.open(d / "lock-for-test", os.O_RDWR | os.O_CREAT, 0o600)
        off = os.open(d / storedir.FLUSHED_OFFSET_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            code, op, err, *_ = _native.sync_round(cb.buf, cb.pool_buf, 0, (ro,), lock, off, 0, 0)
        finally:
            for fd in (ro, lock, off):
                os.close(fd)
        assert (code, op, err) == (commit.ROUND_FAILED, 2, errno.EBADF)
        assert cb.get(c.OFF_COMMITTED) == cb.get(c.OFF_FLUSHED) == 0
        assert cb.get(c.OFF_FSYNC_COUNT) == 0


def forbid_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, `LogFiles`' production flush step (`sync_round`, `flush`,
    `flush_and_wake`) must never run the Python references."""

    def reference(*_args: object) -> None:
        raise AssertionError("the Python reference ran instead of the C flush step")

    for name in ("sync_round_py", "flush_py", "flush_and_wake_py"):
        monkeypatch.setattr(LogFiles, name, reference)


@pytest.fixture
def no_python(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_python(monkeypatch)


@pytest.mark.usefixtures("no_python")
@pytest.mark.parametrize("pool", [True, False])
def test_a_fault_set_on_fdatasync_fails_the_c_round(pool: bool) -> None:
    """The fault seam reaches the C round's own calls (issue 24: a fault used to switch
    the round to its twin, so the fault suites never ran the production round)."""
    with store(pool) as (d, cb, files):
        publish(d, cb, [1000], fill=1)
        fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected"))
        try:
            with pytest.raises(fileio.StoreIOError, match="fdatasync") as ei:
                files.sync_round(0, 0)
        finally:
            fileio.clear_faults()
        assert ei.value.errno == errno.EIO and ei.value.path.endswith(segment_file_name(0))
        assert cb.get(c.OFF_FLUSHED) == 0 and cb.get(c.OFF_FSYNC_COUNT) == 0
        assert files.sync_round(0, 0) is not None
        assert cb.get(c.OFF_FLUSHED) == 1000


class _Watch:
    """A sync watch that keeps what each sync was about to make durable."""

    def __init__(self) -> None:
        self.synced: list[tuple[str, bytes]] = []

    def data_synced(self, path: fileio.StrPath, offset: int, length: int) -> None:
        self.synced.append((os.path.basename(path), Path(path).read_bytes()))

    def dir_synced(self, path: fileio.StrPath) -> None:
        pass

    def renamed(self, src: fileio.StrPath, dst: fileio.StrPath) -> None:
        pass


@pytest.mark.usefixtures("no_python")
@pytest.mark.parametrize("pool", [True, False])
def test_the_c_round_tells_the_sync_watch_what_it_forces(pool: bool) -> None:
    """The power-loss suite's recorder sees the C round's fdatasync, with the segment's
    content at that moment: the committed records are in it."""
    watch = _Watch()
    with store(pool) as (d, cb, files):
        publish(d, cb, [1000, 500], fill=7)
        fileio.set_sync_watch(watch)
        try:
            assert files.sync_round(0, 0) is not None
        finally:
            fileio.set_sync_watch(None)
        assert [name for name, _data in watch.synced] == [segment_file_name(0)]
        content = watch.synced[0][1]
        assert content[:1500] == bytes([7]) * 1000 + bytes([8]) * 500
        assert cb.get(c.OFF_FLUSHED) == 1500


def _round_fds(d: Path) -> tuple[int, int, int]:
    seg = os.open(d / "commitlog" / segment_file_name(0), os.O_RDWR)
    lock = os.open(d / "lock-for-test", os.O_RDWR | os.O_CREAT, 0o600)
    off = os.open(d / storedir.FLUSHED_OFFSET_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    return seg, lock, off


@pytest.mark.parametrize("fail_at", [None, 0, 1, 2, 3, 4])
def test_the_io_hook_is_asked_before_each_call(fail_at: int | None) -> None:
    """`io_hook(op, fd)`: every flock, pwrite and fdatasync of the round asks it first,
    in order; the call it answers with an errno fails the round with that errno (nothing
    after it runs)."""
    with store(pool=True) as (d, cb, _files):
        publish(d, cb, [1000, 2000], fill=1)
        seg, lock, off = _round_fds(d)
        asked: list[tuple[int, int]] = []

        def hook(op: int, fd: int) -> int:
            asked.append((op, fd))
            return errno.ENOSPC if len(asked) - 1 == fail_at else 0

        try:
            code, op, err, *_ = _native.sync_round(
                cb.buf, cb.pool_buf, 0, (seg,), lock, off, 0, 0, hook
            )
        finally:
            for fd in (seg, lock, off):
                os.close(fd)
        every = [(1, lock), (2, seg), (1, lock), (3, seg), (2, off)]  # flock, pwrite, ...
        if fail_at is None:
            assert asked == every and code == commit.ROUND_FORCED
            assert cb.get(c.OFF_FLUSHED) == 3000
            return
        failed_op = {0: 1, 1: 2, 2: None, 3: 3, 4: 4}[fail_at]
        if failed_op is None:  # the unlock's answer is not checked: the round goes on
            assert asked == every and code == commit.ROUND_FORCED
            return
        assert (code, op, err) == (commit.ROUND_FAILED, failed_op, errno.ENOSPC)
        # a failed pwrite of the records still unlocks (asked once more) and stops there
        assert asked == (every[:3] if fail_at == 1 else every[: fail_at + 1])
        assert cb.get(c.OFF_FLUSHED) == (3000 if fail_at == 4 else 0)


def test_the_io_hook_must_be_callable() -> None:
    with store(pool=True) as (_d, cb, _files), pytest.raises(TypeError, match="io_hook"):
        _native.sync_round(cb.buf, cb.pool_buf, 0, (0,), 0, 0, 0, 0, 42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pool", "op", "after"),
    [
        (True, "pwrite", 0),  # the records' pwrite from the pool
        (True, "pwrite", 1),  # flushed_offset's, after the records'
        (True, "fdatasync", 0),
        (False, "pwrite", 0),  # pool off: flushed_offset's is the round's only pwrite
        (False, "fdatasync", 0),
    ],
)
def test_a_fault_fails_the_c_round_as_it_fails_the_twin(pool: bool, op: str, after: int) -> None:
    """The same fault (`fileio.set_fault`, `after` calls let through first) in the C round
    and in its twin: the same error and the same control block, files and
    flushed_offset afterwards."""
    errors = []
    with store(pool) as (da, a, fa), store(pool) as (db, b, fb):
        for d, cb, run in ((da, a, fa.sync_round), (db, b, fb.sync_round_py)):
            publish(d, cb, [1000, 300], fill=3)
            fileio.set_fault(op, lambda: OSError(errno.EIO, "injected"), after=after)
            try:
                with pytest.raises(fileio.StoreIOError) as ei:
                    run(0, 0)
            finally:
                fileio.clear_faults()
            errors.append((ei.value.op, ei.value.errno, os.path.basename(ei.value.path)))
            del ei  # its frames hold views of the pool, which must close with the store
        assert errors[0] == errors[1]
        assert state(da, a) == state(db, b)


@pytest.mark.parametrize(
    "args",
    [
        (),
        (bytearray(16), None, 0, (), 0, 0, 0, 0),  # not a control block
        ("ctl", None, 0, (), 0, 0, 0, 0),
    ],
)
def test_bad_arguments_raise(args: tuple[object, ...]) -> None:
    with pytest.raises((TypeError, ValueError)):
        _native.sync_round(*args)  # type: ignore[arg-type]


def test_a_pool_that_is_not_the_blocks_is_refused() -> None:
    with store(pool=True) as (_d, cb, _files):
        with pytest.raises(ValueError, match="pool"):
            _native.sync_round(cb.buf, None, 0, (0,), 0, 0, 0, 0)
        with pytest.raises(ValueError, match="descriptors"):
            _native.sync_round(cb.buf, cb.pool_buf, 0, (0,), -1, 0, 0, 0)
        with pytest.raises(ValueError, match="seg_fds"):
            _native.sync_round(cb.buf, cb.pool_buf, 0, (-2,), 0, 0, 0, 0)
        with pytest.raises(TypeError, match="seg_fds"):
            _native.sync_round(cb.buf, cb.pool_buf, 0, (0,) * 9, 0, 0, 0, 0)
        with pytest.raises(TypeError, match="seg_fds"):
            _native.flush_step(cb.buf, 0, [0], 0, 0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="offset_fd"):
            _native.flush_step(cb.buf, 0, (0,), -1, 0)
