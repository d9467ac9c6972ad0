"""The dispatcher's C round (`plain_c=True`) and its Python path (`plain_c=False`) on a
bad day: the file a roll needs -- the next consume-queue file or the next index file --
cannot be made (ENOSPC, EIO), through the store's one fault seam (`fileio.set_fault`
on `fallocate`, which every new queue and index file asks for space with).

Four ways on from the failed roll, as the store takes them (`WAYS`):

* wait (ENOSPC): the dispatcher waits for space and dispatches again from the same
  offset (`workers.dispatcher.round_or_wait_for_space`);
* stop (ENOSPC): the store is stopped while the dispatcher waits; the next start's
  normal recovery and the dispatcher resume from the queues' end;
* recover (EIO): the store turns read-only, the dispatcher is halted; the next start
  closes every file and recovery re-dispatches what the queues or the index lack
  (`engine.redispatch`), then the dispatcher goes on from the queues' end;
* recover-full (ENOSPC): as recover, but a roll of the recovery's re-dispatch fails too:
  it defers the rest to the dispatcher (`Dispatcher.defer_on_no_space`), which resumes
  from the queues' end.

Every way, once the cause is gone, every message must be pullable exactly once from its
queue (dense queue offsets, no pre-blank where no filler was) and found by every key it
has, and the files must be the bytes a run without the fault writes (queue files by name;
index files in name order, not by name: names are creation times).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.engine import fileio
from mqstore.engine.checkpoint import CheckpointFields
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher, DispatchResult, DispatchStop
from mqstore.engine.indexservice import IndexService
from mqstore.engine.record import Message
from mqstore.engine.redispatch import Holdings, redispatch

SEGMENT = 1 << 20
SLOTS = 16
T0 = 1_700_000_000_000
QUEUES = [("T", 0), ("T", 1), ("U", 0)]
N = 300


class _Clock:
    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> int:
        self.ms += 7
        return self.ms


def _keys(i: int) -> list[str]:
    """Record i's KEYS tokens (1-4, with its UNIQ_KEY 2-5 keys a record: an index file's
    63 keys end inside a record, or with one)."""
    return [f"k{i}", f"j{i}", f"h{i}", f"g{i}"][: 1 + i % 4]


def _write_log(path: Path) -> tuple[CommitLog, list[tuple[str, int, int, list[str]]]]:
    """N messages over QUEUES; (topic, queue id, physical offset, keys) of each."""
    log = CommitLog.open(path, SEGMENT, clock_ms=_Clock())
    out = []
    for i in range(N):
        topic, q = QUEUES[i % 7 % 3]
        keys = _keys(i)
        props = {"KEYS": " ".join(keys), "TAGS": "t", "UNIQ_KEY": f"U{i:06d}"}
        msg = Message(topic, b"b" * (i % 50), props, queue_id=q, born_timestamp=T0,
                      born_host="10.0.0.1:5000", store_host="10.0.0.2:10911")  # fmt: skip
        got = log.append(msg)
        assert got.ok, got
        out.append((topic, q, got.wrote_offset, [f"U{i:06d}", *keys]))
    return log, out


def _open(
    store: Path, log: CommitLog, plain_c: bool, geo: tuple[int, int], clock: _Clock
) -> Dispatcher:
    """A dispatcher as a (re)started process opens one: queues loaded and recovered,
    index loaded. `clock` names index files: it goes on over restarts (the index loads
    its files in name order, newest last)."""
    cq_file, entries = geo
    cqs = ConsumeQueueStore(store, cq_file).load()
    cqs.recover()
    idx = IndexService(store, SLOTS, entries, clock_ms=clock)
    idx.load()
    return Dispatcher(log, cqs, idx, checkpoint=CheckpointFields(), plain_c=plain_c)


def _close(d: Dispatcher) -> None:
    d.queues.close()
    assert d.index is not None
    d.index.close()


def _fault(err: int, after: int) -> None:
    def factory() -> BaseException:
        return OSError(err, f"injected {errno.errorcode[err]} in fallocate")

    fileio.set_fault("fallocate", factory, after=after)


@pytest.fixture(autouse=True)
def _no_faults_left() -> Iterator[None]:
    yield
    fileio.clear_faults()


# How the dispatcher goes on after a failed roll (the module doc), and the errno it met.
WAYS = {
    "wait": errno.ENOSPC,  # waits for space, dispatches again from the round's start
    "stop": errno.ENOSPC,  # stopped while it waited; a clean start resumes at the queues' end
    "recover": errno.EIO,  # read-only; the next start's recovery re-dispatches
    # as recover, on a full disk: the recovery's own roll fails too (it defers the rest
    # to the dispatcher, `Dispatcher.defer_on_no_space`), then the dispatcher resumes
    # from the queues' end
    "recover-full": errno.ENOSPC,
}


def _run(
    store: Path,
    log: CommitLog,
    plain_c: bool,
    geo: tuple[int, int],
    rounds: int,
    fail: list[int],
    way: str,
) -> tuple[Dispatcher, int, int]:
    """Dispatch the whole log in rounds of `rounds` records; the fallocate after each
    count in `fail` (successful ones, counted from the last failure) fails with the
    errno of `way`, and the dispatcher goes on that way. Returns the dispatcher, the
    failures met and the C round's calls before the first."""
    clock = _Clock()
    d = _open(store, log, plain_c, geo, clock)
    todo, err = list(fail), WAYS[way]
    if todo:
        _fault(err, todo.pop(0))
    failures = c_rounds = 0
    off, end = d.resume_offset(), log.max_offset()
    published = off  # Positions.dispatched: the end of the last round that returned
    while off < end:
        try:
            res = d.dispatch(off, end, max_records=rounds)
        except fileio.StoreIOError as e:
            failures += 1
            if failures == 1:
                c_rounds = d.plain_rounds
            fileio.clear_faults()  # space freed, or the disk replaced: the cause is gone
            assert fileio.is_no_space(e) is (err == errno.ENOSPC), e
            if way == "wait":
                pass  # the dispatcher process dispatches again from the same offset
            elif way == "stop":
                # a clean stop: the next start's normal recovery re-dispatches from the
                # queues' end (RocketMQ's reput catch-up), and so does the dispatcher
                _close(d)
                d = _open(store, log, plain_c, geo, clock)
                off = published = d.resume_offset()
            else:
                # read-only, halted; the next start: recovery re-dispatches what the
                # queues or the index lack, the dispatcher goes on from the queues' end
                _close(d)
                d = _open(store, log, plain_c, geo, clock)
                res = DispatchResult(0, 0, DispatchStop.END_OF_DATA)
                assert d.index is not None
                if way == "recover-full":
                    d.defer_on_no_space = True
                    _fault(err, 1)  # the second file recovery makes: a roll
                redispatch(log, Holdings(d.queues, d.index), d, res, (0, end))
                if way == "recover-full":
                    assert d.deferred, "the recovery met no roll"
                    fileio.clear_faults()
                    _close(d)  # the dispatcher process: its own files, from the queues' end
                    d = _open(store, log, plain_c, geo, clock)
                off = published = d.resume_offset()
            if todo:
                _fault(err, todo.pop(0))
            continue
        assert res.next_offset > off, res
        off = published = res.next_offset
    assert published == end
    return d, failures, c_rounds


