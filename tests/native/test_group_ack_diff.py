"""A group consumer's ack in C (`mqstore._native.group_ack`, `Consumer.ack`'s fast path)
against its reference (`ipc.consumer.group_ack_py`): the same answer, and the same
message, queue and slot words after it.

Hypothesis draws a granted queue in any state (active, revoking, dropped; the message's
grant or another; its lease running or over; a slot inside the words or not), its
delivered messages (acked or not, in any mix), what is buffered and where the next fetch
is (offsets past a slot's 40 bits too), the message acked (of the queue, acked before
or not), and the consumer's lock free or held. Each side gets its own copy of the case.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
from collections import deque
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.ipc import group_slots
from mqstore.ipc.consumer import ConsumedMessage, _Queue, group_ack_py

_OFF = st.one_of(st.integers(0, 1000), st.just(group_slots.OFFSET_MASK + 1), st.just(-1))


@dataclasses.dataclass(frozen=True)
class Case:
    tag: int
    live: bool
    slot: int
    state: str
    next_fetch: int
    done: tuple[bool, ...]  # the inflight messages, acked or not
    start: int
    nbuf: int
    pos: int
    pick: int  # the inflight message acked; -1: one of another grant, -2: of this one
    other_done: bool
    locked: bool


@st.composite
def cases(draw: st.DrawFn) -> Case:
    done = tuple(draw(st.lists(st.booleans(), max_size=6)))
    nbuf = draw(st.integers(0, 3))
    return Case(
        tag=draw(st.integers(1, group_slots.TAG_MASK)),
        live=draw(st.booleans()),
        slot=draw(st.integers(-1, 9)),
        state=draw(st.sampled_from(["active", "active", "active", "revoking", "dropped"])),
        next_fetch=draw(_OFF),
        done=done,
        start=draw(st.sampled_from([0, 7, group_slots.OFFSET_MASK - 2])),
        nbuf=nbuf,
        pos=draw(st.integers(0, nbuf - 1)) if nbuf else 0,
        pick=draw(st.integers(-2, len(done) - 1)),
        other_done=draw(st.booleans()),
        locked=draw(st.integers(0, 3)) == 0,
    )


def _msg(q: _Queue, tag: int, offset: int, done: bool) -> ConsumedMessage:
    m = object.__new__(ConsumedMessage)
    m._raw, m._body, m.queue_offset, m._q, m._tag, m.done, m._rec = (
        b"", b"", offset, q, tag, done, None,
    )  # fmt: skip
    return m


def _build(c: Case) -> tuple[ConsumedMessage, threading.Lock, Any]:
    q = _Queue("t", 0, c.tag, c.slot, 0, time.monotonic() + (100.0 if c.live else -1.0))
    q.state = c.state  # type: ignore[assignment]
    q.next_fetch = c.next_fetch
    q.inflight = deque(_msg(q, c.tag, c.start + k, d) for k, d in enumerate(c.done))
    q.buffer = [_msg(q, c.tag, c.start + len(c.done) + k, False) for k in range(c.nbuf)]
    q.pos = c.pos
    if c.pick >= 0:
        msg = q.inflight[c.pick]
    else:
        msg = _msg(q, c.tag if c.pick == -2 else c.tag ^ 1, c.start + 99, c.other_done)
    lock = threading.Lock()
    if c.locked:
        lock.acquire()
    return msg, lock, (ctypes.c_uint64 * 8)()


def _after(msg: ConsumedMessage, words: Any) -> tuple[Any, ...]:
    q = msg._q
    return msg.done, [(m.queue_offset, m.done) for m in q.inflight], list(words)


def _run(fn: Any, c: Case) -> tuple[Any, ...]:
    msg, lock, words = _build(c)
    try:
        got: Any = fn(msg, lock, words)
    except ValueError as e:
        got = ("ValueError", str(e))
    return got, _after(msg, words)


@settings(max_examples=500, deadline=None)
@given(c=cases())
def test_c_acks_as_the_reference(c: Case) -> None:
    got = _run(_native.group_ack, c)
    assert got == _run(group_ack_py, c)
    event(f"answer {got[0]}")


def test_an_ack_stores_the_lowest_offset_not_acked() -> None:
    """Messages 3..7 delivered; acking all but 3 keeps the slot at 3, acking 3 moves it to
    8 (the buffer's first) and lets them all go."""
    for fn in (_native.group_ack, group_ack_py):
        c = Case(5, True, 2, "active", 20, (False,) * 5, 3, 1, 0, 0, False, False)
        msg, lock, words = _build(c)
        q = msg._q
        for m in list(q.inflight)[1:]:
            assert fn(m, lock, words) == 1
            assert group_slots.unpack(words[2]) == (5, 3)
        assert fn(m, lock, words) == 0  # acked before
        assert fn(msg, lock, words) == 1
        assert group_slots.unpack(words[2]) == (5, 8) and not q.inflight
        q.buffer = []
        extra = _msg(q, 5, 8, False)
        q.inflight.append(extra)
        assert fn(extra, lock, words) == 1
        assert group_slots.unpack(words[2]) == (5, 20)  # next_fetch


def test_bad_arguments_are_refused() -> None:
    c = Case(5, True, 2, "active", 20, (False,), 3, 0, 0, 0, False, False)
    msg, lock, words = _build(c)
    with pytest.raises(TypeError, match="3 arguments"):
        _native.group_ack(msg, lock)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        _native.group_ack(msg, object(), words)
    with pytest.raises(BufferError):
        _native.group_ack(msg, lock, b"\0" * 64)  # not writable
    assert msg.done is False  # nothing changed
    with pytest.raises(AttributeError):
        _native.group_ack(object(), lock, words)
