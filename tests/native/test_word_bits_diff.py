"""The atomic bit changes of a shared int64 word in C (`_native.fetch_or`,
`fetch_and_not`: `ipc/native/mqs_control_py.c`) against their Python twins
(`tests/native/bits_reference.py`) on the same bytes: the word returned and every byte
of the buffer after, for any word, any bits (the sign bit too) at any aligned offset.
Their atomicity across processes is `tests/runtime/test_flags_atomic.py`'s."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.ipc import control as c
from tests.native.bits_reference import fetch_and_not_reference, fetch_or_reference

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
int64s = st.one_of(
    st.integers(I64_MIN, I64_MAX),
    st.sampled_from([0, -1, I64_MIN, I64_MAX, *c.FLAG_NAMES]),
)
PAIRS: list[tuple[Callable[[bytearray, int, int], int], Callable[[bytearray, int, int], int]]] = [
    (_native.fetch_or, fetch_or_reference),
    (_native.fetch_and_not, fetch_and_not_reference),
]


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(min_size=8, max_size=96).map(lambda b: b[: len(b) // 8 * 8]),
    word=st.integers(0, 11),
    bits=st.lists(int64s, min_size=1, max_size=4),
    which=st.lists(st.sampled_from([0, 1]), min_size=4, max_size=4),
)
def test_bit_changes_match_their_twins(
    data: bytes, word: int, bits: list[int], which: list[int]
) -> None:
    """A sequence of changes of one word: each returns what the twin returns, and the
    buffers stay equal byte for byte (nothing outside the word is touched)."""
    buf = bytearray(data)
    twin = bytearray(data)
    offset = 8 * (word % (len(buf) // 8))
    for b, k in zip(bits, which, strict=False):
        native, reference = PAIRS[k]
        assert native(buf, offset, b) == reference(twin, offset, b)
        assert buf == twin


def test_the_control_blocks_shared_memory_takes_them(cb: c.ControlBlock) -> None:
    """The block's own mapping, as `Flags` passes it (the fixture's block is RUNNING)."""
    assert _native.fetch_or(cb.buf, c.OFF_FLAGS, c.FLAG_READ_ONLY) == c.FLAG_RUNNING
    was = _native.fetch_and_not(cb.buf, c.OFF_FLAGS, c.FLAG_RUNNING)
    assert was == c.FLAG_RUNNING | c.FLAG_READ_ONLY
    assert cb.get(c.OFF_FLAGS) == c.FLAG_READ_ONLY


def _misaligned() -> memoryview:
    return memoryview(bytearray(17))[1:]


@pytest.mark.parametrize("fn", [_native.fetch_or, _native.fetch_and_not])
@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((bytearray(16), 0), TypeError, "takes 3 arguments"),
        ((bytes(16), 0, 1), TypeError, "buf must be a writable bytes-like object"),
        ((bytearray(16), "0", 1), TypeError, "offset must be int"),
        ((bytearray(16), 0, 1.0), TypeError, "bits must be int"),
        ((bytearray(16), 0, 1 << 63), ValueError, "bits is out of the signed 64-bit range"),
        ((bytearray(16), 4, 1), ValueError, "not 8-byte aligned"),
        ((_misaligned(), 0, 1), ValueError, "not 8-byte aligned"),
        ((bytearray(16), 16, 1), ValueError, "not inside buf"),
        ((bytearray(16), -8, 1), ValueError, "not inside buf"),
        ((bytearray(4), 0, 1), ValueError, "not inside buf"),
    ],
)
def test_bad_arguments_are_typed_errors(
    fn: Callable[..., int], args: tuple[object, ...], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        fn(*args)
