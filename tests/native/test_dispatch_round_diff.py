"""The dispatcher's plain round in C (`mqstore._native.plain_round`, driven by
`engine.dispatch.Dispatcher` with `plain_c=True`) against the Python path it takes
batches from (`plain_c=False`: scan, `dispatch_scan`), store against store, byte for byte.

Hypothesis draws record streams -- topics that repeat, a topic outside the name rule and
a deleted one, queue ids 0-3 and -1, KEYS as one token or several (empty tokens too),
tags or none, UNIQ_KEY or none, other properties, PREPARED / ROLLBACK / COMMIT parts and
fillers -- written into 4 KiB segments (BLANKs), dispatched in rounds of drawn sizes and
limits (some inside a record) into consume-queue files of 10 units (rolls) and index
files of 64 entries (full files). Both dispatchers must return equal results round by
round (positions, counters, statuses, refusals), keep the same checkpoint time, lag
histogram and touched queues, and leave identical consume-queue and index files. A
second Hypothesis test draws what a running store writes (messages and fillers of good
topics) and asserts that the C round took every batch but those with a new queue (and
re-dispatched fillers): its rolls of queue and index files, the first index file, the
fillers; the cases pin rolls at every round size and a restarted dispatcher.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mqstore.engine.checkpoint import CheckpointFields
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue import ConsumeQueue
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher, DispatchResult
from mqstore.engine.filler import filler_record
from mqstore.engine.indexservice import IndexService
from mqstore.engine.record import Message, SysFlag, encode

SEGMENT = 4096
CQ_FILE = 200  # 10 units a file
SLOTS, ENTRIES = 16, 64
T0 = 1_700_000_000_000

_KIND = st.sampled_from(["plain"] * 60 + ["prepared", "rollback", "commit", "filler"])
_KEYS = st.one_of(
    st.none(),
    st.text(alphabet="ab", min_size=1, max_size=4),
    st.lists(st.text(alphabet="abc", max_size=3), min_size=1, max_size=4)
    .map(" ".join)
    .map(lambda k: k or " "),  # tokens, empty ones too (split on " ", empties skipped)
)
_record = st.tuples(
    st.sampled_from(["T"] * 8 + ["U"] * 3 + ["V", "a b", "Del"]),
    st.sampled_from([0, 1, 2, 3] * 8 + [-1]),
    _KEYS,
    st.one_of(st.none(), st.sampled_from(["x", "y", "z"])),
    st.booleans(),  # UNIQ_KEY
    st.dictionaries(
        st.sampled_from(["a", "b"]), st.text(alphabet="xyz", min_size=1, max_size=3), max_size=2
    ),
    st.integers(0, 400),  # body bytes
    _KIND,
)


class _Clock:
    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> int:
        self.ms += 7
        return self.ms


def _append(log: CommitLog, i: int, rec: tuple[object, ...]) -> None:
    topic, q, keys, tags, uniq, extra, body, kind = rec
    assert isinstance(topic, str) and isinstance(q, int) and isinstance(body, int)
    if kind == "filler":
        if q >= 0:
            assert log.append_encoded(filler_record(300, topic, q), topic, q).ok
        return
    props: dict[str, str] = dict(extra)  # type: ignore[call-overload]
    if keys is not None:
        props["KEYS"] = str(keys)
    if tags is not None:
        props["TAGS"] = str(tags)
    if uniq:
        props["UNIQ_KEY"] = f"U{i:06d}"
    flag = {"plain": 0, "prepared": SysFlag.TRANSACTION_PREPARED,
            "rollback": SysFlag.TRANSACTION_ROLLBACK, "commit": SysFlag.TRANSACTION_COMMIT}[
        str(kind)]  # fmt: skip
    msg = Message(topic, b"b" * body, props, queue_id=max(q, 0), sys_flag=int(flag),
                  born_timestamp=T0, born_host="10.0.0.1:5000",
                  store_host="10.0.0.2:10911")  # fmt: skip
    if q >= 0:
        got = log.append(msg)
    else:  # the client refuses a negative queue id; another writer may have stored one
        rec = encode(msg)
        data = bytearray(rec.data)
        struct.pack_into(">i", data, 12, q)  # QUEUEID
        got = log.append_encoded(rec._replace(data=bytes(data)), topic, q)
    assert got.ok, got


def _open(store: Path, log: CommitLog, plain_c: bool) -> tuple[Dispatcher, CheckpointFields]:
    cp = CheckpointFields()
    cqs = ConsumeQueueStore(store, CQ_FILE).load()
    idx = IndexService(store, SLOTS, ENTRIES, clock_ms=_Clock())
    idx.load()
    d = Dispatcher(log, cqs, idx, checkpoint=cp, plain_c=plain_c)
    d.lag_hist = [0] * 64  # every lag in a bucket of its own bit length
    return d, cp


def _same(a: DispatchResult, b: DispatchResult) -> None:
    a.seconds = b.seconds = 0.0
    assert a == b


def _files(store: Path) -> dict[str, bytes]:
    out = {}
    for sub in ("consumequeue", "index"):
        for root, _dirs, names in os.walk(store / sub):
            for n in names:
                p = Path(root, n)
                out[str(p.relative_to(store))] = p.read_bytes()
    return out


def _cut_back(a: Dispatcher, b: Dispatcher, units: int) -> int:
    """Cut queue T/0's last `units` units in both stores, as recovery cuts a queue it
    finds bad, and return where to dispatch again from (its first unit cut): the index
    holds those records already, the queue takes them again."""
    start = None
    for d in (a, b):
        cq = d.queues.get("T", 0)
        if cq is None or cq.max_offset() <= cq.min_offset():  # nothing readable to cut
            return a.resume_offset()
        qo = max(cq.max_offset() - units, cq.min_offset())
        unit = cq.get(qo)
        assert unit is not None
        if unit.is_pre_blank:
            return a.resume_offset()
        start = unit.physical_offset
        cq.cut_at(qo)
    assert start is not None
    return start


def _run(
    tmp: Path,
    records: list[tuple[object, ...]],
    split: int,
    rounds: list[int],
    cuts: list[int],
    deleted_at: int,
    redo: int = 0,
    python: list[int] | None = None,
) -> int:
    """Dispatch `records` (the first `split` before the rest are written) with both
    dispatchers, after the first part cutting back `redo` units of queue T/0 and
    dispatching again from there; returns the calls of the C round that wrote. `python`,
    when given, gets the C dispatcher's Python batches and the rolls its C round asked
    for (queue files, index files)."""
    log = CommitLog.open(tmp / "log", SEGMENT, clock_ms=_Clock())
    a, cp_a = _open(tmp / "a", log, True)
    rolls = {"queue": 0, "index": 0}
    roll = a._roll

    def counted(more: object, *at: object) -> bool:
        rolls["queue" if isinstance(more, ConsumeQueue) else "index"] += 1
        return roll(more, *at)  # type: ignore[arg-type]

    a._roll = counted  # type: ignore[method-assign]
    b, cp_b = _open(tmp / "b", log, False)
    ends = [0]
    taken = 0
    try:
        for first, part in ((True, records[:split]), (False, records[split:])):
            for rec in part:
                _append(log, len(ends), rec)
                ends.append(log.max_offset())
            if first and deleted_at < len(ends):
                a.forget_topic("Del", ends[deleted_at])
                b.forget_topic("Del", ends[deleted_at])
            off, n = a.resume_offset(), 0
            assert off == b.resume_offset()
            while off < log.max_offset() and n < 400:
                cut = cuts[n % len(cuts)]
                limit = log.max_offset() - (cut if cut < log.max_offset() - off else 0)
                m = rounds[n % len(rounds)]
                before = a.plain_rounds
                ra = a.dispatch(off, limit, max_records=m)
                rb = b.dispatch(off, limit, max_records=m)
                taken += a.plain_rounds - before
                _same(ra, rb)
                if ra.next_offset == off:
                    if limit == log.max_offset():
                        break
                    cuts = [0]
                off, n = ra.next_offset, n + 1
            if first and redo:
                off = _cut_back(a, b, redo)
                while off < log.max_offset():
                    ra, rb = (
                        a.dispatch(off, log.max_offset(), max_records=1),
                        b.dispatch(off, log.max_offset(), max_records=1),
                    )
                    _same(ra, rb)
                    assert ra.next_offset > off
                    off = ra.next_offset
            assert cp_a.logics_msg_timestamp == cp_b.logics_msg_timestamp
            assert a.lag_hist == b.lag_hist
            assert {cq.key for cq in a.touched} == {cq.key for cq in b.touched}
            assert a.resume_offset() == b.resume_offset()
        if python is not None:
            python[:] = [a.python_batches, rolls["queue"], rolls["index"]]
    finally:
        for d in (a, b):
            d.queues.close()
            assert d.index is not None
            d.index.close()
        log.close()
    got_a, got_b = _files(tmp / "a"), _files(tmp / "b")
    assert got_a.keys() == got_b.keys()
    for name, data in got_a.items():
        assert data == got_b[name], name
    return taken


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(_record, min_size=8, max_size=120),
    split=st.integers(0, 120),
    rounds=st.lists(st.integers(1, 50), min_size=1, max_size=5),
    cuts=st.lists(st.sampled_from([0, 0, 0, 1, 50]), min_size=1, max_size=4),
    deleted_at=st.integers(0, 200),
    redo=st.sampled_from([0, 0, 1, 3, 12]),
)
def test_the_c_round_writes_what_the_python_path_writes(
    records: list[tuple[object, ...]], split: int, rounds: list[int], cuts: list[int],
    deleted_at: int, redo: int,
) -> None:  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="mqs-round-diff-"))
    try:
        taken = _run(tmp, records, split, rounds, cuts, deleted_at, redo)
        event("the C round took a batch" if taken else "every batch went through Python")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_plain_streams_go_through_c(tmp_path: Path) -> None:
    """The common case is C's: README-shape messages (keys, tags, UNIQ_KEY) over a few
    queues take the C round for every batch but the first of each queue file and index
    file; the stores still match."""
    recs: list[tuple[object, ...]] = [
        ("T", i % 3, f"k{i}", "t", True, {}, 100, "plain") for i in range(200)
    ]
    python: list[int] = []
    taken = _run(tmp_path, recs, 200, [5], [0], 10**6, python=python)
    assert taken >= 40, taken
    # only the first batch (three new queues, no index file yet) is Python's; every
    # queue-file roll (20 of them) and index-file roll (6) is taken by the C round
    assert python == [1, 18, 6], python


@pytest.mark.parametrize("size", [1, 3, 4, 7, 9, 11, 23])
def test_rounds_that_meet_a_queue_file_end(tmp_path: Path, size: int) -> None:
    """One queue, consume-queue files of 10 units: rounds of every size end at, just
    before and past a file's end (the C round must decline what does not fit)."""
    recs: list[tuple[object, ...]] = [
        ("T", 0, f"k{i} j", "t", True, {}, 60, "plain") for i in range(70)
    ]
    python: list[int] = []
    assert _run(tmp_path, recs, 70, [size], [0], 10**6, python=python) > 0
    # the first batch only (a roll inside it is Python's); every later roll is C's
    assert python[0] == 1 and python[1] >= 70 // 10 - 1 - size // 10, python


