"""The C grouping of a scanned batch's consume-queue units (`mqstore._native.group_units`)
against its Python twin (`engine.consumequeue_files.group_units`), answer for answer.

Hypothesis draws a buffer of topic bytes and records that name spans of it (so that
equal topics come from different places, and different ones share a prefix), queue ids,
queue offsets that are dense or not, positions whose ends rise or not, any sizes and tags
codes; both twins must return the same groups, records and packed units, or the same
ValueError.
"""

from __future__ import annotations

from array import array
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import consumequeue_files
from mqstore.engine.consumequeue_files import pack_unit

_TOPICS = b"TopicATopicBTopicATopTopicA"
_record = st.tuples(
    st.sampled_from([(0, 6), (6, 6), (12, 6), (18, 3), (21, 6), (0, 0)]),  # topic spans
    st.integers(0, 3),  # queue id
    st.one_of(st.integers(0, 5), st.integers(-(2**63), 2**63 - 1)),  # queue offset step
    st.integers(0, 3000),  # position gap
    st.one_of(st.integers(1, 2000), st.integers(-(2**31), 2**31 - 1)),  # size
    st.integers(-(2**63), 2**63 - 1),  # tags code
)


def _columns(recs: list[Any]) -> list[array[int]]:
    cols = [array(t) for t in ("q", "i", "i", "q", "q", "i", "q")]
    qo, at = 0, 0
    for (tpos, tlen), q, step, gap, size, tags in recs:
        qo = step if abs(step) > 5 else min(qo + step, 2**63 - 1)
        at += gap
        for col, v in zip(cols, (tpos, tlen, q, qo, at, size, tags), strict=True):
            col.append(v)
    return cols


def _both(buf: bytes, cols: list[Any], base: int) -> list[object]:
    out: list[object] = []
    for f in (_native.group_units, consumequeue_files.group_units):
        try:
            out.append(f(buf, *cols, base))
        except ValueError as e:
            out.append(str(e))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, max_size=60), st.integers(0, 2**40))
def test_c_and_python_group_alike(recs: list[Any], base: int) -> None:
    cols = _columns(recs)
    got_c, got_py = _both(_TOPICS, cols, base)
    assert got_c == got_py
    if isinstance(got_py, list):  # the units are pack_unit's, in record order
        for _topic, _q, _first, _dense, records, units in got_py:
            idx = array("i", records)
            want = b"".join(pack_unit(base + cols[4][r], cols[5][r], cols[6][r]) for r in idx)
            assert units == want


def test_bad_columns_are_refused_by_both() -> None:
    good = _columns([((0, 6), 0, 1, 10, 100, 7)])
    cases = [
        (good, -1),  # a negative base
        ([array("q", [0]), *good[1:]], 2**63 - 2),  # the end overflows
        ([array("q", [30]), *good[1:]], 0),  # the topic runs past the buffer
        ([*good[:4], array("q", [-1]), *good[5:]], 0),  # a negative position
        ([*good[:5], array("q", [1]), good[6]], 0),  # sizes of 8 bytes
        ([*good[:3], array("q", [1, 2]), *good[4:]], 0),  # two queue offsets for one record
    ]
    for cols, base in cases:
        got_c, got_py = _both(_TOPICS, cols, base)
        assert isinstance(got_c, str) and got_c == got_py, (cols, base)
