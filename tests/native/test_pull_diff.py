"""A pull's walk in C (`mqstore._native.pull_units`, through `engine.pull.pull_units`)
against the reference (`engine.pull.pull_units_py`): the same stop, next unit, sizes and
removing flag, and the same messages, field by field (type and value; bodies byte for
byte, copies or views of the log).

Hypothesis draws logs as the scanner's test does (V1 and V2 records, IPv4 and IPv6
hosts, properties of any bytes, fillers, damage), then consume-queue units over them:
right, wrong sizes, pre-blanks, zeros, offsets anywhere (past the limit, outside the
mapped window, negative, below the unit before: not written yet, the walk stops), tag
codes right, wrong or ConsumeQueueExt addresses; and a tag filter, batch limits, a
window of the log and a limit. The walk is resumed after NEED_LOG with the whole log, as
the reader does. Real RocketMQ stores are walked too.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import compression, record, recordcodes
from mqstore.engine.consumequeue_files import PRE_BLANK_SIZE
from mqstore.engine.pull import (
    LAZY_ROLES,
    MAX_EXT_ADDR,
    PullStop,
    Walk,
    pull_units,
    pull_units_py,
)
from mqstore.engine.record import CheckStatus, DecodedRecord, Message, RecordFields, RecordView
from mqstore.ipc.consumer import ConsumedMessage  # registers itself as the lazy class
from tests.engine.scanlog import lay_out, to_v2
from tests.native.test_scan_diff import _filler, _hosts, _record

REAL = Path(__file__).resolve().parents[1] / "data" / "rocketmq-real"
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
_UNIT = struct.Struct(">qiq")
Fn = Callable[..., Walk]
_PLAIN = record.encode(Message("P", b"body", {"TAGS": "p"})).data


def _sentinel() -> DecodedRecord:
    """A message already in `out` before the walk (only its count matters)."""
    return record.decode(_PLAIN, 0)


_LAZY_SLOTS = ("_raw", "_body", "queue_offset", "_q", "_tag", "done", "_rec")
_OWNER = object()


def assert_same_messages(c: list[Any], py: list[Any]) -> None:
    assert len(c) == len(py)
    for a, b in zip(c, py, strict=True):
        assert type(a) is type(b)
        if type(a) is ConsumedMessage:
            for name in _LAZY_SLOTS:
                x, y = getattr(a, name), getattr(b, name)
                assert type(x) is type(y) and x == y, name
            continue
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            assert type(x) is type(y), f.name
            if isinstance(x, memoryview):
                assert isinstance(y, memoryview)
                assert (x.readonly, x.format, x.tobytes()) == (y.readonly, y.format, y.tobytes())
            else:
                assert x == y, f.name


_tag = st.sampled_from(["a", "b", "鍵", "x y"])
_good = st.builds(  # a message as a producer sends it
    lambda topic, body, tags, keys, born, store, v2: (lambda data: to_v2(data) if v2 else data)(
        record.encode(
            Message(
                topic,
                body,
                {"TAGS": tags, "KEYS": keys} if tags else {"KEYS": keys},
                born_host=born,
                store_host=store,
                born_timestamp=1,
            )
        ).data
    ),
    st.sampled_from(["T", "TopicTest", "主题"]),
    st.binary(max_size=300),
    st.one_of(st.none(), _tag),
    st.sampled_from(["k1", "k1 k2", "鍵"]),
    _hosts,
    _hosts,
    st.booleans(),
)


@dataclasses.dataclass(frozen=True)
class Case:
    """A log, units over it, and the arguments of one walk."""

    buf: bytes
    units: bytes
    window: tuple[int, int]  # the part of the log mapped first
    limit: int
    codes: tuple[int, ...] | None
    wanted: frozenset[str] | None
    max_count: int
    max_bytes: int
    got_bytes: int
    already: int  # messages in `out` before the walk
    start: int
    zero_copy: bool
    lazy: bool  # into (owner, tag): ConsumedMessages


@st.composite
def walks(draw: st.DrawFn) -> Case:
    """A log, units over it, and the arguments of one walk."""
    parts = draw(st.lists(st.one_of(_good, _good, _record(), _filler), min_size=1, max_size=8))
    buf = bytearray(lay_out(parts))
    starts, pos = [], 0
    for p in parts:
        starts.append(pos)
        pos += len(p)
    if buf and draw(st.integers(0, 4)) == 0:  # damage somewhere
        buf[draw(st.integers(0, len(buf) - 1))] ^= draw(st.integers(1, 255))
    buf += bytes(draw(st.integers(0, 64)))
    heads = [record.check_record(bytes(buf), s) for s in starts]
    tags = sorted({h.properties.get("TAGS", "") for h in heads if h.status is CheckStatus.OK})
    units = bytearray()
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 9))
        if starts and kind <= 5:
            k = draw(st.integers(0, len(starts) - 1))
            size = len(parts[k]) + (draw(st.integers(-3, 3)) if kind == 5 else 0)
            code = heads[k].tags_code if heads[k].status is CheckStatus.OK else 0
            code = draw(st.sampled_from([code, code, MAX_EXT_ADDR, 12345]))
            units += _UNIT.pack(starts[k], size, code)
        elif kind == 6:
            units += _UNIT.pack(0, PRE_BLANK_SIZE, 0)
        elif kind == 7:
            units += bytes(20)
        else:
            units += _UNIT.pack(draw(st.integers(-5, len(buf) + 50)), draw(I32), draw(I64))
    lo, hi = 0, len(buf)  # the whole log, or a window of it
    if draw(st.booleans()):
        lo = draw(st.integers(0, len(buf)))
        hi = draw(st.integers(lo, len(buf)))
    wanted = None
    if draw(st.booleans()):
        wanted = frozenset(draw(st.lists(st.sampled_from([*tags, "a", "p"]), max_size=3)))
    codes = None  # the wanted tags' codes, and maybe others (or others alone)
    if wanted is not None or draw(st.integers(0, 7)) == 7:
        more = draw(st.lists(st.one_of(I64, st.sampled_from([h.tags_code for h in heads] or [0]))))
        codes = tuple(sorted({recordcodes.tags_code(t) for t in wanted or ()} | set(more[:3])))
    return Case(
        buf=bytes(buf),
        units=bytes(units),
        window=(lo, hi),
        limit=draw(st.integers(0, len(buf) + 8)) if draw(st.booleans()) else len(buf),
        codes=codes,
        wanted=wanted,
        max_count=draw(st.integers(1, 10)),
        max_bytes=draw(st.sampled_from([1 << 40, 1 << 40, 0, 500, 3000, 6000])),
        got_bytes=draw(st.sampled_from([0, 0, 0, 100, 2000])),
        already=draw(st.sampled_from([0, 0, 0, 1, 2])),
        start=min(draw(st.sampled_from([0, 0, 0, 1, 2])), len(units) // 20),
        zero_copy=(zero_copy := draw(st.booleans())),
        lazy=not zero_copy and draw(st.booleans()),
    )


def _walk(fn: Fn, w: Case) -> tuple[list[Walk], list[RecordFields]]:
    """One walk from `start` over the window, then (after NEED_LOG) on over the whole log:
    what each call returned, and the messages."""
    lo, hi = w.window
    out: list[RecordFields] = [_sentinel() for _ in range(w.already)]
    start, log, base, got = w.start, memoryview(w.buf)[lo:hi], lo, w.got_bytes
    calls = []
    into = (_OWNER, 7) if w.lazy else None
    for _ in range(2):
        r = fn(
            w.units, start, log, base, w.limit, w.codes, w.wanted, w.max_count, w.max_bytes,
            got, w.zero_copy, out, into,
        )  # fmt: skip
        calls.append(r)
        if r[1] != PullStop.NEED_LOG:
            break
        start, got = r[0], r[2]
        log, base = memoryview(w.buf), 0
    return calls, out[w.already :]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=walks())
def test_c_walks_as_the_reference(w: Case) -> None:
    c_calls, c_msgs = _walk(pull_units, w)
    py_calls, py_msgs = _walk(pull_units_py, w)
    assert c_calls == py_calls
    assert [type(x) for x in c_calls[0]] == [type(x) for x in py_calls[0]]
    assert_same_messages(c_msgs, py_msgs)
    event(f"stops {[PullStop(r[1]).name for r in c_calls]}, removing {c_calls[-1][3]}")
    event(f"messages {min(len(c_msgs), 3)}{'+' if len(c_msgs) >= 3 else ''}")
    if w.zero_copy:
        assert all(type(m) is RecordView for m in c_msgs)
    elif w.lazy:
        assert all(type(m) is ConsumedMessage for m in c_msgs)
        for m in c_msgs:  # its record, decoded on demand, is the copying pull's
            assert m._q is _OWNER and m._tag == 7 and m.done is False and m._rec is None
            plain: list[RecordFields] = []
            phys = m._raw[28:36]
            pull_units_py(
                _UNIT.pack(int.from_bytes(phys, "big", signed=True), len(m._raw), 0), 0,
                m._raw, int.from_bytes(phys, "big", signed=True), 1 << 62, None, None, 1,
                1 << 40, 0, False, plain,
            )  # fmt: skip
            assert_same_messages([m.record], [compression.inflate(plain[0])])
            assert m.body == m.record.body
    else:
        assert all(type(m) is DecodedRecord and type(m.body) is bytes for m in c_msgs)


def test_zero_copy_bodies_are_views_of_the_log() -> None:
    buf = bytearray(lay_out([_PLAIN, _PLAIN]))
    units = b"".join(_UNIT.pack(p, len(_PLAIN), 0) for p in (0, len(_PLAIN)))
    log = memoryview(bytes(buf))
    out: list[RecordFields] = []
    assert pull_units(units, 0, log, 0, len(buf), None, None, 8, 1 << 20, 0, True, out) == (
        2, PullStop.END, 2 * len(_PLAIN), False,
    )  # fmt: skip
    for m in out:
        assert isinstance(m.body, memoryview) and m.body.readonly and m.body.obj is log.obj
        assert m.body.tobytes() == b"body"


def test_a_full_batch_stops_before_the_next_real_unit_after_pre_blanks() -> None:
    buf = lay_out([_PLAIN, _PLAIN, _PLAIN])
    n = len(_PLAIN)
    pre = _UNIT.pack(0, PRE_BLANK_SIZE, 0)
    units = _UNIT.pack(0, n, 0) + pre + pre + _UNIT.pack(n, n, 0) + _UNIT.pack(2 * n, n, 0)
    for fn in (pull_units, pull_units_py):
        out: list[RecordFields] = []
        assert fn(units, 0, buf, 0, len(buf), None, None, 1, 1 << 20, 0, False, out) == (
            3, PullStop.FULL, n, False,
        )  # fmt: skip
        assert len(out) == 1
        out = []  # max_bytes: the first message is taken whatever its size, then no more
        assert fn(units, 0, buf, 0, len(buf), None, None, 9, n + 1, 0, False, out)[:2] == (
            3, PullStop.FULL,
        )  # fmt: skip


@pytest.mark.parametrize("fn", [pull_units, pull_units_py])
def test_a_unit_not_written_yet_ends_the_walk(fn: Fn) -> None:
    """Units as a reader can see a run the dispatcher writes with one memcpy in part
    (its first bytes stored last): a unit still zero, or with its size written and its
    offset still zero, before units already written. The walk stops at it (passing it
    lost its message; the zero offset gave the record at 0 again, a duplicate)."""
    n = len(_PLAIN)
    buf = lay_out([_PLAIN] * 4)
    good = [_UNIT.pack(k * n, n, 0) for k in range(4)]
    for torn in (bytes(20), bytes(8) + good[2][8:], _UNIT.pack(-1, n, 0)):
        units = good[0] + good[1] + torn + good[3]
        out: list[RecordFields] = []
        assert fn(units, 0, buf, 0, len(buf), None, None, 9, 1 << 20, 0, False, out) == (
            2, PullStop.UNWRITTEN, 2 * n, False,
        )  # fmt: skip
        assert [m.physical_offset for m in out] == [0, n]
        # the first unit walked is checked against the one before it in `units`
        assert fn(units, 2, buf, 0, len(buf), None, None, 9, 1 << 20, 0, False, [])[:2] == (
            2, PullStop.UNWRITTEN,
        )  # fmt: skip
    pre = _UNIT.pack(0, PRE_BLANK_SIZE, 0)  # a pre-blank is passed, and checks nothing
    units = pre + good[0] + pre + good[1]
    assert fn(units, 0, buf, 0, len(buf), None, None, 9, 1 << 20, 0, False, [])[:2] == (
        4, PullStop.END,
    )  # fmt: skip


@pytest.mark.parametrize("fn", [pull_units, pull_units_py])
def test_bad_arguments_are_refused_alike(fn: Fn) -> None:
    buf = lay_out([_PLAIN])
    unit = _UNIT.pack(0, len(_PLAIN), 0)
    ok = (unit, 0, buf, 0, len(buf), None, None, 1, 100, 0, False, [])
    assert fn(*ok)[1] == PullStop.END
    for i, bad, err in [
        (0, unit[:-1], "whole 20-byte units"),
        (1, 2, "not a unit"),
        (1, -1, "not a unit"),
        (3, -1, "log_base"),
        (7, 0, "max_count"),
    ]:
        args = list(ok)
        args[i] = bad
        with pytest.raises(ValueError, match=err):
            fn(*args)


def test_c_refuses_wrong_types_with_the_parameter_name() -> None:
    buf = lay_out([_PLAIN])
    unit = _UNIT.pack(0, len(_PLAIN), 0)
    ok = (unit, 0, buf, 0, len(buf), None, None, 1, 100, 0, False, [])
    for i, bad, name in [
        (0, "units", "units"),
        (2, 1.5, "log"),
        (4, "1", "limit"),
        (5, [1], "codes"),
        (5, ("a",), "codes"),
        (6, ["a"], "wanted"),
        (10, 1, "zero_copy"),
        (11, (), "out"),
    ]:
        args = list(ok)
        args[i] = bad
        with pytest.raises(TypeError, match=name):
            pull_units(*args)
    with pytest.raises(TypeError, match="12 or 13 arguments"):
        pull_units(*ok[:-1])  # type: ignore[call-arg]


def test_register_refuses_classes_it_cannot_fill() -> None:
    names = tuple(f.name for f in dataclasses.fields(RecordFields))
    with pytest.raises(ValueError, match="fields"):
        _native.pull_register(DecodedRecord, RecordView, names[:-1], recordcodes.format_host)
    with pytest.raises(ValueError, match="fields\\[0\\]"):
        _native.pull_register(DecodedRecord, RecordView, ("x", *names[1:]), recordcodes.format_host)

    class Plain:
        pass

    with pytest.raises((TypeError, AttributeError)):
        _native.pull_register(Plain, RecordView, names, recordcodes.format_host)
    with pytest.raises(TypeError, match="callable"):
        _native.pull_register(DecodedRecord, RecordView, names, None)


def _drive(
    fn: Fn, units: bytes, segments: dict[int, bytes], zero_copy: bool
) -> tuple[list[Walk], list[RecordFields]]:
    """Walk all `units` as the reader does: map the segment a unit needs, then go on (a
    unit no segment holds is taken as gone)."""
    limit = max(segments) + len(segments[max(segments)])
    out: list[RecordFields] = []
    i, base, got, calls = 0, -1, 0, []
    while True:
        log = segments.get(base, b"")
        r = fn(units, i, log, max(base, 0), limit, None, None, 10**6, 1 << 40, got, zero_copy, out)
        calls.append(r)
        i, got = r[0], r[2]
        if r[1] != PullStop.NEED_LOG:
            return calls, out
        off = _UNIT.unpack_from(units, i * 20)[0]
        base = max((b for b in segments if b <= off), default=-2)
        if base < 0 or off >= base + len(segments[base]):
            i += 1


@pytest.mark.parametrize("store", ["broker-4.2-unit-store", "rocketmq-rust-0.9-store"])
@pytest.mark.parametrize("zero_copy", [False, True])
def test_the_real_rocketmq_stores_walk_alike(store: str, zero_copy: bool) -> None:
    segments = {int(p.name): p.read_bytes() for p in (REAL / store / "commitlog").iterdir()}
    found = 0
    for path in sorted((REAL / store).glob("consumequeue/*/*/*")):
        units = path.read_bytes()
        units = units[: len(units) - len(units) % 20]
        c_calls, c_msgs = _drive(pull_units, units, segments, zero_copy)
        py_calls, py_msgs = _drive(pull_units_py, units, segments, zero_copy)
        assert c_calls == py_calls, path
        assert_same_messages(c_msgs, py_msgs)
        found += len(c_msgs)
    assert found > 0


@pytest.mark.parametrize("fn", [pull_units, pull_units_py])
def test_a_pull_into_an_owner_refuses_bad_arguments_alike(fn: Fn) -> None:
    buf = lay_out([_PLAIN])
    unit = _UNIT.pack(0, len(_PLAIN), 0)
    ok = (unit, 0, buf, 0, len(buf), None, None, 1, 100, 0, False, [])
    out: list[Any] = []
    assert fn(*ok[:-1], out, (_OWNER, 3))[1] == PullStop.END
    assert [type(m) for m in out] == [ConsumedMessage]
    assert (out[0].queue_offset, out[0].body, out[0]._raw) == (0, b"body", bytes(buf))
    for bad in ((_OWNER,), [_OWNER, 3], "ab"):
        with pytest.raises(TypeError, match="into"):
            fn(*ok, bad)
    with pytest.raises(ValueError, match="zero_copy False"):
        fn(*ok[:10], True, [], (_OWNER, 3))


def test_register_lazy_refuses_classes_it_cannot_fill() -> None:
    assert len(LAZY_ROLES) == len(_LAZY_SLOTS)
    with pytest.raises(ValueError, match="names"):
        _native.pull_register_lazy(ConsumedMessage, _LAZY_SLOTS[:-1])

    class Plain:
        __slots__ = ("x",)

    with pytest.raises((TypeError, AttributeError)):
        _native.pull_register_lazy(Plain, _LAZY_SLOTS)
    with pytest.raises(TypeError, match="must be a class"):
        _native.pull_register_lazy(1, _LAZY_SLOTS)
    _native.pull_register_lazy(ConsumedMessage, _LAZY_SLOTS)  # as it was
