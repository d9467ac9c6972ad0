"""Client message ids and idempotent puts (`ipc/native/mqs_uniq.c`) against their Python
reference (tests/native/uniq_reference.py, put_reference.py's `uniq_key`), over a real
control block: the ids byte for byte (a fixed clock is the seam), the record a put
stores with its UNIQ_KEY, a golden id that RocketMQ's MessageClientIDSetter parsed, and
the idempotence table: a put whose key is stored answers the first put's result and
stores nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore import _native
from mqstore.ipc import control as c
from mqstore.ipc.results import PutMessageStatus, PutResult
from tests.native.conftest import SEG
from tests.native.put_reference import put_reference
from tests.native.test_put_message import (
    MAX_BODY,
    SETTINGS,
    STORE_HOST,
    Put,
    bodies,
    check_stored,
    keys_,
    props_,
    tags_,
)
from tests.native.uniq_reference import IdsRef, WindowRef, month_bounds, parse

OK = PutMessageStatus.PUT_OK
GOLDEN = Path(__file__).parents[1] / "data" / "golden" / "uniq-key.json"
IP = bytes([10, 1, 2, 3])
NOW = 1_795_743_942_122  # 2026-11-27T01:45:42.122Z


@pytest.fixture
def put(cb: c.ControlBlock) -> Iterator[Callable[..., Put]]:
    """test_put_message's appender, over a block whose positions start at 0."""
    made: list[Put] = []

    def make(**kw: Any) -> Put:
        for off in (c.OFF_RESERVED, c.OFF_SEQ, c.OFF_PUBLISHED_SEQ, c.OFF_PUBLISHED):
            cb.set(off, 0)
        idem = cb.qtable_off + cb.qtable_capacity * c.QROW  # a fresh idempotence table
        cb.buf[idem : idem + _native.IDEM_SIZE] = bytes(_native.IDEM_SIZE)
        made.append(Put(cb, **kw))
        return made[-1]

    yield make
    for p in made:
        p.app.close()


steps = st.lists(
    st.integers(-5_000, 5_000) | st.sampled_from([0, 0, 0, 40 * 86_400_000, -40 * 86_400_000]),
    min_size=1,
    max_size=40,
)


@SETTINGS
@given(pid=st.integers(0, 2**32 - 1), hash_=st.integers(0, 2**32 - 1), steps=steps)
def test_ids_are_the_references(pid: int, hash_: int, steps: list[int]) -> None:
    ids = _native.UniqIds(IP, pid=pid, hash=hash_, clock_ms=NOW)
    ref = IdsRef(IP, pid, hash_, NOW)
    now = NOW
    assert ids.producer_id == ref.producer.hex().upper()
    for step in steps:
        now = max(now + step, 0)
        ids.set_clock(now)
        assert ids.next() == ref.next(now)


def test_no_id_repeats_within_one_ms() -> None:
    """65536 ids in one ms use every counter value; the next one moves the time on."""
    ids = _native.UniqIds(IP, pid=7, hash=9, clock_ms=NOW)
    ref = IdsRef(IP, 7, 9, NOW)
    got = [ids.next() for _ in range(65537)]
    assert len(set(got)) == 65537
    assert got[-1] == [ref.next(NOW) for _ in range(65537)][-1]
    start, _ = month_bounds(NOW)
    assert parse(got[-2])[3] == NOW - start and parse(got[-1])[3] == NOW - start + 1


def test_a_forked_child_is_another_producer() -> None:
    ids = _native.UniqIds(IP)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, ids.next().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert child[:20] != ids.producer_id and child[8:12] == f"{pid & 0xFFFF:04X}"


def test_golden_id_rocketmq_parsed() -> None:
    """The ids of tests/data/golden/uniq-key.json, made in a process whose time zone is
    UTC: byte for byte, and what RocketMQ's MessageClientIDSetter read from them."""
    g = json.loads(GOLDEN.read_text())
    code = (
        "import json,sys; from mqstore import _native; g=json.loads(sys.argv[1]); "
        "ids=_native.UniqIds(bytes(g['ip']), pid=g['pid'], hash=g['hash'], "
        "clock_ms=g['clock_ms']); "
        "print(json.dumps([ids.next() for _ in g['ids']]))"
    )
    env = {**os.environ, "TZ": "UTC"}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(g)], env=env, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    made = json.loads(out.stdout)
    assert made == [one["id"] for one in g["ids"]]
    for one in g["ids"]:
        ip, pid16, hash_, span, _n = parse(one["id"])
        assert ip == one["rocketmq_ip"] and (pid16, hash_) == (g["pid"] & 0xFFFF, g["hash"])
        assert one["rocketmq_nearly_time_ms"] == g["month_start_utc_ms"] + span == g["clock_ms"]


