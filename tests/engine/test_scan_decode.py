"""Reads decoded through the scanner (`engine.scan_decode.find_records`) against the
reference (`engine.record.decode`, and `check_record` with the CRC for what is a record):
at any set of starts, aligned or not, joined into runs or scanned alone, on logs with
every kind of record, a damaged body, an embedded record and zeros; zero-copy bodies."""

from __future__ import annotations

import dataclasses
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.engine import record
from mqstore.engine.record import CheckStatus, DecodedRecord, Message, RecordView
from mqstore.engine.scan_decode import find_records
from tests.engine.scanlog import encoded, filler_bytes, lay_out
from tests.engine.storebuild import message


def _msg(i: int, **kw: object) -> Message:
    """`storebuild.message` with a body of 0 to 4 parts and other fields replaced."""
    fields: dict[str, object] = {"body": f"body-{i}".encode() * (i % 5), **kw}
    return dataclasses.replace(message(i), **fields)  # type: ignore[arg-type]


def _log() -> tuple[bytes, list[int]]:
    """Records of every kind (one with a damaged body, one whose body is itself a whole
    record), then zeros; and where each record starts."""
    inner = lay_out([encoded(_msg(99))])
    parts = [
        encoded(_msg(0)),
        encoded(_msg(1), v2=True),
        encoded(_msg(2, born_host="[::1]:5000", store_host="[fe80::2]:10911")),
        filler_bytes(200, "T", 1),
        encoded(_msg(4, topic="tópico", properties={"KEYS": "ключ 鍵", "TAGS": "标签"})),
        encoded(_msg(5, properties={})),
        encoded(_msg(6, body=inner)),
        encoded(_msg(7)),  # its body is damaged below
        encoded(_msg(8, body=b"")),
        encoded(_msg(9)),
    ]
    buf = bytearray(lay_out(parts) + bytes(300))
    starts, p = [], 0
    for part in parts:
        starts.append(p)
        p += len(part)
    body7 = record.check_record(bytes(buf), starts[7]).body_pos
    buf[body7] ^= 0xFF
    return bytes(buf), starts


LOG, STARTS = _log()
# where the record inside message 6's body starts: a record too, by check_record's rules
INNER = record.check_record(LOG, STARTS[6]).body_pos
CANDIDATES = sorted({*STARTS, INNER, STARTS[1] + 1, STARTS[9] + 4, len(LOG) - 100})


def _expected(buf: bytes, start: int, end: int) -> DecodedRecord | None:
    """The reference's answer at `start`: a record that check_record accepts with its
    CRC and that ends within `end`, decoded by `decode`."""
    if record.check_record(buf, start, limit=end).status is not CheckStatus.OK:
        return None
    return record.decode(buf, start, limit=end)


def test_the_log_has_what_the_cases_need() -> None:
    assert _expected(LOG, STARTS[7], len(LOG)) is None  # damaged body
    assert record.decode(LOG, STARTS[7]).crc_ok is False
    assert _expected(LOG, INNER, len(LOG)) is not None  # a record inside a body
    assert _expected(LOG, STARTS[1] + 1, len(LOG)) is None


@settings(max_examples=150, deadline=None)
@given(
    picks=st.sets(st.sampled_from(CANDIDATES), min_size=1),
    sized=st.booleans(),
    gap_bytes=st.sampled_from([0, 64, 1 << 20]),
    cut=st.integers(0, 400),
)
def test_same_answer_as_decode_at_every_start(
    picks: set[int], sized: bool, gap_bytes: int, cut: int
) -> None:
    view = memoryview(LOG)[: len(LOG) - cut]
    starts = sorted(picks)
    sizes = [_size(s) if sized else 0 for s in starts]
    found = find_records(view, starts, sizes, gap_bytes=gap_bytes)
    for s in starts:
        assert found.get(s) == _expected(LOG, s, len(view)), s
    assert set(found) <= set(starts)


def _size(start: int) -> int:
    """TOTALSIZE as stored (what a consume-queue unit says), 0 where it is nonsense."""
    total = struct.unpack_from(">i", LOG, start)[0]
    return max(total, 0)


def test_zero_copy_bodies_are_read_only_views_of_the_buffer() -> None:
    view = memoryview(LOG)
    copies = find_records(view, STARTS, [_size(s) for s in STARTS])
    views = find_records(view, STARTS, [_size(s) for s in STARTS], zero_copy=True)
    assert set(views) == set(copies) and len(views) == len(STARTS) - 1  # all but the damaged
    for s, rec in views.items():
        assert isinstance(rec, RecordView) and isinstance(copies[s], DecodedRecord)
        assert rec.body.readonly and rec.body.obj is LOG
        assert bytes(rec.body) == copies[s].body
        assert {**_fields(rec), "body": None} == {**_fields(copies[s]), "body": None}


def _fields(rec: record.RecordFields) -> dict[str, object]:
    return {name: getattr(rec, name) for name in record.RecordFields.__dataclass_fields__}