@pytest.mark.parametrize("redo", [1, 2, 5])
def test_a_queue_cut_back_is_dispatched_again_without_indexing_twice(
    tmp_path: Path, redo: int
) -> None:
    """Recovery cuts a bad queue and dispatches again: the queue takes its units again,
    the index (which holds them) must not take their keys twice."""
    recs: list[tuple[object, ...]] = [
        ("T", 0, f"k{i}", "t", True, {}, 60, "plain") for i in range(36)
    ]
    assert _run(tmp_path, recs, 36, [4], [0], 10**6, redo) > 0


_plain_record = st.tuples(
    st.sampled_from(["T"] * 4 + ["U"]),
    st.sampled_from([0, 0, 1]),
    _KEYS,
    st.one_of(st.none(), st.sampled_from(["x", "y"])),
    st.just(True),  # UNIQ_KEY: what the client gives every message
    st.just({}),
    st.integers(0, 400),
    st.sampled_from(["plain"] * 12 + ["filler"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(_plain_record, min_size=30, max_size=200),
    split=st.integers(0, 200),
    rounds=st.lists(st.integers(1, 50), min_size=1, max_size=5),
    cuts=st.lists(st.sampled_from([0, 0, 1, 50]), min_size=1, max_size=3),
)
def test_a_running_store_s_rolls_are_the_c_round_s(
    records: list[tuple[object, ...]], split: int, rounds: list[int], cuts: list[int]
) -> None:
    """Messages and fillers of good topics (a running store's steady state): the Python
    path takes only batches with a queue it has not seen (the first batch among them),
    so at most one batch per queue, and re-dispatched fillers; every queue-file and
    index-file roll, the first index file and every filler after them are the C round's,
    and the stores match."""
    tmp = Path(tempfile.mkdtemp(prefix="mqs-round-diff-"))
    try:
        python: list[int] = []
        _run(tmp, records, split, rounds, cuts, 10**6, python=python)
        queues = {(r[0], r[1]) for r in records}
        # and, after the split, the fillers that `resume_offset` (the queues' end of
        # messages) dispatches again: a re-dispatch, which is the Python path's
        again = sum(r[7] == "filler" for r in records[:split])
        assert python[0] <= len(queues) + again, (python, len(queues), again)
        event(f"C rolled queue files: {python[1] > 0}, index files: {python[2] > 0}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("size", [1, 4, 9, 30])
def test_fillers_go_through_c(tmp_path: Path, size: int) -> None:
    """Fillers (a killed producer's reservations) between messages, one a queue's last
    unit of a file, some in a row: pre-blank units written by the C round, the queue's
    commit-log end and the checkpoint time those of its messages; only batches with a
    queue not seen before are Python's."""
    recs: list[tuple[object, ...]] = [
        (
            "T",
            i % 2,
            f"k{i}",
            "t",
            True,
            {},
            60,
            "filler" if i % 7 in (3, 4) or i % 19 == 0 else "plain",
        )
        for i in range(90)
    ]
    python: list[int] = []
    assert _run(tmp_path, recs, 90, [size], [0], 10**6, python=python) > 0
    assert python[0] <= 2, python  # a batch with a queue not seen before: two queues


def test_a_restarted_dispatcher_takes_the_queues_it_finds_in_c(tmp_path: Path) -> None:
    """A dispatcher opened over queues and index files an earlier one wrote (a restart)
    dispatches the rest through the C round from its first batch: the queues it finds
    get their cursors without a Python batch; the stores still match."""
    log = CommitLog.open(tmp_path / "log", SEGMENT, clock_ms=_Clock())
    recs: list[tuple[object, ...]] = [
        ("T", i % 2, f"k{i}", "t", True, {}, 60, "plain") for i in range(80)
    ]
    for i, rec in enumerate(recs[:30]):
        _append(log, i, rec)
    try:
        for stage in (0, 1):
            a, cp_a = _open(tmp_path / "a", log, True)
            b, cp_b = _open(tmp_path / "b", log, False)
            for d in (a, b):
                d.queues.recover()
            off = a.resume_offset()
            assert off == b.resume_offset()
            while off < log.max_offset():
                ra = a.dispatch(off, log.max_offset(), max_records=7)
                rb = b.dispatch(off, log.max_offset(), max_records=7)
                _same(ra, rb)
                off = ra.next_offset
            assert cp_a.logics_msg_timestamp == cp_b.logics_msg_timestamp
            assert a.python_batches == (1 if stage == 0 else 0), a.python_batches
            for d in (a, b):
                d.queues.close()
                assert d.index is not None
                d.index.close()
            for i, rec in enumerate(recs[30:] if stage == 0 else [], 30):
                _append(log, i, rec)
    finally:
        log.close()
    got_a, got_b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert got_a == got_b