def _stamped(p: Put, ids: Any) -> Put:
    p.app.use_ids(ids, True)
    return p


@SETTINGS
@given(body=bodies, tags=tags_, keys=keys_, properties=props_)
def test_put_stores_the_reference_record_with_its_uniq_key(
    put: Callable[..., Put], body: Any, tags: Any, keys: Any, properties: Any
) -> None:  # fmt: skip
    ids = _native.UniqIds(IP, pid=1, hash=2, clock_ms=NOW)
    ref = IdsRef(IP, 1, 2, NOW)
    p = _stamped(put(), ids)
    lane = p.lane("T")
    got = p.app.put_message("T", body, tags, keys, properties, None, False)
    given_key = (properties or {}).get("UNIQ_KEY")
    want = put_reference(
        "T", body, tags, keys, properties, None, lane=lane, max_body=MAX_BODY, seg_size=SEG,
        store_host=STORE_HOST, born=0, uniq_key=None if given_key is not None else ref.next(NOW),
    )  # fmt: skip
    assert type(got) is PutResult
    if isinstance(want[0], PutMessageStatus):
        assert (got.status, got.reason) == want
        assert got.uniq_key == ""
    else:
        msg, size = want
        assert got.size == size
        assert got.uniq_key == msg.properties["UNIQ_KEY"]
        check_stored(p, got, msg)


def test_a_stored_key_answers_the_first_result(put: Callable[..., Put], cb: c.ControlBlock) -> None:
    p = _stamped(put(), _native.UniqIds(IP, pid=1, hash=2))
    first = p.app.put_message("T", b"x", None, None, None, None, False)
    assert first.status is OK and len(first.uniq_key) == 32
    seq = cb.get(c.OFF_SEQ)
    again = p.app.put_message("T", b"x", None, None, {"UNIQ_KEY": first.uniq_key}, 2, False)
    assert again.status is OK and again.reason.startswith("duplicate")
    assert again[2:] == first[2:]  # msg id, offset, size, queue, queue offset, time, key
    assert cb.get(c.OFF_SEQ) == seq  # nothing reserved
    assert _native.idem_find(cb.buf, first.uniq_key) == (
        2, first.physical_offset, first.size, first.queue_id, first.queue_offset,
        first.store_timestamp,
    )  # fmt: skip
    # A key never stored, and a key that is not 32 hex digits, are stored.
    never = first.uniq_key[:20] + "00000000FFFF"
    assert p.app.put_message("T", b"y", None, None, {"UNIQ_KEY": never}, None, False).reason == ""
    for _ in range(2):
        r = p.app.put_message("T", b"z", None, None, {"UNIQ_KEY": "mine-1"}, None, False)
        assert r.reason == "" and r.uniq_key == "mine-1"
    # Another client's stored key (a re-put of its message) is a new put.
    q = _stamped(Put(cb), _native.UniqIds(IP, pid=3, hash=4))
    theirs = q.app.put_message("T", b"w", None, None, None, None, False)
    q.app.close()
    r = p.app.put_message("T", b"w", None, None, {"UNIQ_KEY": theirs.uniq_key}, None, False)
    assert r.reason == "" and r.physical_offset > theirs.physical_offset
    assert cb.get(c.OFF_SEQ) == seq + 5


def test_off_stores_a_retry_again(put: Callable[..., Put], cb: c.ControlBlock) -> None:
    p = put()
    p.app.use_ids(_native.UniqIds(IP), False)
    first = p.app.put_message("T", b"x", None, None, None, None, False)
    again = p.app.put_message("T", b"x", None, None, {"UNIQ_KEY": first.uniq_key}, None, False)
    assert again.reason == "" and again.physical_offset > first.physical_offset


