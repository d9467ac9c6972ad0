"""RocketMQ commit-log records: encode (V1), check and decode (V1 and V2).

One record, big-endian, as RocketMQ 4.9.8 writes it (spec §1.2). BH / SH are the
born-host / store-host field widths: 8 for IPv4 (4 address bytes + int port), 20 for
IPv6 (16 + 4), chosen by sysflag bits 0x10 / 0x20. TL is the topic-length width: 1
(signed byte) for V1, 2 (signed short) for V2.

off (v4/v4)  size     field                        written by
0            4        TOTALSIZE                    encoder
4            4        MAGICCODE                    encoder (V1 0xDAA320A7, V2 0xDAA320AB)
8            4        BODYCRC                      encoder: crc32(body) & 0x7FFFFFFF
12           4        QUEUEID                      encoder
16           4        FLAG                         encoder (user flag)
20           8        QUEUEOFFSET                  appender, under the reservation step
28           8        PHYSICALOFFSET               appender, under the reservation step
36           4        SYSFLAG                      encoder (host bits set from the hosts)
40           8        BORNTIMESTAMP                encoder
48           BH       BORNHOST                     encoder
48+BH        8        STORETIMESTAMP               appender, under the reservation step
56+BH        SH       STOREHOSTADDRESS             encoder
56+BH+SH     4        RECONSUMETIMES               encoder
60+BH+SH     8        PREPARED TRANSACTION OFFSET  encoder
68+BH+SH     4        BODY length                  encoder
72+BH+SH     n        BODY                         encoder
..           TL       TOPIC length                 encoder
..           t        TOPIC (UTF-8)                encoder
..           2        PROPERTIES length            encoder
..           p        PROPERTIES (UTF-8)           encoder

A file that cannot hold the next record plus 8 bytes ends with a BLANK record: an
8-byte header (TOTALSIZE = the bytes left in the file, BLANK magic 0xCBD43194). The
bytes after that header are unspecified (stale pool data in RocketMQ's own stores);
readers never look past it.

Encoding happens outside any lock: `encode()` returns the finished record with zero
placeholders for the three fields the appender owns, and `patch_append_fields()` copies
it into place and patches them with one `struct.pack_into` each.
"""

from __future__ import annotations

import enum
import mmap
import struct
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from mqstore.engine.recordcodes import (
    DELAY_LEVEL_MS,
    decode_utf8,
    delivery_time_ms,
    parse_host,
    tags_code,
)

if TYPE_CHECKING:  # the type checker sees the dataclass that engine.frozen's behaves as
    from dataclasses import dataclass, field
else:  # no `dataclasses` (and its `inspect`) at a producer's import
    from mqstore.engine.frozen import dataclass, field

Buffer = bytes | bytearray | memoryview | mmap.mmap  # anything records are read from
WritableBuffer = bytearray | memoryview | mmap.mmap  # anything records are written into

# --- constants (spec §1.1, §1.7, §1.8) --------------------------------------------------

MESSAGE_MAGIC_CODE = 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
BLANK_MAGIC_CODE = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
RECORD_SIZE_SLACK = 64 * 1024  # the encoder's cap is maxMessageSize + 64 KiB
MAX_TOPIC_BYTES_V1 = 127
MAX_PROPERTIES_BYTES = 32767

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"  # MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
KEY_SEPARATOR = " "
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

# Offsets inside a record that do not depend on the host widths.
POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_BODYCRC = 8
POS_QUEUEID = 12
POS_FLAG = 16
POS_QUEUEOFFSET = 20
POS_PHYSICALOFFSET = 28
POS_SYSFLAG = 36
POS_BORNTIMESTAMP = 40
POS_BORNHOST = 48


class SysFlag(enum.IntFlag):
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80


