"""The C put's compression step (`ipc/native/mqs_compress.c`) against its Python reference
(`engine.compression.compress_reference`), through `Appender.put_message` and
`put_batch_messages` over a real control block: for every codec, level, threshold and
body (compressible or not, at and around the threshold, bodies flagged compressed by
their caller) the record bytes equal the reference encoder's record of the reference's
(body, sysFlag). Runs under ASan/UBSan too (`make sanitize`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.engine import compression
from mqstore.engine.compression import Codec
from mqstore.engine.record import Message
from mqstore.ipc import control as c
from mqstore.ipc.results import PutMessageStatus, PutResult
from tests.native.conftest import SEG
from tests.native.put_reference import put_reference
from tests.native.test_put_message import MAX_BODY, STORE_HOST, Put, check_stored

SETTINGS = settings(
    max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
OK = PutMessageStatus.PUT_OK


@pytest.fixture
def put(cb: c.ControlBlock) -> Iterator[Callable[..., Put]]:
    made: list[Put] = []

    def make(codec: Codec | None, level: int, over: int) -> Put:
        for off in (c.OFF_RESERVED, c.OFF_SEQ, c.OFF_PUBLISHED_SEQ, c.OFF_PUBLISHED):
            cb.set(off, 0)
        p = Put(cb)
        if codec is not None:
            p.app.configure_compression(compression.compressor(codec, level), over, codec.flag)
        made.append(p)
        return p

    yield make
    for p in made:
        p.app.close()


def _text(n: int) -> bytes:
    return (b'{"k": "value", "n": 12345, "list": [1, 2, 3]} ' * (n // 45 + 1))[:n]


codecs = st.sampled_from([None, *Codec])
levels = {
    Codec.ZLIB: st.integers(-1, 9),
    Codec.LZ4: st.integers(0, 16),
    Codec.ZSTD: st.integers(1, 19),
}
bodies = st.one_of(
    st.integers(0, MAX_BODY).map(_text),
    st.binary(max_size=MAX_BODY),
    st.integers(0, 64).map(lambda n: b"\0" * n),
    st.sampled_from([512, 1023, 1024, 1025]).map(_text),
).flatmap(lambda b: st.sampled_from([b, bytearray(b), memoryview(b)]))


def _setup(draw: st.DrawFn) -> tuple[Codec | None, int, int]:
    codec = draw(codecs)
    level = draw(levels[codec]) if codec is not None else 0
    return codec, level, draw(st.sampled_from([0, 1, 1024, MAX_BODY]))


@st.composite
def setups(draw: st.DrawFn) -> tuple[Codec | None, int, int]:
    return _setup(draw)


def _want(m: Message, codec: Codec | None, level: int, over: int) -> Message:
    body, flag = compression.compress_reference(bytes(m.body), m.sys_flag, codec, level, over)
    return dataclasses.replace(m, body=body, sys_flag=flag)


@SETTINGS
@given(setup=setups(), body=bodies, flagged=st.booleans())
def test_put_message_compresses_as_the_reference(
    put: Callable[..., Put], setup: tuple[Codec | None, int, int], body: Any, flagged: bool
) -> None:
    codec, level, over = setup
    p = put(codec, level, over)
    if flagged:  # a Message its caller marked compressed itself: stored as given
        got = p.app.put_batch_messages([Message("T", bytes(body), queue_id=0, sys_flag=1)], False)
        (r,) = got
        msg = Message("T", bytes(body), queue_id=0, sys_flag=1)
        lane_msg = put_reference(
            "T", bytes(body), None, None, None, 0, lane=p.lane("T"), max_body=MAX_BODY,
            seg_size=SEG, store_host=STORE_HOST, born=0, message=msg,
        )  # fmt: skip
    else:
        r = p.app.put_message("T", body, None, None, None, 0, False)
        lane_msg = put_reference(
            "T", body, None, None, None, 0, lane=p.lane("T"), max_body=MAX_BODY, seg_size=SEG,
            store_host=STORE_HOST, born=0,
        )  # fmt: skip
    assert type(r) is PutResult
    ref, _size = lane_msg  # type: ignore[misc]
    want = _want(ref, codec, level, over)
    check_stored(p, r, want)
    if flagged:
        assert want.body == bytes(body)
    elif codec is not None and len(body) >= over and len(want.body) < len(body):
        assert want.sys_flag == codec.flag
        assert compression.decompress(want.body, want.sys_flag) == bytes(body)


@SETTINGS
@given(setup=setups(), batch=st.lists(bodies, min_size=1, max_size=8))
def test_put_batch_compresses_each_message_as_the_reference(
    put: Callable[..., Put], setup: tuple[Codec | None, int, int], batch: list[Any]
) -> None:
    codec, level, over = setup
    p = put(codec, level, over)
    got = p.app.put_batch_messages([{"topic": "T", "body": b, "queue_id": 1} for b in batch], False)
    assert len(got) == len(batch)
    at = 0
    for b, r in zip(batch, got, strict=True):
        ref, size = put_reference(  # type: ignore[misc]
            "T", b, None, None, None, 1, lane=p.lane("T"), max_body=MAX_BODY, seg_size=SEG,
            store_host=STORE_HOST, born=0,
        )  # fmt: skip
        want = _want(ref, codec, level, over)
        assert r.physical_offset == at and r.size <= size
        check_stored(p, r, want)
        at += r.size


def test_a_compressor_that_fails_or_answers_no_bytes_raises_and_stores_nothing(
    put: Callable[..., Put],
) -> None:
    p = put(None, 0, 0)

    def broken(_view: memoryview) -> bytes:
        raise RuntimeError("codec broke")

    p.app.configure_compression(broken, 0, Codec.ZLIB.flag)
    with pytest.raises(RuntimeError, match="codec broke"):
        p.app.put_message("T", b"x" * 100, None, None, None, 0, False)
    p.app.configure_compression(lambda _v: "not bytes", 0, Codec.ZLIB.flag)
    with pytest.raises(TypeError, match="not bytes"):
        p.app.put_batch_messages([{"topic": "T", "body": b"y" * 100}], False)
    assert p.cb.get(c.OFF_SEQ) == 0  # nothing reserved
    p.app.configure_compression(None, 0, 0)  # off again: stored as given
    r = p.app.put_message("T", b"z" * 100, None, None, None, 0, False)
    assert r.status is OK and r.size > 100


@pytest.mark.parametrize(
    ("fn", "over", "flag"),
    [(3, 0, 0x301), (len, -1, 0x301), (len, 0, 0x300), (len, 0, 0x1), (len, 0, 0x1301)],
)
def test_configure_compression_refuses_bad_arguments(
    put: Callable[..., Put], fn: Any, over: int, flag: int
) -> None:
    p = put(None, 0, 0)
    with pytest.raises((TypeError, ValueError)):
        p.app.configure_compression(fn, over, flag)


def test_a_body_that_compresses_to_the_same_size_or_more_is_stored_as_given(
    put: Callable[..., Put],
) -> None:
    p = put(Codec.ZLIB, 9, 0)
    noise = os.urandom(3000)
    r = p.app.put_message("T", noise, None, None, None, 0, False)
    assert p.cb.pool_buf is not None
    raw = bytes(p.cb.pool_buf[r.physical_offset : r.physical_offset + r.size])
    assert noise in raw and int.from_bytes(raw[36:40], "big") & 0x701 == 0