def test_a_batch_is_recognised_whole(put: Callable[..., Put], cb: c.ControlBlock) -> None:
    p = _stamped(put(), _native.UniqIds(IP))
    first = p.app.put_batch_messages([{"topic": "T", "body": b"%d" % i} for i in range(5)], False)
    assert all(r.status is OK for r in first)
    keyed = [
        {"topic": "T", "body": b"%d" % i, "properties": {"UNIQ_KEY": r.uniq_key}}
        for i, r in enumerate(first)
    ]
    seq = cb.get(c.OFF_SEQ)
    again = p.app.put_batch_messages(keyed, False)
    assert [r[2:] for r in again] == [r[2:] for r in first]
    assert cb.get(c.OFF_SEQ) == seq
    # One message more than was stored: the batch is stored (recognised whole or not at all).
    more = p.app.put_batch_messages([*keyed, {"topic": "T", "body": b"new"}], False)
    assert all(r.reason == "" for r in more) and cb.get(c.OFF_SEQ) > seq


def test_a_redelivered_put_is_neither_answered_nor_noted(
    put: Callable[..., Put], cb: c.ControlBlock
) -> None:
    """send_back and the scheduler re-put a stored message with its UNIQ_KEY, which may be
    this client's own: `redelivered` stores it every time and leaves the table as it was
    (a retry of the first put is still answered the first put's result)."""
    p = _stamped(put(), _native.UniqIds(IP))
    first = p.app.put_message("T", b"x", None, None, None, None, False)
    msg = {"topic": "%RETRY%G", "body": b"x", "properties": {"UNIQ_KEY": first.uniq_key}}
    backs = [p.app.put_batch_messages([msg], False, False, True)[0] for _ in range(2)]
    assert all(b.reason == "" and b.status is OK for b in backs), backs
    assert len({first.physical_offset, *(b.physical_offset for b in backs)}) == 3
    again = p.app.put_message("T", b"x", None, None, {"UNIQ_KEY": first.uniq_key}, None, False)
    assert again.physical_offset == first.physical_offset and again.reason != ""
    # A key only ever put redelivered is not in the table: a plain put of it is stored.
    key = first.uniq_key[:-4] + "FFFF"
    one = p.app.put_batch_messages([{**msg, "properties": {"UNIQ_KEY": key}}], False, False, True)[
        0
    ]
    assert one.status is OK and _native.idem_find(cb.buf, key) is None
    plain = p.app.put_message("T", b"y", None, None, {"UNIQ_KEY": key}, None, False)
    assert plain.reason == "" and plain.physical_offset > one.physical_offset
    with pytest.raises(TypeError, match="2 to 4"):
        p.app.put_batch_messages([msg], False, False, True, 1)


def test_the_window_remembers_the_last_puts(put: Callable[..., Put], cb: c.ControlBlock) -> None:
    p = _stamped(put(), _native.UniqIds(IP))
    keys = [p.app.put_message("T", b"x", None, None, None, None, False).uniq_key
            for _ in range(_native.IDEM_WINDOW + 1)]  # fmt: skip
    assert _native.idem_find(cb.buf, keys[0]) is None  # the oldest left the window
    assert all(_native.idem_find(cb.buf, k) is not None for k in keys[1:])


def test_idem_note_refuses_what_is_not_a_key(cb: c.ControlBlock) -> None:
    with pytest.raises(ValueError, match="32 hex"):
        _native.idem_note(cb.buf, "zz", 0, 1, 0, 0, 0)
    with pytest.raises(ValueError, match="4 bytes"):
        _native.UniqIds(b"\x01")


@SETTINGS
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.none() | st.integers(0, 300)), min_size=1, max_size=300
    )
)
def test_retries_are_answered_as_the_window_reference_says(
    put: Callable[..., Put], ops: list[tuple[int, int | None]]
) -> None:
    """Three clients put new messages and retry earlier ones of their own (None: a new
    put; k: the k-th last of its puts): the C table answers a retry with the first result
    exactly when WindowRef remembers it, else stores the message again."""
    p = put()
    apps = [p.app] + [Put(p.cb).app for _ in range(2)]
    for k, app in enumerate(apps):
        app.use_ids(_native.UniqIds(IP, pid=10 + k, hash=k), True)
    ref = WindowRef(_native.IDEM_WINDOW)
    keys: list[list[str]] = [[], [], []]
    for who, back in ops:
        app = apps[who]
        mine = keys[who]
        props = None if back is None or back >= len(mine) else {"UNIQ_KEY": mine[-1 - back]}
        r = app.put_message("T", b"m", None, None, props, 0, False)
        assert r.status is OK, r
        first = ref.put(r.uniq_key) if props else None
        if first is not None:
            assert r.reason.startswith("duplicate") and r[2:] == first[2:]
        else:
            assert r.reason == ""
            ref.stored(r.uniq_key, r)
            if props is None:
                mine.append(r.uniq_key)
    for app in apps[1:]:
        app.close()