TRANSACTION_MASK = 0xC
# Plain ints for the hot paths: `int & IntFlag` goes through enum's operators (~1 µs).
_BORN_V6: Final = 0x10
_STORE_V6: Final = 0x20
_TX_COMMIT: Final = 0x8
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300
# 0: 4.x's compressed flag without a type, which only knew zlib (`CompressionType.findByValue`)
_COMPRESSION_NAMES: Final = {0: "zlib", COMPRESSION_LZ4: "lz4", COMPRESSION_ZSTD: "zstd",
                             COMPRESSION_ZLIB: "zlib"}  # fmt: skip


def transaction_type(sys_flag: int) -> int:
    """`MessageSysFlag.getTransactionValue`: 0 NOT, 4 PREPARED, 8 COMMIT, 0xC ROLLBACK."""
    return sys_flag & TRANSACTION_MASK


def takes_queue_offset(sys_flag: int) -> bool:
    """NOT and COMMIT messages take a queue offset and go to a consume queue (spec §3.3)."""
    tx = sys_flag & TRANSACTION_MASK
    return tx == 0 or tx == _TX_COMMIT


def record_length(
    body_len: int,
    topic_len: int,
    props_len: int,
    *,
    born_v6: bool = False,
    store_v6: bool = False,
    v2: bool = False,
) -> int:
    """RocketMQ's `calMsgLength`: 91 + body + topic + properties for V1 with IPv4 hosts."""
    bh = 20 if born_v6 else 8
    sh = 20 if store_v6 else 8
    tl = 2 if v2 else 1
    return (
        4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + bh
        + 8
        + sh
        + 4
        + 8
        + 4
        + max(body_len, 0)
        + tl
        + (topic_len + 2 + max(props_len, 0))
    )


# --- small pure functions ------------------------------------------------------------------


def body_crc(body: Buffer) -> int:
    """RocketMQ's `UtilAll.crc32`: CRC-32 (IEEE) of the body, sign bit cleared; 0 if empty."""
    if not body:
        return 0
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_properties(props: Mapping[str, str]) -> bytes:
    """`messageProperties2String`: name 0x01 value 0x02 for each property.

    Every property ends with 0x02, the last one too. That is what RocketMQ 5.2+ writes
    and what every real broker store in `shared/testdata` holds (the 4.2 and 4.9-era
    Java stores and rocketmq-rust), so re-encoding a broker's record reproduces its bytes;
    the 4.9.x form without the last 0x02 parses identically. Entries whose value is
    None are skipped, as RocketMQ skips null values. Callers that take user input
    validate first with `properties_problem()`.
    """
    if not props:
        return b""
    return "".join([f"{k}\x01{v}\x02" for k, v in props.items() if v is not None]).encode("utf-8")


def decode_properties(raw: Buffer) -> dict[str, str]:
    """`string2messageProperties`: RocketMQ's lenient parser.

    Splits on 0x02; keeps a segment only if it is at least 3 characters long and its
    first 0x01 is neither its first nor its last character (so pairs with an empty key
    or an empty value are dropped). Invalid UTF-8 becomes U+FFFD, as in Java
    (`recordcodes.decode_utf8`).
    """
    out: dict[str, str] = {}
    if not raw:
        return out
    text = decode_utf8(bytes(raw))
    for kv in text.split("\x02"):
        if len(kv) >= 3:
            i = kv.find("\x01")
            if 0 < i < len(kv) - 1:
                out[kv[:i]] = kv[i + 1 :]
    return out


def properties_problem(props: Mapping[str, str]) -> str | None:
    """Why these properties cannot be stored exactly, or None when they can."""
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            return f"property {k!r}: names and values must be str"
        if not k:
            return "a property name is empty"
        if not v:
            return f"property {k!r} has an empty value (RocketMQ's decoder would drop it)"
        if "\x01" in k or "\x02" in k or "\x01" in v or "\x02" in v:
            return f"property {k!r} contains a separator character (0x01 or 0x02)"
    return None


# --- encoding ------------------------------------------------------------------------------


_NEW_DICT: Any = field(default_factory=dict)  # `properties`' default: a new dict each


