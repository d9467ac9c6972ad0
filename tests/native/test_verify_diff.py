"""Recovery's consume-queue check in C (`engine.verify.verify_units`) against its
reference (`verify_units_py`): the same first bad queue offset and the same prev_end.

Hypothesis draws a log of small segments (some missing, some read short) holding one
queue's records, their units, then damages units and records with every kind of bad
unit the rules name: invalid, out of order, past the log's end, below the log's first
offset after a unit above it, pointing where no segment or no whole head is, and a head
whose size, magic, queue id, queue offset or physical offset disagrees; pre-blanks
anywhere. The units are checked in runs with prev_end carried, as recovery does.

`queue_last_ends` (C) against `queue_last_ends_py` over scans of generated logs whose
topics collide in length, bytes and queue id every way.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine.consumequeue_files import PRE_BLANK_SIZE, pack_unit
from mqstore.engine.record import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, Message
from mqstore.engine.scan import scan_records
from mqstore.engine.verify import (
    LogBounds,
    queue_last_ends,
    queue_last_ends_py,
    verify_units,
    verify_units_py,
)
from tests.engine.scanlog import encoded, lay_out

HEAD = struct.Struct(">iIiiiqq")
QID = 3
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**62), 2**62)
KINDS = [
    "pre_blank", "phy", "size", "swap", "past_end", "head_size", "head_magic", "head_v2",
    "head_qid", "head_qo", "head_phy", "zero",
]  # fmt: skip


@st.composite
def queues(draw: st.DrawFn) -> tuple[list[bytes], LogBounds, int]:
    """(units, the log, the first queue offset): one queue's records spread over small
    segments, then damaged."""
    seg_size = draw(st.sampled_from([64, 100, 256]))
    nseg = draw(st.integers(1, 5))
    base = seg_size * draw(st.integers(0, 3))
    log = bytearray(nseg * seg_size)
    first_qo = draw(st.integers(0, 2**40))
    units: list[bytes] = []
    heads: list[int] = []  # where unit i's record starts in `log`
    pos = 0
    while True:
        pos += draw(st.integers(0, 40))
        size = draw(st.integers(36, 90))
        if pos + size > len(log) or len(units) >= 12:
            break
        phy = base + pos
        HEAD.pack_into(log, pos, size, MESSAGE_MAGIC_CODE, 0, QID, 0, first_qo + len(units), phy)
        units.append(pack_unit(phy, size, 0))
        heads.append(pos)
        pos += size
    for _ in range(draw(st.integers(0, 3))):
        if units:
            _damage(draw, units, log, heads, draw(st.integers(0, len(units) - 1)))
    if draw(st.booleans()):
        units.insert(draw(st.integers(0, len(units))), pack_unit(0, PRE_BLANK_SIZE, 0))
    segments: list[bytes | None] = []
    for k in range(nseg):
        seg = bytes(log[k * seg_size : (k + 1) * seg_size])
        roll = draw(st.integers(0, 5))  # missing, read short, or whole
        segments.append(
            None if roll == 0 else seg[: draw(st.integers(0, seg_size))] if roll == 1 else seg
        )
    end = base + len(log)
    bounds = LogBounds(
        log_min=draw(st.one_of(st.just(0), st.integers(0, end))),
        log_end=draw(st.one_of(st.just(end), st.integers(0, end + 50))),
        headers_from=draw(st.one_of(st.just(0), st.integers(0, end + 50))),
        segments=segments,
        segments_base=draw(st.one_of(st.just(base), st.integers(0, 4).map(lambda k: k * seg_size))),
        segment_size=seg_size,
    )
    return units, bounds, first_qo


def _damage(draw: st.DrawFn, units: list[bytes], log: bytearray, heads: list[int], i: int) -> None:
    """One bad unit i (or the head of record i) of a drawn kind."""
    phy, size, tags = struct.unpack(">qiq", units[i])
    kind = draw(st.sampled_from(KINDS))
    if kind == "pre_blank":
        units[i] = pack_unit(0, PRE_BLANK_SIZE, 0)
    elif kind == "phy":
        units[i] = pack_unit(draw(st.one_of(I64, st.integers(-5, 1200))), size, tags)
    elif kind == "size":
        units[i] = pack_unit(phy, draw(st.one_of(I32, st.integers(-2, 100))), tags)
    elif kind == "swap" and i + 1 < len(units):
        units[i], units[i + 1] = units[i + 1], units[i]
    elif kind == "past_end":
        units[i] = pack_unit(2**62 + draw(st.integers(0, 2**62 - 1)), 2**31 - 2, tags)
    elif kind == "zero":
        units[i] = bytes(20)
    elif kind.startswith("head_"):
        field, fmt, value = {
            "head_size": (0, ">i", draw(I32)),
            "head_magic": (4, ">I", draw(st.integers(0, 2**32 - 1))),
            "head_v2": (4, ">I", MESSAGE_MAGIC_CODE_V2),
            "head_qid": (12, ">i", draw(I32)),
            "head_qo": (20, ">q", draw(I64)),
            "head_phy": (28, ">q", draw(I64)),
        }[kind]
        struct.pack_into(fmt, log, heads[i] + field, value)


def _check(
    units: list[bytes], bounds: LogBounds, first_qo: int, prev_end: int, runs: list[int]
) -> None:
    """Both twins over the units cut into runs at `runs`, prev_end carried."""
    cuts = sorted({min(c, len(units)) for c in runs} | {0, len(units)})
    c_end = py_end = prev_end
    for lo, hi in itertools.pairwise(cuts):
        run = b"".join(units[lo:hi])
        c_bad, c_end = verify_units(run, first_qo + lo, QID, c_end, bounds)
        py_bad, py_end = verify_units_py(run, first_qo + lo, QID, py_end, bounds)
        assert (c_bad, c_end) == (py_bad, py_end)
        if c_bad >= 0:
            return


@settings(max_examples=600, deadline=None)
@given(
    q=queues(),
    prev_end=st.one_of(st.just(-1), st.integers(-3, 300)),
    runs=st.lists(st.integers(0, 14), max_size=3),
)
def test_c_finds_the_first_bad_unit_as_the_reference(
    q: tuple[list[bytes], LogBounds, int], prev_end: int, runs: list[int]
) -> None:
    units, bounds, first_qo = q
    _check(units, bounds, first_qo, prev_end, runs)


@given(
    units=st.lists(st.binary(min_size=20, max_size=20), max_size=8),
    seg=st.binary(max_size=200),
    log_min=st.integers(0, 300),
    log_end=st.integers(0, 300),
    headers_from=st.integers(-5, 300),
    prev_end=st.integers(-(2**63), 2**63 - 1),
    first_qo=I64,
)
def test_any_unit_bytes_check_alike(
    units: list[bytes], seg: bytes, log_min: int, log_end: int, headers_from: int, prev_end: int,
    first_qo: int,
) -> None:  # fmt: skip
    bounds = LogBounds(log_min, log_end, headers_from, [seg, None, seg], 0, 100)
    _check(units, bounds, first_qo, prev_end, [])


def test_a_whole_queue_passes_and_moves_prev_end() -> None:
    log = bytearray(200)
    HEAD.pack_into(log, 0, 50, MESSAGE_MAGIC_CODE, 0, QID, 0, 7, 0)
    HEAD.pack_into(log, 60, 40, MESSAGE_MAGIC_CODE_V2, 0, QID, 0, 9, 60)
    # the pre-blank holds queue offset 8: the record at 60 has queue offset 9
    units = pack_unit(0, 50, 0) + pack_unit(0, PRE_BLANK_SIZE, 0) + pack_unit(60, 40, 0)
    bounds = LogBounds(0, 200, 0, [bytes(log)], 0, 200)
    assert verify_units(units, 7, QID, -1, bounds) == (-1, 100)
    assert verify_units(units, 7, QID + 1, -1, bounds) == (7, -1)
    assert verify_units(units, 6, QID, -1, bounds) == (6, -1)
    assert verify_units(units, 7, QID, -1, LogBounds(0, 99, 0, [bytes(log)], 0, 200)) == (9, 50)


@pytest.mark.parametrize("twin", [verify_units, verify_units_py])
def test_bad_arguments_raise(twin: Callable[..., tuple[int, int]]) -> None:
    good = LogBounds(0, 10, 0, [], 0, 100)
    with pytest.raises(ValueError, match="20-byte"):
        twin(bytes(21), 0, QID, -1, good)
    with pytest.raises(ValueError, match="segment_size"):
        twin(bytes(20), 0, QID, -1, LogBounds(0, 10, 0, [], 0, 0))
    with pytest.raises(ValueError, match="log_end"):
        twin(bytes(20), 0, QID, -1, LogBounds(0, -1, 0, [], 0, 100))


_topics = st.sampled_from(["T", "U", "TT", "TU", "UT", "%RETRY%g", "%RETRY%h", "é", "T" * 127])


@settings(max_examples=200, deadline=None)
@given(
    queues=st.lists(st.tuples(_topics, st.integers(0, 3)), max_size=40),
    pad=st.binary(max_size=9),
    start=st.integers(-2, 45),
)
def test_c_finds_each_queues_last_record_as_the_reference(
    queues: list[tuple[str, int]], pad: bytes, start: int
) -> None:
    buf = pad + lay_out([encoded(Message(t, b"b", {}, queue_id=q)) for t, q in queues])
    scan = scan_records(buf, len(pad), -1, check_crc=False)
    assert scan.count == len(queues)
    c = queue_last_ends(buf, scan, start)
    assert c == queue_last_ends_py(buf, scan, start)
    assert list(c) == list(queue_last_ends_py(buf, scan, start))  # first-seen order too
    assert len(c) == len(set(queues[max(start, 0) :]))


def test_columns_that_disagree_with_buf_raise() -> None:
    buf = lay_out([encoded(Message("T", b"b", {}))])
    s = scan_records(buf, 0, -1)
    cols = (s.pos, s.size, s.queue_id, s.topic_pos, s.topic_len)
    with pytest.raises(ValueError, match="topic is not inside buf"):
        _native.queue_last_ends(buf[:10], 0, *cols)
    with pytest.raises(ValueError, match="size holds"):
        _native.queue_last_ends(buf, 0, s.pos, b"", *cols[2:])
    with pytest.raises(TypeError, match="topic_len"):
        _native.queue_last_ends(buf, 0, *cols[:4], None)
