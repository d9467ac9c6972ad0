"""The record codec against RocketMQ's bytes: golden files, real broker stores, round trips."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.engine import record as r
from mqstore.engine import recordcodes

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"


def _place(rec: r.EncodedRecord, queue_offset: int, phys: int, store_ts: int) -> bytes:
    buf = bytearray(len(rec.data))
    r.patch_append_fields(buf, 0, rec, queue_offset, phys, store_ts)
    return bytes(buf)


def _golden_message(**kw: object) -> r.Message:
    base: dict[str, object] = dict(
        topic="TopicTest",
        body=b"Hello RocketMQ",
        properties={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "0A0B0C0D"},
        queue_id=3,
        flag=7,
        born_timestamp=1_700_000_000_123,
        born_host="10.0.0.5:51000",
        store_host="10.0.0.1:10911",
        reconsume_times=1,
    )
    base.update(kw)
    return r.Message(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "msg"),
    [
        ("record-v1-ipv4.bin", _golden_message()),
        (
            "record-v1-ipv6.bin",
            _golden_message(born_host="[fe80::1]:51000", store_host="[::1]:10911"),
        ),
    ],
)
def test_golden_record_bytes(name: str, msg: r.Message) -> None:
    rec = r.encode(msg)
    assert rec.status is r.EncodeStatus.OK, rec.reason
    got = _place(rec, queue_offset=42, phys=8192, store_ts=1_700_000_000_456)
    assert got == (GOLDEN / name).read_bytes()


def test_golden_layout_by_hand() -> None:
    """Rebuild the IPv4 golden record field by field from the spec's table."""
    body, topic = b"Hello RocketMQ", b"TopicTest"
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x010A0B0C0D\x02"
    total = 91 + len(body) + len(topic) + len(props)
    expected = b"".join(
        [
            struct.pack(">iIiiiqqiq", total, 0xDAA320A7, zlib.crc32(body) & 0x7FFFFFFF, 3, 7,
                        42, 8192, 0, 1_700_000_000_123),
            bytes([10, 0, 0, 5]), struct.pack(">i", 51000),
            struct.pack(">q", 1_700_000_000_456),
            bytes([10, 0, 0, 1]), struct.pack(">i", 10911),
            struct.pack(">iqi", 1, 0, len(body)), body,
            bytes([len(topic)]), topic, struct.pack(">h", len(props)), props,
        ]
    )  # fmt: skip
    assert (GOLDEN / "record-v1-ipv4.bin").read_bytes() == expected
    assert len(expected) == total


def _real_segments(real_stores_dir: Path) -> list[Path]:
    return sorted(p for p in real_stores_dir.glob("*/commitlog/*") if p.stat().st_size)


def test_reencoding_every_real_record_reproduces_its_bytes(real_stores_dir: Path) -> None:
    """What a real broker wrote, decoded and encoded again, is the same bytes."""
    count = 0
    for seg in _real_segments(real_stores_dir):
        data = seg.read_bytes()
        pos = 0
        while True:
            h = r.check_record(data, pos)
            if h.status is not r.CheckStatus.OK:
                break
            x = r.decode(data, pos)
            msg = r.Message(
                topic=x.topic, body=x.body, properties=x.properties, queue_id=x.queue_id,
                flag=x.flag, sys_flag=x.sys_flag, born_timestamp=x.born_timestamp,
                born_host=x.born_host, store_host=x.store_host, reconsume_times=x.reconsume_times,
                prepared_transaction_offset=x.prepared_transaction_offset,
            )  # fmt: skip
            again = _place(r.encode(msg), x.queue_offset, x.physical_offset, x.store_timestamp)
            assert again == data[pos : pos + h.size], f"{seg} offset {pos}"
            assert x.physical_offset == int(seg.name) + pos
            count += 1
            pos += h.size
    assert count == 179 + 47 + 2


def test_real_segment_ends_in_blank_then_stale_bytes(real_stores_dir: Path) -> None:
    data = (real_stores_dir / "broker-4.2-unit-store/commitlog/00000000000000000000").read_bytes()
    pos = 0
    n = 0
    while (h := r.check_record(data, pos)).status is r.CheckStatus.OK:
        pos += h.size
        n += 1
    assert (n, pos) == (47, 8084)
    assert h.status is r.CheckStatus.BLANK and h.size == 8192 - 8084
    assert data[pos + 8 : pos + 16] != bytes(8)  # stale bytes after the header