@dataclass(frozen=True, slots=True)
class Message:
    """What a producer supplies. Hosts are `ip:port` strings (IPv6 as `[ip]:port`)."""

    topic: str
    body: bytes
    properties: Mapping[str, str] = _NEW_DICT
    queue_id: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_host: str = "127.0.0.1:10911"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    # A put's delay level (RocketMQ's DELAY): > 0 stores the message in
    # SCHEDULE_TOPIC_XXXX until due (docs/delays.md). Not part of the record's encoding:
    # the put rewrites the message, then encodes that.
    delay_level: int = 0

    # Written out (the fields above, in their order, with their defaults; the class's
    # twin test holds it to what `dataclasses` would make): engine.frozen's shared
    # `__init__` takes ~4x as long, and a batch of Messages makes one per message.
    def __init__(
        self,
        topic: str,
        body: bytes,
        properties: Mapping[str, str] = _NEW_DICT,
        queue_id: int = 0,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: str = "127.0.0.1:0",
        store_host: str = "127.0.0.1:10911",
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        delay_level: int = 0,
    ) -> None:
        set_field = object.__setattr__
        set_field(self, "topic", topic)
        set_field(self, "body", body)
        set_field(self, "properties", {} if properties is _NEW_DICT else properties)
        set_field(self, "queue_id", queue_id)
        set_field(self, "flag", flag)
        set_field(self, "sys_flag", sys_flag)
        set_field(self, "born_timestamp", born_timestamp)
        set_field(self, "born_host", born_host)
        set_field(self, "store_host", store_host)
        set_field(self, "reconsume_times", reconsume_times)
        set_field(self, "prepared_transaction_offset", prepared_transaction_offset)
        set_field(self, "delay_level", delay_level)


class EncodeStatus(enum.Enum):
    OK = "OK"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"


class EncodedRecord(NamedTuple):
    """A finished record with zero placeholders for queue offset, physical offset and
    store timestamp. `status` is not OK -> `data` is empty and `reason` says why."""

    data: bytes
    status: EncodeStatus
    reason: str
    store_ts_pos: int  # where STORETIMESTAMP sits in this record (48 + BH)


_FIXED_PREFIX = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP: 44 bytes
_HOST4 = struct.Struct(">4si")
_HOST6 = struct.Struct(">16si")
QO_PO: Final = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: stamped at append
HEAD_TO_PHYSICAL: Final = struct.Struct(">iIiiiqq")  # TOTALSIZE .. PHYSICALOFFSET: 36 bytes
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
_BLANK = struct.Struct(">iI")
_HEADER_TAIL = struct.Struct(">iqi")  # RECONSUMETIMES, PREPARED OFFSET, BODY length
# The whole fixed part for the common case (IPv4 born and store hosts), packed at once.
_V4V4 = struct.Struct(">iIiiiqqiq4siq4siiqi")


def store_timestamp_pos(sys_flag: int) -> int:
    """Where STORETIMESTAMP starts in a record with this SYSFLAG: after BORNHOST, whose
    width (8 or 20) the BORNHOST_V6 bit chooses (the table in the module docstring)."""
    return POS_BORNHOST + (20 if sys_flag & _BORN_V6 else 8)


def peek_store_timestamp(buf: Buffer, pos: int = 0) -> int | None:
    """The STORETIMESTAMP (ms) of the message record at `buf[pos:]`, read from its fixed
    header only (no CRC, no body): for callers that read a file's first ~100 bytes to
    date it (metrics, the Spark source). None when there is no message record there (a
    BLANK, zeros, another magic), too few bytes, or a timestamp that is not positive."""
    if pos + POS_BORNHOST > len(buf):
        return None
    _total, magic = _BLANK.unpack_from(buf, pos + POS_TOTALSIZE)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        return None
    ts_pos = pos + store_timestamp_pos(_I32.unpack_from(buf, pos + POS_SYSFLAG)[0])
    if ts_pos + 8 > len(buf):
        return None
    ts = int(_I64.unpack_from(buf, ts_pos)[0])
    return ts if ts > 0 else None


