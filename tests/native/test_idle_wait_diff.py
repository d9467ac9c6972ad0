"""The idle workers' futex steps in C (`_native.idle_sleep`, `idle_wake`,
`wait_flushed_past`: `ipc/native/mqs_futex.c`) against their Python twins
(`tests/native/idle_reference.py`) on the same control-block bytes, with waits that run
out at once (nobody wakes them here): the answer and every byte after. The publish's
wake is `test_put_message.py`'s publish test; wake-ups across threads are in
`tests/runtime/test_control.py`."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.ipc import control as c
from tests.native.idle_reference import (
    idle_sleep_reference,
    idle_wake_reference,
    wait_flushed_past_reference,
)

positions = st.integers(-1, 1 << 40)
words = st.sampled_from([0, 1, 2, 0xFFFFFFFE, 0xFFFFFFFF])


def _block(published: int, flushed: int, wake: int, sleeps: int) -> bytearray:
    buf = bytearray(c.SLOTS_OFF)
    struct.pack_into("<q", buf, c.OFF_PUBLISHED, published)
    struct.pack_into("<q", buf, c.OFF_FLUSHED, flushed)
    struct.pack_into("<II", buf, c.OFF_IDLE_WAKE, wake, sleeps)
    return buf


@settings(max_examples=200, deadline=None)
@given(published=positions, flushed=positions, pos=positions, wake=words, sleeps=words)
def test_idle_sleep_matches_its_twin(
    published: int, flushed: int, pos: int, wake: int, sleeps: int
) -> None:
    buf = _block(published, flushed, wake, sleeps)
    twin = bytearray(buf)
    assert _native.idle_sleep(buf, pos, 1) is idle_sleep_reference(twin, pos)
    assert buf == twin


@settings(max_examples=200, deadline=None)
@given(published=positions, flushed=positions, wake=words, sleeps=words)
def test_idle_wake_matches_its_twin(published: int, flushed: int, wake: int, sleeps: int) -> None:
    buf = _block(published, flushed, wake, sleeps)
    twin = bytearray(buf)
    _native.idle_wake(buf)
    idle_wake_reference(twin)
    assert buf == twin


@settings(max_examples=200, deadline=None)
@given(published=positions, flushed=positions, pos=positions, wake=words, sleeps=words)
def test_wait_flushed_past_matches_its_twin(
    published: int, flushed: int, pos: int, wake: int, sleeps: int
) -> None:
    buf = _block(published, flushed, wake, sleeps)
    twin = bytearray(buf)
    assert _native.wait_flushed_past(buf, pos, 1) is wait_flushed_past_reference(twin, pos)
    assert buf == twin


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _native.idle_sleep(bytearray(c.SLOTS_OFF), 0), "takes 3 arguments"),
        (lambda: _native.idle_sleep(bytearray(c.SLOTS_OFF), "0", 1), "pos"),
        (lambda: _native.wait_flushed_past(bytearray(16), 0, 1), "shorter than a control block"),
        (lambda: _native.wait_flushed_past(bytearray(c.SLOTS_OFF), 0, 1.5), "timeout_ns"),
        (lambda: _native.idle_wake(b"x" * c.SLOTS_OFF), "ctl"),
    ],
)
def test_bad_arguments_are_typed_errors(call: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        call()  # type: ignore[operator]