def test_msg_id_matches_rocketmq(real_stores_dir: Path) -> None:
    data = (real_stores_dir / "broker-4.9-commitlog/commitlog/00000000000000000000").read_bytes()
    x = r.decode(data, 172)
    assert x.store_host == "192.168.71.1:8123"
    assert x.msg_id == "C0A8470100001FBB" + f"{172:016X}"
    assert recordcodes.parse_msg_id(x.msg_id) == (bytes([192, 168, 71, 1]), 8123, 172)


def test_java_hash() -> None:
    assert recordcodes.java_string_hash("60") == 1722
    assert recordcodes.java_string_hash("Aa") == recordcodes.java_string_hash("BB") == 2112
    assert recordcodes.java_string_hash("polygenelubricants") == -(2**31)
    assert recordcodes.java_string_hash("日本") == ord("日") * 31 + ord("本")
    assert recordcodes.java_string_hash("😀") == 0xD83D * 31 + 0xDE00  # UTF-16 surrogate pair
    assert recordcodes.tags_code(None) == 0 and recordcodes.tags_code("") == 0


def test_properties_parser_is_lenient_as_rocketmq() -> None:
    raw = b"a\x011\x02\x01x\x02b\x01\x02\x02cc\x012\x02zz"
    assert r.decode_properties(raw) == {"a": "1", "cc": "2"}
    assert r.decode_properties(b"k\x01v=\x01w") == {"k": "v=\x01w"}


@pytest.mark.parametrize(
    ("kw", "status", "needle"),
    [
        ({"topic": ""}, r.EncodeStatus.MESSAGE_ILLEGAL, "topic"),
        ({"topic": "t" * 128}, r.EncodeStatus.MESSAGE_ILLEGAL, "127"),
        ({"topic": "é" * 64}, r.EncodeStatus.MESSAGE_ILLEGAL, "UTF-8"),
        ({"properties": {"": "v"}}, r.EncodeStatus.MESSAGE_ILLEGAL, "empty"),
        ({"properties": {"k": ""}}, r.EncodeStatus.MESSAGE_ILLEGAL, "empty value"),
        ({"properties": {"k": "a\x02b"}}, r.EncodeStatus.MESSAGE_ILLEGAL, "separator"),
        ({"properties": {"k": "v" * 40000}}, r.EncodeStatus.PROPERTIES_SIZE_EXCEEDED, "32767"),
        ({"body": b"x" * 1025}, r.EncodeStatus.MESSAGE_ILLEGAL, "maxMessageSize"),
        ({"born_host": "nohost"}, r.EncodeStatus.MESSAGE_ILLEGAL, "host"),
        ({"queue_id": -1}, r.EncodeStatus.MESSAGE_ILLEGAL, "negative"),
        ({"flag": 2**40}, r.EncodeStatus.MESSAGE_ILLEGAL, "range"),
    ],
)
def test_bad_input_gets_a_status_and_a_reason(
    kw: dict[str, object], status: r.EncodeStatus, needle: str
) -> None:
    rec = r.encode(_golden_message(**kw), max_message_size=1024)
    assert rec.status is status
    assert needle in rec.reason
    assert rec.data == b""


def test_check_record_reports_corruption() -> None:
    rec = r.encode(_golden_message())
    good = bytearray(_place(rec, 0, 0, 1))
    assert r.check_record(good, 0).status is r.CheckStatus.OK
    flipped = bytearray(good)
    flipped[rec.data.index(b"Hello") + 1] ^= 0x01
    bad = r.check_record(flipped, 0)
    assert bad.status is r.CheckStatus.CORRUPT and "CRC" in bad.reason
    assert r.check_record(flipped, 0, check_crc=False).status is r.CheckStatus.OK
    assert r.decode(flipped, 0).crc_ok is False
    torn = good[:-5]
    assert r.check_record(torn, 0).status is r.CheckStatus.CORRUPT
    torn_end = bytearray(good)  # the properties' last bytes never written (zeros)
    torn_end[-2:] = bytes(2)
    h = r.check_record(torn_end, 0)
    assert h.status is r.CheckStatus.CORRUPT and "torn" in h.reason
    wrong_len = bytearray(good) + bytes(8)
    struct.pack_into(">i", wrong_len, 0, len(good) + 4)
    h = r.check_record(wrong_len, 0)
    assert (h.status, h.size) == (r.CheckStatus.CORRUPT, len(good) + 4)
    assert r.check_record(bytes(200), 0).reason.startswith("illegal magic")
    with pytest.raises(r.RecordError):
        r.decode(bytes(200), 0)