def _illegal(reason: str) -> EncodedRecord:
    return EncodedRecord(b"", EncodeStatus.MESSAGE_ILLEGAL, reason, 0)


def encode(msg: Message, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> EncodedRecord:
    """Encode one V1 record with RocketMQ's checks (spec §1.8, §7.1).

    Pure and lock-free: call it before reserving space. Cost O(body) for the CRC.
    Checks, in order: topic (non-empty, at most 127 UTF-8 bytes: RocketMQ checks chars
    but stores a signed byte of UTF-8 length, so bytes are what matters), properties that
    would not read back exactly (MESSAGE_ILLEGAL), properties over 32767 UTF-8 bytes
    (PROPERTIES_SIZE_EXCEEDED), body over `max_message_size`, record over
    `max_message_size + 64 KiB`, hosts and integer ranges (MESSAGE_ILLEGAL).
    """
    topic_b = msg.topic.encode("utf-8") if isinstance(msg.topic, str) else b""
    if not topic_b:
        return _illegal("topic must be a non-empty string")
    if len(topic_b) > MAX_TOPIC_BYTES_V1:
        return _illegal(f"topic is {len(topic_b)} UTF-8 bytes; at most 127 are allowed")
    problem = properties_problem(msg.properties)
    if problem is not None:
        return _illegal(problem)
    props_b = encode_properties(msg.properties)
    if len(props_b) > MAX_PROPERTIES_BYTES:
        return EncodedRecord(
            b"",
            EncodeStatus.PROPERTIES_SIZE_EXCEEDED,
            f"properties are {len(props_b)} UTF-8 bytes; at most 32767 are allowed",
            0,
        )
    body = msg.body
    if not isinstance(body, bytes | bytearray | memoryview):
        return _illegal("body must be bytes")
    if len(body) > max_message_size:
        return _illegal(f"body is {len(body)} bytes; maxMessageSize is {max_message_size}")
    try:
        born_addr, born_port, born_v6 = parse_host(msg.born_host)
        store_addr, store_port, store_v6 = parse_host(msg.store_host)
    except ValueError as e:
        return _illegal(str(e))
    # Plain ints: IntFlag's ~ keeps only the bits it names, which dropped the
    # compression-type bits (0x700) and every higher bit of the caller's sys flag.
    sys_flag = int(msg.sys_flag) & ~(_BORN_V6 | _STORE_V6)
    if born_v6:
        sys_flag |= _BORN_V6
    if store_v6:
        sys_flag |= _STORE_V6
    total = record_length(len(body), len(topic_b), len(props_b), born_v6=born_v6, store_v6=store_v6)
    if total > max_message_size + RECORD_SIZE_SLACK:
        return _illegal(f"record is {total} bytes; the cap is maxMessageSize + 64 KiB")
    try:
        if not born_v6 and not store_v6:
            head = _V4V4.pack(
                total, MESSAGE_MAGIC_CODE, body_crc(body), msg.queue_id, msg.flag, 0, 0,
                sys_flag, msg.born_timestamp, born_addr, born_port, 0, store_addr, store_port,
                msg.reconsume_times, msg.prepared_transaction_offset, len(body),
            )  # fmt: skip
        else:
            born = (_HOST6 if born_v6 else _HOST4).pack(born_addr, born_port)
            store = (_HOST6 if store_v6 else _HOST4).pack(store_addr, store_port)
            head = b"".join((
                _FIXED_PREFIX.pack(
                    total, MESSAGE_MAGIC_CODE, body_crc(body), msg.queue_id, msg.flag, 0, 0,
                    sys_flag, msg.born_timestamp,
                ),
                born, b"\0" * 8, store,
                _HEADER_TAIL.pack(msg.reconsume_times, msg.prepared_transaction_offset, len(body)),
            ))  # fmt: skip
    except struct.error as e:
        return _illegal(f"a numeric field is out of range: {e}")
    if msg.queue_id < 0:
        return _illegal(f"queue id {msg.queue_id} is negative")
    data = b"".join((head, body, bytes((len(topic_b),)), topic_b, _I16.pack(len(props_b)), props_b))
    return EncodedRecord(data, EncodeStatus.OK, "", 48 + (20 if born_v6 else 8))


def patch_append_fields(
    buf: WritableBuffer,
    pos: int,
    rec: EncodedRecord,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
) -> None:
    """Copy `rec` to `buf[pos:]` and fill in the three fields the appender owns."""
    data = rec.data
    buf[pos : pos + len(data)] = data
    QO_PO.pack_into(buf, pos + POS_QUEUEOFFSET, queue_offset, physical_offset)
    _I64.pack_into(buf, pos + rec.store_ts_pos, store_timestamp)


def write_blank(buf: WritableBuffer, pos: int, max_blank: int) -> None:
    """Write the 8-byte BLANK header that ends a segment: TOTALSIZE = max_blank."""
    _BLANK.pack_into(buf, pos, max_blank, BLANK_MAGIC_CODE)


# --- checking (recovery, dispatch) ---------------------------------------------------------


class CheckStatus(enum.Enum):
    OK = "OK"
    BLANK = "BLANK"
    CORRUPT = "CORRUPT"


class RecordHeader(NamedTuple):
    """What dispatch and recovery need from a record, without copying its body.

    status OK: `size` > 0 is the record length. BLANK: `size` is the blank's TOTALSIZE
    (the rest of the segment). CORRUPT: `size` is -1, or TOTALSIZE when only the length
    check failed (RocketMQ's "[BUG]" case); `reason` says what was wrong.
    """

    status: CheckStatus
    size: int
    reason: str
    magic: int = 0
    physical_offset: int = 0
    queue_id: int = 0
    queue_offset: int = 0
    sys_flag: int = 0
    flag: int = 0
    born_timestamp: int = 0
    store_timestamp: int = 0
    topic: str = ""
    tags_code: int = 0
    keys: str | None = None
    uniq_key: str | None = None
    properties: dict[str, str] = {}  # noqa: RUF012 - NamedTuple default, never mutated
    body_crc_ok: bool = True
    body_pos: int = 0  # offset of the body inside the buffer
    body_len: int = 0
    prepared_transaction_offset: int = 0


_HEAD36 = struct.Struct(">iIiiiqqi")  # TOTALSIZE .. SYSFLAG
_MIN_RECORD = record_length(0, 0, 0)


def _corrupt(reason: str, size: int = -1) -> RecordHeader:
    return RecordHeader(CheckStatus.CORRUPT, size, reason)


def check_record(
    buf: Buffer,
    pos: int,
    *,
    check_crc: bool = True,
    read_body: bool = True,
    limit: int = -1,
    delay_ms: tuple[int, ...] = DELAY_LEVEL_MS,
) -> RecordHeader:
    """RocketMQ's `checkMessageAndReturnSize` at `buf[pos:]`; never raises.

    `delay_ms` is the store's delay table (`message_delay_level` in ms per level): a
    schedule-topic record's tags code is its delivery time by it.

    `limit` bounds the readable bytes (default: the buffer's length); a record that would
    run past it is CORRUPT, as 5.x rules. A zero-filled region reads as an illegal magic:
    that is how the end of written data in the last segment is found.
    """
    end = len(buf) if limit < 0 else min(limit, len(buf))
    if pos < 0 or pos + 8 > end:
        return _corrupt("fewer than 8 bytes left")
    total, magic = _BLANK.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return RecordHeader(CheckStatus.BLANK, total, "", magic)
    if magic == MESSAGE_MAGIC_CODE:
        tl = 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        tl = 2
    else:
        return _corrupt(f"illegal magic code 0x{magic:08x}")
    if total < _MIN_RECORD or pos + total > end:
        return _corrupt(f"TOTALSIZE {total} does not fit the {end - pos} readable bytes")
    try:
        _t, _m, crc, queue_id, flag, queue_offset, phys, sys_flag = _HEAD36.unpack_from(buf, pos)
        born_ts = _I64.unpack_from(buf, pos + POS_BORNTIMESTAMP)[0]
        bh = 20 if sys_flag & _BORN_V6 else 8
        sh = 20 if sys_flag & _STORE_V6 else 8
        p = pos + 48 + bh
        store_ts = _I64.unpack_from(buf, p)[0]
        p += 8 + sh
        _reconsume, prepared, body_len = _HEADER_TAIL.unpack_from(buf, p)
        p += 16
        body_pos = p
        crc_ok = True
        if body_len > 0:
            if body_pos + body_len > pos + total:
                return _corrupt(f"body length {body_len} runs past the record")
            if read_body and check_crc:
                crc_ok = (zlib.crc32(buf[body_pos : body_pos + body_len]) & 0x7FFFFFFF) == crc
                if not crc_ok:
                    return _corrupt("body CRC mismatch")
            p += body_len
        elif body_len < 0:
            body_len = 0
        topic_len = _I8.unpack_from(buf, p)[0] if tl == 1 else _I16.unpack_from(buf, p)[0]
        p += tl
        topic = decode_utf8(bytes(buf[p : p + max(topic_len, 0)]))
        p += max(topic_len, 0)
        props_len = _I16.unpack_from(buf, p)[0]
        p += 2
        props = decode_properties(buf[p : p + props_len]) if props_len > 0 else {}
    except (struct.error, IndexError, ValueError) as e:
        return _corrupt(f"record fields run past the readable bytes: {e}")
    expected = record_length(
        body_len,
        max(topic_len, 0),
        props_len,
        born_v6=bh == 20,
        store_v6=sh == 20,
        v2=tl == 2,
    )
    if expected != total:
        return _corrupt(f"TOTALSIZE {total} but the fields add up to {expected}", total)
    if props_len > 0 and buf[pos + total - 1] == 0:
        # Properties end with 0x02 (or, in 4.9.x's form, with a value's last character),
        # never with a zero byte: a record whose end is missing (a write torn at a page
        # boundary by a crash leaves zeros) is not taken for a message.
        return _corrupt("the record ends in zeros where its properties end (a torn write)", total)
    tags = props.get(PROPERTY_TAGS)
    code = tags_code(tags)
    if topic == SCHEDULE_TOPIC and PROPERTY_DELAY in props:
        try:
            level = int(props[PROPERTY_DELAY])
        except ValueError:
            level = 0
        if level > 0:
            code = delivery_time_ms(store_ts, level, delay_ms)
    return RecordHeader(
        CheckStatus.OK, total, "", magic, phys, queue_id, queue_offset, sys_flag, flag,
        born_ts, store_ts, topic, code, props.get(PROPERTY_KEYS), props.get(PROPERTY_UNIQ_KEY),
        props, crc_ok, body_pos, body_len, prepared,
    )  # fmt: skip


# --- full decoding (dump, reads, pipeline) -------------------------------------------------


class RecordError(ValueError):
    """The bytes at an offset are not a valid message record."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"no valid record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


# The decoded side (`RecordFields`, `DecodedRecord`, `RecordView`, `decode`,
# `decompress_body`) lives in `engine.record_decode` and is this module's on first use:
# a producer's import encodes, and its three dataclasses' decoration cost ~20M
# instructions per process start (bench/results/client_start.md). The package imports
# them from `engine.record_decode` (their types; no import cycle); `mqstore.RecordView`
# and the rest, and older code's `from mqstore.engine.record import ...`, come here.
_DECODE_SIDE: Final = frozenset(
    ("RecordFields", "DecodedRecord", "RecordView", "decode", "decompress_body")
)


def __getattr__(name: str) -> Any:
    if name not in _DECODE_SIDE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from mqstore.engine import record_decode

    value = getattr(record_decode, name)
    globals()[name] = value  # once: later lookups do not come here
    return value
