"""Commit-log bytes for the scanner's tests: V1 and V2 records, fillers and BLANKs laid
end to end, the appender fields patched in as the commit log would."""

from __future__ import annotations

import struct

from mqstore.engine import filler, indexfile, record, recordcodes
from mqstore.engine.record import CheckStatus, EncodeStatus, Message
from mqstore.engine.scan import RecordScan, ScanStop


def to_v2(data: bytes) -> bytes:
    """A V1 record rewritten as V2: the V2 magic and a 2-byte topic length (one byte
    longer), as RocketMQ 5 writes a record whose topic does not fit a signed byte."""
    total, _magic = struct.unpack_from(">iI", data)
    sys_flag = struct.unpack_from(">i", data, record.POS_SYSFLAG)[0]
    bh = 20 if sys_flag & 0x10 else 8
    sh = 20 if sys_flag & 0x20 else 8
    p = 72 + bh + sh
    p += max(struct.unpack_from(">i", data, p - 4)[0], 0)
    head = struct.pack(">iI", total + 1, record.MESSAGE_MAGIC_CODE_V2) + data[8:p]
    return head + struct.pack(">h", data[p]) + data[p + 1 :]


def encoded(msg: Message, *, v2: bool = False) -> bytes:
    """`msg` encoded (asserting it encodes), optionally as V2, placeholders unpatched."""
    rec = record.encode(msg)
    assert rec.status is EncodeStatus.OK, rec.reason
    return to_v2(rec.data) if v2 else rec.data


def filler_bytes(size: int, topic: str, queue_id: int) -> bytes:
    return filler.filler_record(size, topic, queue_id).data


def lay_out(parts: list[bytes], *, queue_offset: int = 0, t0: int = 1_700_000_000_000) -> bytes:
    """Records end to end from commit-log offset 0, each with its queue offset (counting
    from `queue_offset`), physical offset and store time patched in. A part of 8 bytes
    or less is written as given (a BLANK header, zeros)."""
    out = bytearray()
    for i, data in enumerate(parts):
        pos = len(out)
        out += data
        if len(data) > 8:
            sys_flag = struct.unpack_from(">i", data, record.POS_SYSFLAG)[0]
            struct.pack_into(">qq", out, pos + record.POS_QUEUEOFFSET, queue_offset + i, pos)
            struct.pack_into(">q", out, pos + record.store_timestamp_pos(sys_flag), t0 + i)
    return bytes(out)


def blank(size: int) -> bytes:
    return struct.pack(">iI", size, record.BLANK_MAGIC_CODE)


def walk(
    buf: bytes,
    pos: int,
    end: int,
    check_crc: bool = True,
    delay_ms: tuple[int, ...] = recordcodes.DELAY_LEVEL_MS,
) -> list[tuple[int, record.RecordHeader]]:
    """check_record from `pos` while it accepts, up to `end`."""
    out = []
    while pos < end:
        h = record.check_record(buf, pos, limit=end, check_crc=check_crc, delay_ms=delay_ms)
        if h.status is not CheckStatus.OK:
            break
        out.append((pos, h))
        pos += h.size
    return out


def assert_matches_walk(
    buf: bytes,
    scan: RecordScan,
    pos: int,
    end: int,
    check_crc: bool = True,
    cap: int = -1,
    delay_ms: tuple[int, ...] = recordcodes.DELAY_LEVEL_MS,
) -> None:
    """Every column of `scan` is what check_record says of the same records, walked one
    by one from `pos` (and the scan took all of them, unless capped)."""
    whole = walk(buf, pos, end, check_crc, delay_ms)
    walked = whole[: scan.count]
    assert scan.count == len(walked)
    assert scan.stop_pos == (walked[-1][0] + walked[-1][1].size if walked else max(pos, 0))
    if scan.stop is not ScanStop.LIMIT:
        assert len(whole) == scan.count
        h = record.check_record(buf, scan.stop_pos, limit=end, check_crc=check_crc)
        if scan.stop is ScanStop.BLANK:
            assert (h.status, h.size, scan.reason) == (CheckStatus.BLANK, scan.blank_size, "")
        else:
            assert (h.status, h.reason) == (CheckStatus.CORRUPT, scan.reason)
    else:
        assert scan.stop_pos >= end or scan.count == cap
    for i, (p, h) in enumerate(walked):
        assert scan.pos[i] == p
        assert scan.size[i] == h.size
        assert scan.queue_id[i] == h.queue_id
        assert scan.queue_offset[i] == h.queue_offset
        assert scan.physical_offset[i] == h.physical_offset
        assert scan.sys_flag[i] == h.sys_flag
        assert scan.flag[i] == h.flag
        assert scan.born_timestamp[i] == h.born_timestamp
        assert scan.store_timestamp[i] == h.store_timestamp
        assert scan.tags_code[i] == (h.tags_code + (1 << 63)) % (1 << 64) - (1 << 63)
        assert (scan.body_pos[i], scan.body_len[i]) == (h.body_pos, h.body_len)
        topic = buf[scan.topic_pos[i] : scan.topic_pos[i] + scan.topic_len[i]]
        assert recordcodes.decode_utf8(topic) == h.topic
        props = buf[scan.props_pos[i] : scan.props_pos[i] + scan.props_len[i]]
        assert record.decode_properties(props) == h.properties
        assert scan.props_pos[i] + scan.props_len[i] == p + h.size
        is_filler = filler.is_filler(h)
        assert scan.bits[i] == 1 | (2 if is_filler else 0)
        keys = [] if is_filler else [h.uniq_key or "", *(h.keys or "").split(" ")]
        want = [indexfile.key_hash(indexfile.build_key(h.topic, k)) for k in keys if k]
        assert list(scan.key_hash[scan.key_first[i] : scan.key_first[i + 1]]) == want
    assert len(scan.key_first) == scan.count + 1
    assert scan.key_first[scan.count] == len(scan.key_hash)