def _files(store: Path) -> tuple[dict[str, bytes], list[bytes]]:
    cq = {
        str(p.relative_to(store)): p.read_bytes()
        for p in sorted((store / "consumequeue").rglob("*"))
        if p.is_file()
    }
    index = [p.read_bytes() for p in sorted((store / "index").iterdir()) if p.is_file()]
    return cq, index


def _check_end_state(d: Dispatcher, records: list[tuple[str, int, int, list[str]]]) -> None:
    """Every message pullable exactly once, in order, from its queue; every key found."""
    for topic, q in QUEUES:
        cq = d.queues.get(topic, q)
        assert cq is not None
        want = [phys for t, qq, phys, _k in records if (t, qq) == (topic, q)]
        got = []
        for qo in range(cq.min_offset(), cq.max_offset()):
            unit = cq.get(qo)
            assert unit is not None and not unit.is_pre_blank, (topic, q, qo, unit)
            got.append(unit.physical_offset)
        assert got == want, (topic, q)
    assert d.index is not None
    for topic, _q, phys, keys in records:
        for k in keys:
            found = d.index.query_offsets(topic, k, 64, 0, 1 << 62).phy_offsets
            assert found.count(phys) == 1, (topic, k, phys, found)


# (consume-queue file bytes, index entries a file): which roll the faults meet
GEOMETRY = {
    # 63 keys an index file, a record's 2-4 keys often straddle two; queue files never roll
    "index": (20 * 1000, 64),
    # queue files of 10 units roll; one index file holds every key
    "queue": (20 * 10, 4096),
}
# fallocates let through before each failure: the first four make the queues' first
# files, the first index file and the first batch's rolls (Python), then rolls
FAILS = [[12, 1, 3], [13], [14, 0, 2, 5]]


