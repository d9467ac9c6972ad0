"""The decoded side of `engine.record`: `RecordFields` (every field of one message
record), its `DecodedRecord` (body copied) and `RecordView` (body a view of the mapped
log), and `decode`.

Imported as `engine.record`'s own names on first use (that module's `__getattr__`), so a
producer's import, which only encodes, does not decorate these dataclasses. The classes'
`__module__` stays `mqstore.engine.record`, their home in the API, pickles and reprs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mqstore.engine.record import (
    _COMPRESSION_NAMES,
    _I32,
    COMPRESSION_TYPE_MASK,
    POS_BODYCRC,
    POS_BORNHOST,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    Buffer,
    CheckStatus,
    RecordError,
    SysFlag,
    body_crc,
    check_record,
)
from mqstore.engine.recordcodes import format_host, make_msg_id


@dataclass(frozen=True, slots=True)
class RecordFields:
    """Every field of one message record, as RocketMQ's `MessageDecoder` reads it; the
    body is a copy (`DecodedRecord`) or a view of the mapped log (`RecordView`)."""

    __module__ = "mqstore.engine.record"

    physical_offset: int
    size: int
    magic: int
    body_crc: int
    crc_ok: bool
    queue_id: int
    flag: int
    queue_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    topic: str
    body: bytes | memoryview
    properties: dict[str, str]
    tags: str | None
    keys: str | None
    msg_id: str

    @property
    def compression(self) -> str | None:
        """The codec its producer compressed the body with, from the sysFlag ("zlib",
        "lz4", "zstd"; "unknown" for type bits RocketMQ does not know), None for a body
        stored as given. Every read gives the original bytes (`engine.compression`);
        `size` and `body_crc` are the stored record's."""
        if not self.sys_flag & SysFlag.COMPRESSED:
            return None
        return _COMPRESSION_NAMES.get(self.sys_flag & COMPRESSION_TYPE_MASK, "unknown")

    def to_json_dict(self) -> dict[str, Any]:
        """This record as JSON, body in base64 (`mqstore dump` re-encodes it per `--body`).
        `properties` is null for a record without properties, as RocketMQ's
        `MessageDecoder` leaves them."""
        from base64 import b64encode  # here: a producer's import does not need it

        return {
            "physical_offset": self.physical_offset,
            "size": self.size,
            "magic": f"0x{self.magic:08x}",
            "body_crc": self.body_crc,
            "crc_ok": self.crc_ok,
            "queue_id": self.queue_id,
            "flag": self.flag,
            "queue_offset": self.queue_offset,
            "sys_flag": self.sys_flag,
            "born_timestamp": self.born_timestamp,
            "born_host": self.born_host,
            "store_timestamp": self.store_timestamp,
            "store_host": self.store_host,
            "reconsume_times": self.reconsume_times,
            "prepared_transaction_offset": self.prepared_transaction_offset,
            "topic": self.topic,
            "body": b64encode(self.body).decode("ascii"),
            "properties": self.properties or None,
            "tags": self.tags,
            "keys": self.keys,
            "msg_id": self.msg_id,
        }


@dataclass(frozen=True, slots=True)
class DecodedRecord(RecordFields):
    """A message record whose body is its own copy (what every read returns by default)."""

    __module__ = "mqstore.engine.record"

    body: bytes


@dataclass(frozen=True, slots=True)
class RecordView(RecordFields):
    """A message record whose body is a read-only memoryview of the mapped commit log
    (a zero-copy read: `StoreReader.get_messages(..., zero_copy=True)`).

    The view keeps its segment's mapping alive for as long as it (or any slice of it)
    exists: the reader never unmaps a mapping with views (closing it leaves the unmap
    to the last view's release), and a segment that retention deletes meanwhile stays
    readable, since an unlinked file's pages live on while mapped. Holding views holds
    memory and the deleted file's disk space: `body.release()` them, or drop them, once
    read. Appends never write over bytes already written, so the view shows the record
    as it was read.
    """

    __module__ = "mqstore.engine.record"

    body: memoryview


def decompress_body(body: bytes, sys_flag: int) -> bytes:
    """Undo the client's body compression (sysflag bit 0x1; 5.x type bits 0x700).

    All three of RocketMQ 5.x's codecs (`engine.compression.decompress`). Raises
    `engine.compression.CompressedBodyError` (a ValueError) if the body does not inflate.
    """
    if not sys_flag & SysFlag.COMPRESSED:
        return body
    from mqstore.engine.compression import decompress  # imports this module

    return bytes(decompress(body, sys_flag))


def decode(buf: Buffer, pos: int, *, decompress: bool = False, limit: int = -1) -> DecodedRecord:
    """Decode the message record at `buf[pos:]`.

    A body CRC mismatch does not raise: it is reported as `crc_ok=False` (audits want
    to see such records). Raises RecordError for a BLANK, a bad magic or a record whose
    fields do not add up. With `decompress`, a compressed body is inflated as
    `MessageDecoder.decode(..., deCompressBody=true)` does.
    """
    h = check_record(buf, pos, check_crc=False, read_body=False, limit=limit)
    if h.status is not CheckStatus.OK:
        reason = "BLANK end-of-file record" if h.status is CheckStatus.BLANK else h.reason
        raise RecordError(pos, reason)
    bh = 20 if h.sys_flag & SysFlag.BORNHOST_V6 else 8
    sh = 20 if h.sys_flag & SysFlag.STOREHOST_V6 else 8
    crc = _I32.unpack_from(buf, pos + POS_BODYCRC)[0]
    body = bytes(buf[h.body_pos : h.body_pos + h.body_len])
    crc_ok = body_crc(body) == crc if body else True
    born_p = pos + POS_BORNHOST
    born_addr = bytes(buf[born_p : born_p + bh - 4])
    born_port = _I32.unpack_from(buf, born_p + bh - 4)[0]
    store_p = born_p + bh + 8
    store_addr = bytes(buf[store_p : store_p + sh - 4])
    store_port = _I32.unpack_from(buf, store_p + sh - 4)[0]
    reconsume = _I32.unpack_from(buf, store_p + sh)[0]
    if decompress and crc_ok:
        try:
            body = decompress_body(body, h.sys_flag)
        except ValueError as e:
            raise RecordError(pos, f"compressed body does not inflate: {e}") from None
    return DecodedRecord(
        physical_offset=h.physical_offset,
        size=h.size,
        magic=h.magic,
        body_crc=crc,
        crc_ok=crc_ok,
        queue_id=h.queue_id,
        flag=h.flag,
        queue_offset=h.queue_offset,
        sys_flag=h.sys_flag,
        born_timestamp=h.born_timestamp,
        born_host=format_host(born_addr, born_port),
        store_timestamp=h.store_timestamp,
        store_host=format_host(store_addr, store_port),
        reconsume_times=reconsume,
        prepared_transaction_offset=h.prepared_transaction_offset,
        topic=h.topic,
        body=body,
        properties=h.properties,
        tags=h.properties.get(PROPERTY_TAGS),
        keys=h.properties.get(PROPERTY_KEYS),
        msg_id=make_msg_id(store_addr, store_port, h.physical_offset),
    )
