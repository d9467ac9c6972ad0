"""The C record scanner (`mqstore._native.scan_records`, through `engine.scan.scan_records`)
against the reference (`engine.scan.scan_records_py`), column by column, and both against
`engine.record.check_record` walked record by record.

Hypothesis draws whole logs: V1 and V2 records with IPv4 and IPv6 hosts, topics and
properties of any bytes (invalid UTF-8, separators anywhere, TAGS / KEYS / UNIQ_KEY /
DELAY with non-ASCII values), the schedule topic, fillers, BLANKs and junk, then tears
and damages the tail, and scans from any start to any limit, capped or not, CRC on or
off. The real RocketMQ stores under tests/data/rocketmq-real/ are scanned too.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.engine import filler, indexfile, record, recordcodes
from mqstore.engine.record import Message
from mqstore.engine.scan import COLUMNS, RecordScan, ScanStop, scan_records, scan_records_py
from tests.engine.scanlog import assert_matches_walk, blank, lay_out, to_v2

REAL = Path(__file__).resolve().parents[1] / "data" / "rocketmq-real"
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
_hosts = st.builds(
    lambda ip, port: f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}",
    st.ip_addresses(),
    st.integers(0, 65535),
)
_text = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="ab \x01\x02é鍵😀", max_size=12),
).map(lambda s: s.encode("utf-8", errors="surrogatepass"))
_bytes = st.one_of(_text, st.binary(max_size=16))
_delay = st.one_of(
    st.from_regex(r"[ \t]?[+-]?[0-9_]{0,4}[ \x0b]?", fullmatch=True),
    st.sampled_from(["3", "18", "99999999999999999999", "-1", "0", "٣", " ３ ", "1_0", "x"]),
    st.text(max_size=4),
).map(lambda s: s.encode("utf-8", errors="surrogatepass"))


@st.composite
def _props(draw: st.DrawFn) -> bytes:
    """Property bytes as a producer (or junk) could leave them: named pairs the scanner
    reads, pairs it must skip, separators anywhere."""
    pairs = []
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY", b"MQSTORE_FILLER"]))
        if draw(st.integers(0, 4)) == 0:
            name = draw(_bytes)
        value = draw(_delay) if name == b"DELAY" else draw(_bytes)
        pairs.append(name + b"\x01" + value + draw(st.sampled_from([b"\x02", b""])))
    return b"".join(pairs)[:32767]


@st.composite
def _record(draw: st.DrawFn) -> bytes:
    """One message record of any topic and properties bytes, V1 or V2."""
    msg = Message(
        "T",
        draw(st.one_of(st.binary(max_size=64), st.binary(max_size=3000))),
        {},
        queue_id=draw(st.integers(0, 2**31 - 1)),
        flag=draw(st.one_of(I32, st.just(filler.FILLER_FLAG))),
        sys_flag=draw(I32),
        born_timestamp=draw(st.one_of(I64, st.just(0))),
        born_host=draw(_hosts),
        store_host=draw(_hosts),
    )
    enc = record.encode(msg)
    assert enc.status is record.EncodeStatus.OK, enc.reason
    topic = draw(st.one_of(st.just(b"SCHEDULE_TOPIC_XXXX"), _bytes.filter(bool)))[:127]
    props = draw(st.one_of(_props(), st.just(b"MQSTORE_FILLER\x011\x02")))
    head = bytearray(enc.data[:-4])  # all but "\x01T" and the empty properties' length
    tail = bytes([len(topic)]) + topic + struct.pack(">h", len(props)) + props
    struct.pack_into(">i", head, 0, len(head) + len(tail))
    data = bytes(head) + tail
    return to_v2(data) if draw(st.booleans()) else data


_filler = st.builds(
    lambda n, t: filler.filler_record(n, t, 1).data,
    st.integers(200, 400),
    _text.map(lambda b: b.decode("utf-8", "replace")[:20] or "T"),
)
_end = st.one_of(st.builds(blank, st.integers(-5, 5000)), st.binary(min_size=1, max_size=8))


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    """Records end to end, maybe a BLANK or junk after them, then a torn or damaged tail."""
    t0 = draw(st.one_of(st.just(1_700_000_000_000), I64.map(lambda t: t // 2)))
    parts = draw(st.lists(st.one_of(_record(), _record(), _record(), _filler), max_size=8))
    if draw(st.booleans()):
        parts.append(draw(_end))
    buf = bytearray(lay_out(parts, t0=t0))
    if buf and draw(st.integers(0, 3)) == 0:  # damage somewhere
        for _ in range(draw(st.integers(1, 3))):
            buf[draw(st.integers(0, len(buf) - 1))] ^= draw(st.integers(1, 255))
    cut = draw(st.integers(0, 64)) if draw(st.booleans()) else 0  # a torn end
    if cut and len(buf) > cut:
        if draw(st.booleans()):
            buf[-cut:] = bytes(cut)
        else:
            del buf[-cut:]
    return bytes(buf + bytes(draw(st.integers(0, 200))))


# a store's messageDelayLevel: RocketMQ's default, or any 1 to 64 levels
_delay_tables = st.one_of(
    st.just(recordcodes.DELAY_LEVEL_MS),
    st.lists(st.integers(0, 2**61), min_size=1, max_size=64).map(tuple),
)


def assert_same(c: RecordScan, py: RecordScan) -> None:
    """Equal scans: the same stop and every column byte for byte, format included."""
    assert (c.count, c.stop, c.stop_pos, c.reason, c.blank_size) == (
        py.count, py.stop, py.stop_pos, py.reason, py.blank_size,
    )  # fmt: skip
    for name in [n for n, _code in COLUMNS] + ["key_first", "key_hash"]:
        a, b = getattr(c, name), getattr(py, name)
        assert (a.format, a.tobytes()) == (b.format, b.tobytes()), name


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    buf=logs(),
    pos=st.integers(0, 400),
    limit=st.integers(-1, 12000),
    cap=st.integers(-1, 6),
    check_crc=st.booleans(),
    start_at_record=st.booleans(),
    delays=_delay_tables,
)
def test_c_scans_as_the_reference_and_check_record(
    buf: bytes,
    pos: int,
    limit: int,
    cap: int,
    check_crc: bool,
    start_at_record: bool,
    delays: tuple[int, ...],
) -> None:
    if start_at_record:
        pos = 0
    c = scan_records(buf, pos, limit, check_crc=check_crc, max_records=cap, delay_ms=delays)
    py = scan_records_py(buf, pos, limit, check_crc=check_crc, max_records=cap, delay_ms=delays)
    assert_same(c, py)
    end = len(buf) if limit < 0 else min(limit, len(buf))
    assert_matches_walk(buf, c, pos, end, check_crc, cap, delays)


@given(data=st.binary(max_size=64), pos=st.integers(0, 70), limit=st.integers(-1, 70))
def test_any_bytes_scan_alike(data: bytes, pos: int, limit: int) -> None:
    assert_same(scan_records(data, pos, limit), scan_records_py(data, pos, limit))


def test_the_real_rocketmq_stores_scan_alike() -> None:
    segments = sorted(REAL.glob("*/commitlog/*"))
    assert segments, REAL
    records = 0
    for path in segments:
        buf = path.read_bytes()
        pos = 0
        while pos < len(buf):  # the whole segment, hopping nothing: a BLANK ends it
            c = scan_records(buf, pos, -1)
            assert_same(c, scan_records_py(buf, pos, -1))
            assert_matches_walk(buf, c, pos, len(buf))
            records += c.count
            if c.stop is not ScanStop.LIMIT or c.count == 0:
                break
            pos = c.stop_pos
    assert records > 0


_utf8_edges = st.lists(
    st.sampled_from([
        b"a", b"\xc2\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xf4\x8f\xbf\xbf", b"\xe0\xa0",
        b"\xe0\x80", b"\xed\xa0\x80", b"\xf0\x90", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xff",
        b"\x80", b"\xf5", b"\xe2\x28\xa1", b"\xf0\x9f\x98",
    ]),
    min_size=1,
    max_size=6,
).map(b"".join)  # fmt: skip


# ASCII runs long enough for the hash's 8-byte steps, between and around other bytes
_ascii_runs = st.lists(
    st.one_of(st.binary(min_size=1, max_size=20).map(lambda b: bytes(x & 0x7F for x in b)),
              _utf8_edges),
    min_size=1,
    max_size=5,
).map(b"".join)  # fmt: skip


@given(value=st.one_of(_utf8_edges, st.binary(min_size=1, max_size=24), _ascii_runs))
def test_tags_and_key_hashes_of_any_bytes_are_javas_over_javas_decoding(value: bytes) -> None:
    value = value.replace(b"\x01", b"").replace(b"\x02", b"").replace(b" ", b"") or b"x"
    props = b"TAGS\x01" + value + b"\x02KEYS\x01" + value + b"\x02"
    data = bytearray(to_v2(record.encode(Message("T", b"", {})).data))
    data[-2:] = struct.pack(">h", len(props)) + props
    struct.pack_into(">i", data, 0, len(data))
    scan = scan_records(bytes(data), 0, -1)
    assert scan.count == 1
    text = recordcodes.decode_utf8(value)  # tests/native/test_java_utf8.py: the JDK's
    assert scan.tags_code[0] == recordcodes.java_string_hash(text)
    assert list(scan.key_hash) == [indexfile.key_hash(indexfile.build_key("T", text))]


def test_a_unicode_delay_level_and_a_wrapping_delivery_time_read_as_the_reference() -> None:
    def scheduled(delay: str) -> bytes:
        msg = Message("SCHEDULE_TOPIC_XXXX", b"b", {"DELAY": delay, "TAGS": "t"})
        return record.encode(msg).data

    near_max = 2**63 - 5_000
    buf = lay_out([scheduled("٣"), scheduled(" ３ "), scheduled("18")], t0=near_max)
    scan = scan_records(buf, 0, -1)
    assert_same(scan, scan_records_py(buf, 0, -1))
    assert scan.count == 3
    assert list(scan.tags_code[:2]) == [near_max + 10_000 - 2**64, near_max + 1 + 10_000 - 2**64]


def test_the_delivery_time_is_by_the_stores_delay_table_capped_at_its_last_level() -> None:
    def scheduled(delay: str) -> bytes:
        return record.encode(Message("SCHEDULE_TOPIC_XXXX", b"b", {"DELAY": delay})).data

    t0 = 1_700_000_000_000
    buf = lay_out([scheduled("1"), scheduled("2"), scheduled("3"), scheduled("٣")], t0=t0)
    table = (4_000, 9_000)
    for scan in (
        scan_records(buf, 0, -1, delay_ms=table),
        scan_records_py(buf, 0, -1, delay_ms=table),
    ):
        assert [scan.tags_code[i] - scan.store_timestamp[i] for i in range(4)] == [
            4_000, 9_000, 9_000, 9_000,
        ]  # fmt: skip
    assert_same(
        scan_records(buf, 0, -1, delay_ms=table), scan_records_py(buf, 0, -1, delay_ms=table)
    )
    for bad in [(), tuple(range(65)), (-1,), (2**62,)]:
        with pytest.raises(ValueError, match="delay_ms"):
            scan_records(buf, 0, -1, delay_ms=bad)
        with pytest.raises(ValueError, match="delay_ms"):
            scan_records_py(buf, 0, -1, delay_ms=bad)