@pytest.mark.parametrize("fail", FAILS, ids=["12-1-3", "13", "14-0-2-5"])
@pytest.mark.parametrize("rounds", [1, 7, 64])
@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("roll", sorted(GEOMETRY))
def test_a_failed_roll_loses_nothing_and_leaves_the_bytes_of_no_fault(
    tmp_path: Path, roll: str, way: str, rounds: int, fail: list[int]
) -> None:
    geo = GEOMETRY[roll]
    log, records = _write_log(tmp_path / "log")
    try:
        ref, none, _c = _run(tmp_path / "ref", log, False, geo, rounds, [], way)
        _close(ref)
        assert none == 0
        want = _files(tmp_path / "ref")
        for plain_c in (True, False):
            store = tmp_path / ("c" if plain_c else "py")
            d, failures, c_rounds = _run(store, log, plain_c, geo, rounds, fail, way)
            try:
                # recover: recovery re-dispatches the rest of the log, with the next
                # fault set after it; else the last faults may come after the last roll
                # (recover-full: the dispatcher meets the rest after the deferral)
                assert 1 <= failures <= (1 if way == "recover" else len(fail)), failures
                _check_end_state(d, records)
                assert (c_rounds > 0) is plain_c, c_rounds  # the C round met the fault
            finally:
                _close(d)
            cq, index = _files(store)
            assert cq == want[0], plain_c
            assert len(index) == len(want[1]), plain_c
            for k, (a, b) in enumerate(zip(index, want[1], strict=True)):
                assert a == b, (plain_c, k)
    finally:
        log.close()


@pytest.mark.parametrize("made_next", [False, True], ids=["before-file", "after-file"])
@pytest.mark.parametrize("plain_c", [True, False], ids=["C", "Python"])
def test_a_dispatcher_killed_inside_an_index_roll_leaves_no_key_out(
    tmp_path: Path, plain_c: bool, made_next: bool
) -> None:
    """The state a dispatcher killed between a record's first keys and the index roll
    leaves, built from a run without faults (STYLE.md's example 10): the record's first
    keys at the full file's end, no next file, the queues through that record, the
    dispatched position at a round's start before it. Its successor
    (`DispatchService`: `resume_offset(published)`, then `drop_split_keys` from there)
    must put every key of that record, and end with the bytes of the run without the
    kill. `made_next`: killed after the roll made the next file, before a key went in."""
    geo = GEOMETRY["index"]
    log, records = _write_log(tmp_path / "log")
    try:
        ref, _n, _c = _run(tmp_path / "ref", log, plain_c, geo, 7, [], "wait")
        _close(ref)
        want = _files(tmp_path / "ref")
        store = tmp_path / "killed"
        shutil.copytree(tmp_path / "ref", store)
        index_dir = store / "index"
        names = sorted(p.name for p in index_dir.iterdir())
        clock = _Clock()
        clock.ms = T0 + 10_000_000  # later than every name made before the kill
        d = _open(store, log, plain_c, geo, clock)
        assert d.index is not None
        # the first file whose last record has keys in the next file too
        by_phys = {phys: (i, len(keys)) for i, (_t, _q, phys, keys) in enumerate(records)}
        split = next(
            k
            for k, f in enumerate(d.index.files[:-1])
            if sum(e[2] == f.end_phy_offset for e in f.entries()) < by_phys[f.end_phy_offset][1]
        )
        r = d.index.files[split].end_phy_offset
        i = by_phys[r][0]
        _close(d)
        for name in names[split + 1 :]:  # the roll never made the next file
            (index_dir / name).unlink()
        d = _open(store, log, plain_c, geo, clock)
        if made_next:  # or made it (empty, its header at the split record), then died
            assert d.index is not None
            d.index.file_for_keys()
            assert len(d.index.files) == split + 2
            _close(d)
            d = _open(store, log, plain_c, geo, clock)
        end_r = records[i + 1][2] if i + 1 < len(records) else log.max_offset()
        for cq in d.queues:  # the queues through the record (C: its unit went in first)
            cq.truncate_dirty(end_r)
        published = records[max(i - 3, 0)][2]  # the killed round began before it
        off = d.resume_offset(published)
        assert off <= r
        d.drop_split_keys(off)
        while off < log.max_offset():
            off = d.dispatch(off, log.max_offset(), max_records=7).next_offset
        try:
            _check_end_state(d, records)
        finally:
            _close(d)
        got = _files(store)
        assert got[0] == want[0]
        assert [b[:40] for b in got[1]] == [b[:40] for b in want[1]]  # headers first
        assert got[1] == want[1]
    finally:
        log.close()


