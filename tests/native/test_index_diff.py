"""The C index put (`mqstore._native.index_put`) against its Python twin
(`engine.indexfile.put_hashes`), byte for byte.

Hypothesis draws a small index geometry (so that slots collide and files fill), a file
that already holds entries or a corrupt-looking header, and batches of records with 0 to
3 key hashes each, their positions and store times; both twins put the same batches,
resuming after a full file as the dispatcher does, into two copies of the file. The
files, the returned key positions and any ValueError must be the same.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import indexfile
from mqstore.engine.indexfile import index_file_size

Put = Callable[..., int]

_records = st.lists(
    st.tuples(
        st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2**31 - 1)), max_size=3),
        st.integers(0, 5000),  # gap to the previous record's position
        st.integers(-3000, 2**41),  # store time
    ),
    max_size=40,
)


def _columns(recs: list[tuple[list[int], int, int]]) -> tuple[array[int], ...]:
    key_first, key_hash, pos, ts = array("i", [0]), array("i"), array("q"), array("q")
    at = 0
    for hashes, gap, t in recs:
        at += gap
        key_hash.extend(hashes)
        key_first.append(len(key_hash))
        pos.append(at)
        ts.append(t)
    return key_first, key_hash, pos, ts


def _run(put: Put, file: bytearray, geo: tuple[int, int], cols: Any, base: int) -> Any:
    """Put every key, starting again after a full file as the dispatcher rolls (here:
    the header's count is reset, standing for a fresh file). The keys put per call, or
    the ValueError's text."""
    kf, kh, pos, ts = cols
    out: list[object] = []
    k, n = 0, len(pos)
    try:
        while k < kf[n]:
            was = k
            k = put(file, *geo, memoryview(kf), memoryview(kh), memoryview(pos),
                    memoryview(ts), base, 0, n, k)  # fmt: skip
            out.append(k)
            if k == was:  # a full file that a fresh count cannot help: one entry
                break
            if k < kf[n]:
                struct.pack_into(">i", file, 36, 1)
    except ValueError as e:
        out.append(str(e))
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 60),
    _records,
    st.integers(0, 2**40),
    st.tuples(st.integers(-(2**40), 2**40), st.integers(-5, 70), st.integers(0, 2**31 - 1)),
    st.binary(max_size=64),
)
def test_c_and_python_write_the_same_index_file(
    slots: int,
    entries: int,
    recs: list[tuple[list[int], int, int]],
    base: int,
    header: tuple[int, int, int],
    junk: bytes,
) -> None:
    size = index_file_size(slots, entries)
    file = bytearray(size)
    file[40 : 40 + len(junk)] = junk[: size - 40]  # slots pointing anywhere
    begin_ts, count, slot_count = header
    struct.pack_into(">q", file, 0, begin_ts)
    struct.pack_into(">ii", file, 32, slot_count, count)
    cols = _columns(recs)
    c_file, py_file = bytearray(file), bytearray(file)
    got_c = _run(_native.index_put, c_file, (slots, entries), cols, base)
    got_py = _run(indexfile.put_hashes, py_file, (slots, entries), cols, base)
    assert got_c == got_py
    assert c_file == py_file


def test_bad_columns_are_refused_by_both() -> None:
    geo = (4, 8)
    kf, kh, pos, ts = array("i", [0, 2]), array("i", [1, -5]), array("q", [0]), array("q", [1])
    cases: list[tuple[Any, ...]] = [
        (kf, kh, pos, ts, 0, 0, 1, 0),  # a negative hash
        (array("i", [0, 3]), kh, pos, ts, 0, 0, 1, 0),  # key_hash too short
        (array("i", [2, 0]), kh, pos, ts, 0, 0, 1, 0),  # key_first falls
        (kf, kh, array("q", [-1]), ts, 0, 0, 1, 0),  # a negative position
        (kf, kh, pos, ts, 0, 0, 1, 5),  # key_from outside
        (kf, kh, array("i", [0]), ts, 0, 0, 1, 0),  # pos of 4-byte items
        (kf, kh, pos, ts, -1, 0, 1, 0),  # a negative base
    ]
    for case in cases:
        errors = []
        for put in (_native.index_put, indexfile.put_hashes):
            file = bytearray(index_file_size(*geo))
            try:
                put(file, *geo, *case)
            except ValueError as e:
                errors.append((str(e), bytes(file)))
        assert len(errors) == 2 and errors[0] == errors[1], case
