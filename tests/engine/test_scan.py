"""The reference scanner (`engine.scan.scan_records_py`) against `check_record` walked
record by record: every column, every stop, on logs with V1 and V2 records, IPv6 hosts,
fillers, the schedule topic, non-ASCII keys, BLANKs, zeros and damage."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mqstore.engine import record
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.logwalk import ScanStop as LogStop
from mqstore.engine.record import CheckStatus, Message
from mqstore.engine.scan import ScanStop, scan_records, scan_records_py
from tests.engine.scanlog import assert_matches_walk, blank, encoded, filler_bytes, lay_out, walk
from tests.engine.storebuild import message, open_log, write_messages

T0 = 1_700_000_000_000


def _msg(i: int, **kw: object) -> Message:
    fields: dict[str, object] = {
        "topic": "T",
        "body": f"body-{i}".encode() * (i % 4),
        "properties": {"TAGS": f"tag{i % 3}", "KEYS": f"k{i}  common", "UNIQ_KEY": f"U{i}"},
        "queue_id": i % 3,
        "flag": i,
        "born_timestamp": T0 - i,
    }
    fields.update(kw)
    return Message(**fields)  # type: ignore[arg-type]


def _mixed_log() -> bytes:
    """Eight records of every kind the scanner must tell apart, then zeros."""
    return lay_out([
        encoded(_msg(0)),
        encoded(_msg(1), v2=True),
        encoded(_msg(2, born_host="[::1]:5000", store_host="[fe80::2]:10911")),
        filler_bytes(200, "T", 1),
        encoded(_msg(4, topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "3", "TAGS": "x"})),
        encoded(_msg(5, topic="tópico", properties={"KEYS": "ключ 鍵 😀", "TAGS": "标签"})),
        encoded(_msg(6, properties={})),
        encoded(_msg(7, sys_flag=0xC), v2=True),
        bytes(300),
    ])  # fmt: skip


def test_a_mixed_log_scans_as_check_record_walks_it() -> None:
    buf = _mixed_log()
    scan = scan_records_py(buf, 0, -1)
    assert scan.count == 8
    assert scan.stop is ScanStop.CORRUPT
    assert scan.stop_pos == len(buf) - 300
    assert scan.reason == "illegal magic code 0x00000000"
    assert list(scan.bits) == [1, 1, 1, 3, 1, 1, 1, 1]
    assert scan.tags_code[4] == T0 + 4 + 10_000  # the schedule topic: delivery time
    assert [scan.key_first[i + 1] - scan.key_first[i] for i in range(8)] == [3, 3, 3, 0, 0, 3, 0, 3]
    assert_matches_walk(buf, scan, 0, len(buf))


def test_columns_are_readonly_native_arrays() -> None:
    scan = scan_records_py(_mixed_log(), 0, -1)
    for name, code in [("pos", "q"), ("size", "i"), ("tags_code", "q"), ("bits", "B")]:
        col = getattr(scan, name)
        assert (col.format, col.readonly, len(col)) == (code, True, scan.count)
    assert (scan.key_first.format, scan.key_hash.format) == ("i", "i")


def test_every_start_limit_and_cap_agree_with_the_walk() -> None:
    buf = _mixed_log()
    starts = [p for p, _h in walk(buf, 0, len(buf))]
    for pos in starts:
        for end in [*starts, len(buf) - 300, len(buf) - 1]:
            for cap in (-1, 0, 1, 3):
                scan = scan_records_py(buf, pos, end, max_records=cap)
                assert_matches_walk(buf, scan, pos, end, cap=cap)


def test_limit_stops_at_a_record_boundary_and_a_torn_record_is_corrupt() -> None:
    buf = _mixed_log()
    one = scan_records_py(buf, 0, -1, max_records=1)
    assert (one.count, one.stop, one.stop_pos) == (1, ScanStop.LIMIT, one.size[0])
    at = scan_records_py(buf, 0, one.size[0])
    assert (at.count, at.stop, at.stop_pos, at.reason) == (1, ScanStop.LIMIT, one.size[0], "")
    torn = scan_records_py(buf, 0, one.size[0] + 50)
    assert (torn.count, torn.stop, torn.stop_pos) == (1, ScanStop.CORRUPT, one.size[0])
    assert torn.reason.startswith("TOTALSIZE ")
    past = scan_records_py(buf, len(buf) + 10, -1)
    assert (past.count, past.stop, past.stop_pos) == (0, ScanStop.LIMIT, len(buf) + 10)


def test_a_blank_stops_the_scan_with_its_size() -> None:
    buf = lay_out([encoded(_msg(0)), encoded(_msg(1)), blank(500), bytes(492)])
    scan = scan_records_py(buf, 0, -1)
    assert (scan.count, scan.stop, scan.blank_size) == (2, ScanStop.BLANK, 500)
    assert scan.stop_pos == len(buf) - 500


def test_a_body_crc_mismatch_stops_unless_crc_is_not_checked() -> None:
    buf = bytearray(_mixed_log())
    second = record.check_record(buf, 0).size
    h = record.check_record(buf, second)
    buf[h.body_pos] ^= 0xFF
    scan = scan_records_py(buf, 0, -1)
    assert (scan.count, scan.stop, scan.stop_pos) == (1, ScanStop.CORRUPT, second)
    assert scan.reason == "body CRC mismatch"
    unchecked = scan_records_py(buf, 0, -1, check_crc=False)
    assert unchecked.count == 8
    assert list(unchecked.bits)[1] == 1


def test_a_torn_end_is_corrupt() -> None:
    buf = bytearray(_mixed_log())
    buf[record.check_record(buf, 0).size - 1] = 0
    scan = scan_records_py(buf, 0, -1)
    assert (scan.count, scan.stop, scan.stop_pos) == (0, ScanStop.CORRUPT, 0)
    assert "torn write" in scan.reason


def test_negative_lengths_read_as_zero_as_check_record_counts_them() -> None:
    data = bytearray(encoded(_msg(0, body=b"", properties={})))
    struct.pack_into(">i", data, 84, -5)  # BODY length of a V1 record with IPv4 hosts
    struct.pack_into(">h", data, len(data) - 2, -1)  # PROPERTIES length
    h = record.check_record(data, 0)
    assert h.status is CheckStatus.OK, h.reason
    scan = scan_records_py(bytes(data), 0, -1)
    assert (scan.count, scan.body_len[0], scan.props_len[0]) == (1, 0, 0)
    assert scan.props_pos[0] == len(data)


def test_a_negative_start_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        scan_records_py(b"", -1, -1)


def test_scan_records_answers_as_the_reference() -> None:
    buf = _mixed_log()
    assert scan_records(buf, 0, -1) == scan_records_py(buf, 0, -1)


def _same_walk(log: CommitLog, start: int | None, to: int | None, check_crc: bool) -> None:
    """`CommitLog.scan_chunks` walks as `CommitLog.scan`: records, stop, end, reason."""
    old = log.scan(start, check_crc=check_crc, to_offset=to)
    want = [(r.offset, r.header.size, r.header.tags_code) for r in old]
    new = log.scan_chunks(start, check_crc=check_crc, to_offset=to)
    got = [
        (c.base + c.scan.pos[i], c.scan.size[i], c.scan.tags_code[i])
        for c in new
        for i in range(c.scan.count)
    ]
    assert got == want
    assert (new.stop, new.end_offset, new.reason, new.records) == (
        old.stop, old.end_offset, old.reason, old.records,
    )  # fmt: skip


def _poke(store: Path, offset: int, data: bytes) -> None:
    """Write `data` at commit-log offset `offset` of a closed log (4 KiB segments)."""
    with open(store / "commitlog" / f"{offset - offset % 4096:020d}", "r+b") as f:
        f.seek(offset % 4096)
        f.write(data)


def test_the_chunked_log_walk_is_the_record_walk(tmp_path: Path) -> None:
    log = open_log(tmp_path, size=4096)
    results = write_messages(log, 60)  # a dozen segments, each ended by a BLANK
    starts, end = [r.wrote_offset for r in results], log.max_offset()
    cuts = [None, 0, starts[1], starts[7] + 3, starts[30], end, 1 << 40]
    for start in [None, starts[0], starts[5], starts[29], end, 7, 1 << 40]:
        for to in cuts:
            _same_walk(log, start, to, True)
    log.close()
    _poke(tmp_path, end, b"\x01" * 40)  # junk after the last record: CORRUPT
    h = record.check_record(record.encode(message(40)).data, 0)
    _poke(tmp_path, starts[40] + h.body_pos, b"\xff")  # a body CRC fault
    log = open_log(tmp_path, size=4096)
    crc = log.scan_chunks()
    assert sum(c.scan.count for c in crc) == 40
    assert (crc.stop, crc.reason) == (LogStop.CORRUPT, "body CRC mismatch")
    for check_crc in (True, False):
        for start in [None, starts[39], starts[41]]:
            _same_walk(log, start, None, check_crc)
    log.close()
