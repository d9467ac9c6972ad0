"""Commit-log bytes for the scanner's tests: V1 and V2 records, fillers and BLANKs laid
end to end, the appender fields patched in as the commit log would."""

from __future__ import annotations

import struct

from mqstore.engine import filler, record
from mqstore.engine.record import EncodeStatus, Message


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
