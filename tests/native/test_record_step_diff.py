"""The committer's step end (`mqstore._native.record_step`) against its Python twin
(`engine.scan.record_step_py`), answer for answer.

Hypothesis draws a run of records by TOTALSIZE (whole ones, and sizes that are zero,
negative, too short for their own field or past the buffer's end), then garbage, and any
start, limit and wanted position, in range or not; both twins must give the same
boundary or the same ValueError.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine.scan import record_step_py

_size = st.one_of(
    st.integers(4, 300),  # a whole record
    st.integers(-(2**31), 3),  # not positive, or shorter than its own TOTALSIZE field
    st.integers(2**31 - 8, 2**31 - 1),  # far past any buffer
)


@st.composite
def _log(draw: st.DrawFn) -> bytes:
    out = bytearray()
    for size in draw(st.lists(_size, max_size=20)):
        out += struct.pack(">i", size)
        out += bytes(min(max(size - 4, 0), 300))
    return bytes(out + draw(st.binary(max_size=12)))


def _answer(fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except ValueError as e:
        return ("ValueError", str(e))


@settings(max_examples=400, deadline=None)
@given(log=_log(), pos=st.integers(-4, 64), cut=st.integers(-8, 8), want=st.integers(-8, 9000))
def test_record_step_matches_its_python_twin(log: bytes, pos: int, cut: int, want: int) -> None:
    limit = len(log) + cut if cut < 0 else len(log) - cut
    for p in (pos, 0):
        assert _answer(_native.record_step, log, p, limit, want) == _answer(
            record_step_py, log, p, limit, want
        )


def test_record_step_follows_sizes_to_the_first_boundary_at_or_past_want() -> None:
    log = b"".join(struct.pack(">i", n) + bytes(n - 4) for n in (10, 20, 30)) + bytes(8)
    for fn in (_native.record_step, record_step_py):
        assert fn(log, 0, 60, 1) == 10
        assert fn(log, 0, 60, 10) == 10
        assert fn(log, 0, 60, 11) == 30
        assert fn(log, 10, 60, 59) == 60
        assert fn(log, 0, 60, 10**6) == 60  # the limit: no size past it is read
        assert fn(log, 0, 59, 10**6) == 30  # the third record runs past the limit
        assert fn(log, 60, 68, 10**6) == 60  # zeros: no record
        assert fn(log, 0, 60, 0) == 0
        with pytest.raises(ValueError):
            fn(log, 0, len(log) + 1, 5)
        with pytest.raises(ValueError):
            fn(log, 5, 4, 5)