# fallocates let through before a failed index roll that leaves a record's keys split
# over the full file's end, on both paths (each truncates the full file)
SPLIT_FAILS = [12, 14, 16, 18]


@pytest.mark.parametrize("fail", SPLIT_FAILS)
@pytest.mark.parametrize("plain_c", [True, False], ids=["C", "Python"])
def test_a_failed_index_roll_leaves_the_index_of_a_run_to_the_split_record(
    tmp_path: Path, plain_c: bool, fail: int
) -> None:
    """Right after a failed index roll, before anything is dispatched again: the index
    ends before the record whose keys straddled the full file, and its bytes are those
    of a run without the fault that dispatched the log up to that record -- the header's
    end time too, the last kept record's store time in ms (`IndexFile.truncate`; store
    times here are 7 ms apart, not on whole seconds). The queues hold no record past it
    (the C round's end exactly there; the Python path's cut-back may go back to the
    round's start: `Dispatcher._cut_back`)."""
    geo = GEOMETRY["index"]
    log, records = _write_log(tmp_path / "log")
    try:
        d = _open(tmp_path / "fault", log, plain_c, geo, _Clock())
        _fault(errno.ENOSPC, fail)
        off, end = d.resume_offset(), log.max_offset()
        with pytest.raises(fileio.StoreIOError):
            while off < end:
                off = d.dispatch(off, end, max_records=7).next_offset
        fileio.clear_faults()
        assert (d.plain_rounds > 0) is plain_c, d.plain_rounds  # the C round met it
        assert d.index is not None
        last = d.index.files[-1]
        assert not last.is_write_full(), "nothing was cut"
        kept = last.end_phy_offset
        split = next(phys for _t, _q, phys, _k in records if phys > kept)
        assert last.end_timestamp == log.store_time_of(kept)
        assert (last.end_timestamp - last.begin_timestamp) % 1000, "on a whole second"
        ends = {cq.key: cq.max_physical_offset for cq in d.queues}
        assert max(ends.values()) <= split, ends
        _close(d)
        ref = _open(tmp_path / "ref", log, plain_c, geo, _Clock())
        off = ref.resume_offset()
        while off < split:
            off = ref.dispatch(off, split, max_records=7).next_offset
        _close(ref)
        got, want = _files(tmp_path / "fault"), _files(tmp_path / "ref")
        assert [b[:40] for b in got[1]] == [b[:40] for b in want[1]]  # headers first
        assert got[1] == want[1]
        if plain_c:
            assert got[0] == want[0]
    finally:
        log.close()


@pytest.mark.parametrize("fail", [11, 20])
@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("plain_c", [True, False], ids=["C", "Python"])
def test_a_record_with_more_keys_than_an_index_file_loses_none_on_a_failed_roll(
    tmp_path: Path, plain_c: bool, way: str, fail: int
) -> None:
    """Index files of 3 keys, records of 2-5: a record's keys fill a whole file and go on
    into the next. A failed roll after such a file leaves it holding nothing but that
    record's keys: `drop_split_keys` removes it, and the record's keys in the file before
    (left, the emptied file's header would say the record is indexed, and its keys from
    there on would never be put)."""
    geo = (20 * 1000, 4)
    log, records = _write_log(tmp_path / "log")
    try:
        ref, _n, _c = _run(tmp_path / "ref", log, False, geo, 7, [], way)
        _close(ref)
        want = _files(tmp_path / "ref")
        d, failures, _c = _run(tmp_path / "f", log, plain_c, geo, 7, [fail], way)
        try:
            assert failures == 1
            _check_end_state(d, records)
        finally:
            _close(d)
        got = _files(tmp_path / "f")
        assert got[0] == want[0]
        assert got[1] == want[1]
    finally:
        log.close()
