"""Recovery's walks in C against their Python references, answer for answer:

* `valid_units` (`mqstore._native.valid_units`) against `valid_units_py`: the leading
  valid consume-queue units and the last of them that is not a pre-blank. Hypothesis
  draws runs of real units, pre-blanks, zero units and units invalid every way (negative
  offset, size 0 or negative, a pre-blank-sized unit at a negative offset), with the
  boundary values of both fields, then maybe cuts the buffer to a partial unit: both
  must give the same pair or the same ValueError.
* `zero_tail` (`mqstore._native.zero_tail`) against `zero_tail_py`: where the trailing
  zero bytes begin, over buffers of zeros with non-zero bytes at drawn places (so that
  every alignment of the last one, and of the start and end, is reached), from any
  start, inside or outside the buffer.

Both C twins also run on a mapped consume-queue file's read-only view, as recovery
calls them (tests/engine/test_consumequeue.py covers recovery's answers).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine.consumequeue_files import PRE_BLANK_SIZE, valid_units_py, zero_tail_py

_UNIT = struct.Struct(">qiq")
I32 = st.one_of(
    st.sampled_from([-(2**31), -1, 0, 1, 2**31 - 2, PRE_BLANK_SIZE]),
    st.integers(-(2**31), 2**31 - 1),
)
I64 = st.one_of(st.sampled_from([-(2**63), -1, 0, 1, 2**63 - 1]), st.integers(-(2**63), 2**63 - 1))
_unit = st.one_of(
    st.tuples(st.integers(0, 2**40), st.integers(1, 5000), I64),  # a real unit
    st.just((0, PRE_BLANK_SIZE, 0)),  # a pre-blank
    st.just((0, 0, 0)),  # the end of the written units
    st.tuples(I64, I32, I64),  # anything
)


def _both_units(buf: bytes | memoryview) -> list[object]:
    out: list[object] = []
    for f in (_native.valid_units, valid_units_py):
        try:
            out.append(f(buf))
        except ValueError as e:
            out.append(("ValueError", str(e)))
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(_unit, max_size=40), st.integers(0, 19))
def test_valid_units_c_and_python_alike(units: list[tuple[int, int, int]], cut: int) -> None:
    buf = b"".join(_UNIT.pack(*u) for u in units)
    got_c, got_py = _both_units(buf)
    assert got_c == got_py
    if cut and buf:  # a partial unit: the same ValueError
        got_c, got_py = _both_units(buf[:-cut])
        assert got_c == got_py
        assert isinstance(got_c, tuple) and got_c[0] == "ValueError"


def test_valid_units_answers() -> None:
    """Known answers: the walk stops at the first invalid unit, pre-blanks count as
    valid but are never the last real one."""
    pre = (0, PRE_BLANK_SIZE, 0)
    cases: list[tuple[list[tuple[int, int, int]], tuple[int, int]]] = [
        ([], (0, -1)),
        ([pre, pre], (2, -1)),
        ([(10, 5, 0), pre, (0, 0, 0), (30, 5, 0)], (2, 0)),
        ([(10, 5, 0), (-1, 5, 0), (30, 5, 0)], (1, 0)),
        ([(10, 5, 0), (20, -3, 0)], (1, 0)),
        ([(10, 5, 0), (20, 5, 0), pre], (3, 1)),
    ]
    for units, want in cases:
        buf = b"".join(_UNIT.pack(*u) for u in units)
        assert _native.valid_units(buf) == valid_units_py(buf) == want


_edit = st.tuples(st.integers(0, 300), st.integers(1, 255))  # (position, byte)


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 300),
    st.lists(_edit, max_size=4),
    st.integers(-3, 310),
    st.integers(0, 7),
)
def test_zero_tail_c_and_python_alike(
    size: int, edits: list[tuple[int, int]], start: int, offset: int
) -> None:
    raw = bytearray(offset + size)
    for at, byte in edits:
        if at < size:
            raw[offset + at] = byte
    view = memoryview(bytes(raw))[offset:]  # every alignment of the buffer's start
    out: list[object] = []
    for f in (_native.zero_tail, zero_tail_py):
        try:
            out.append(f(view, start))
        except ValueError as e:
            out.append(("ValueError", str(e)))
    assert out[0] == out[1]
    if 0 <= start <= size:
        last = max((at + 1 for at, _b in edits if start <= at < size), default=start)
        assert out[0] == last


def test_on_a_mapped_file(tmp_path: Path) -> None:
    """Recovery passes read-only views of a shared mapping: both twins take them."""
    units = [(i * 100, 100, 7) for i in range(1000)] + [(0, PRE_BLANK_SIZE, 0)]
    body = b"".join(_UNIT.pack(*u) for u in units)
    path = tmp_path / "00000000000000000000"
    path.write_bytes(body + bytes(20 * 200) + b"\x01" + bytes(19))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm).toreadonly()
        try:
            assert _native.valid_units(view) == valid_units_py(view) == (1001, 999)
            end = len(view) - 19
            assert _native.zero_tail(view, len(body)) == zero_tail_py(view, len(body)) == end
            assert _native.zero_tail(view, end) == end
        finally:
            view.release()