def test_v2_record_is_read() -> None:
    """A 5.x V2 record: magic 0xDAA320AB and a 2-byte topic length."""
    topic = ("t" * 200).encode()
    v1 = r.encode(_golden_message(topic="x", properties={"TAGS": "a"}))
    body = b"Hello RocketMQ"
    head = bytearray(v1.data[: 88 + len(body)])
    props = b"TAGS\x01a\x02"
    rec = (
        bytes(head) + struct.pack(">h", len(topic)) + topic + struct.pack(">h", len(props)) + props
    )
    rec = bytearray(rec)
    struct.pack_into(">iI", rec, 0, len(rec), r.MESSAGE_MAGIC_CODE_V2)
    assert len(rec) == r.record_length(len(body), len(topic), len(props), v2=True)
    x = r.decode(rec, 0)
    assert (x.topic, x.tags, x.body) == ("t" * 200, "a", body)


def test_compressed_body_is_inflated_on_request() -> None:
    raw = b"squeeze me " * 50
    msg = _golden_message(body=zlib.compress(raw), sys_flag=r.SysFlag.COMPRESSED)
    placed = _place(r.encode(msg), 0, 0, 1)
    assert r.decode(placed, 0).body == zlib.compress(raw)
    assert r.decode(placed, 0, decompress=True).body == raw


def test_schedule_topic_tags_code_is_delivery_time() -> None:
    msg = _golden_message(topic=r.SCHEDULE_TOPIC, properties={"DELAY": "3", "TAGS": "x"})
    placed = _place(r.encode(msg), 0, 0, 1000)
    assert r.check_record(placed, 0).tags_code == 1000 + 10_000


hosts = st.one_of(
    st.ip_addresses(v=4)
    .map(str)
    .flatmap(lambda a: st.integers(0, 65535).map(lambda p: f"{a}:{p}")),
    st.ip_addresses(v=6)
    .map(str)
    .flatmap(lambda a: st.integers(0, 65535).map(lambda p: f"[{a}]:{p}")),
)
names = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=20,
)
messages = st.builds(
    r.Message,
    topic=st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=40).filter(
        lambda t: len(t.encode()) <= 127
    ),
    body=st.binary(max_size=2000),
    properties=st.dictionaries(names, names, max_size=6),
    queue_id=st.integers(0, 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    sys_flag=st.sampled_from([0, 0x2, 0x4, 0x8, 0xC]),
    born_timestamp=st.integers(0, 2**62),
    born_host=hosts,
    store_host=hosts,
    reconsume_times=st.integers(0, 1000),
    prepared_transaction_offset=st.integers(0, 2**62),
)


@settings(max_examples=300, deadline=None)
@given(
    msg=messages, qoff=st.integers(0, 2**62), phys=st.integers(0, 2**62), ts=st.integers(0, 2**62)
)
def test_decode_of_encode_is_identity(msg: r.Message, qoff: int, phys: int, ts: int) -> None:
    rec = r.encode(msg)
    assert rec.status is r.EncodeStatus.OK, rec.reason
    buf = bytearray(len(rec.data) + 8)
    r.patch_append_fields(buf, 0, rec, qoff, phys, ts)
    h = r.check_record(buf, 0)
    assert h.status is r.CheckStatus.OK and h.size == len(rec.data)
    x = r.decode(buf, 0)
    assert (x.topic, x.body, x.properties) == (msg.topic, msg.body, dict(msg.properties))
    assert (x.queue_id, x.flag, x.queue_offset, x.physical_offset, x.store_timestamp) == (
        msg.queue_id, msg.flag, qoff, phys, ts,
    )  # fmt: skip
    assert (x.born_timestamp, x.reconsume_times, x.prepared_transaction_offset) == (
        msg.born_timestamp, msg.reconsume_times, msg.prepared_transaction_offset,
    )  # fmt: skip
    assert recordcodes.parse_host(x.born_host)[:2] == recordcodes.parse_host(msg.born_host)[:2]
    assert recordcodes.parse_host(x.store_host)[:2] == recordcodes.parse_host(msg.store_host)[:2]
    assert x.crc_ok and x.sys_flag & 0xF == msg.sys_flag


@pytest.mark.parametrize("sys_flag", [r.COMPRESSION_ZLIB | r.SysFlag.COMPRESSED, -1, 0x4000_0040])
def test_sys_flag_bits_beyond_the_named_ones_are_written_as_given(sys_flag: int) -> None:
    """IntFlag's `~` dropped every bit it does not name (compression type 0x700 too);
    found by the C encoder's differential test."""
    rec = r.encode(r.Message("t", b"x", sys_flag=sys_flag))
    written = int.from_bytes(rec.data[r.POS_SYSFLAG : r.POS_SYSFLAG + 4], "big", signed=True)
    assert written == sys_flag & ~0x30
