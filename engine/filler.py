"""Filler records: what the publisher writes over space a dead producer reserved.

A producer killed after reserving space leaves bytes that may be half a record. The
publisher (see `ipc.commit`) overwrites the whole reservation with a valid RocketMQ V1
record of the same length that takes over the dead put's topic, queue id and queue
offset, so consume queues stay dense and RocketMQ's own decoder still reads the log:

| field         | value                                                    |
| ------------- | -------------------------------------------------------- |
| FLAG          | `FILLER_FLAG` (0x4D514649, "MQFI")                        |
| BORNTIMESTAMP | 0                                                        |
| properties    | `MQSTORE_FILLER=1` when it fits, else none               |
| body          | zeros, as long as needed to make the reserved length     |

A reservation with no queue row (the BLANK that ends a segment) is refilled as a BLANK;
one for a record that takes no queue offset gets a filler of `INTERNAL_TOPIC`, queue 0.

A filler is not a message. `is_filler` is the one rule that says so, and everything that
reads the log applies it: the dispatcher and recovery (a pre-blank unit, no index keys),
`StoreReader` and the client reads, `mqstore check` (counted apart), the Spark pipeline
and its plain reader (no row). It looks only at fields a record header carries, so the
dispatcher, which does not read bodies, decides as the readers do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

from mqstore.engine import record
from mqstore.engine.record import EncodedRecord, EncodeStatus, Message, WritableBuffer
from mqstore.engine.recordcodes import parse_host

FILLER_FLAG: Final = 0x4D514649
FILLER_PROPERTY: Final = "MQSTORE_FILLER"
INTERNAL_TOPIC: Final = "MQSTORE_FILLER"  # for a dead put that took no queue offset
_MARKER: Final = {FILLER_PROPERTY: "1"}


class FillerFields(Protocol):
    """What `is_filler` reads: `record.RecordHeader` and `record.DecodedRecord` have it."""

    @property
    def flag(self) -> int: ...

    @property
    def born_timestamp(self) -> int: ...

    @property
    def properties(self) -> Mapping[str, str]: ...


def is_filler(rec: FillerFields) -> bool:
    """True for a filler: the filler's flag, born time 0, and as properties exactly the
    marker or nothing (the marker did not fit). O(1) but for comparing the properties.

    A producer's record never has born time 0 (the client stamps its clock), so no
    message is taken for a filler; a RocketMQ broker's log has none of these records.
    """
    if rec.flag != FILLER_FLAG or rec.born_timestamp != 0:
        return False
    return not rec.properties or rec.properties == _MARKER


def filler_record(
    size: int, topic: str, queue_id: int, store_host: str = "127.0.0.1:10911"
) -> EncodedRecord:
    """An encoded filler of exactly `size` bytes (placeholders for the appender fields).

    Raises ValueError when even an empty-body record of this topic does not fit.
    """
    tlen = len(topic.encode("utf-8"))
    store_v6 = parse_host(store_host)[2]
    for props in (_MARKER, {}):
        plen = len(record.encode_properties(props))
        body_len = size - record.record_length(0, tlen, plen, store_v6=store_v6)
        if body_len >= 0:
            msg = Message(
                topic, bytes(body_len), props, queue_id=queue_id, flag=FILLER_FLAG,
                store_host=store_host,
            )  # fmt: skip
            rec = record.encode(msg, max_message_size=max(size, record.DEFAULT_MAX_MESSAGE_SIZE))
            if rec.status is EncodeStatus.OK and len(rec.data) == size:
                return rec
    raise ValueError(f"no filler record of topic {topic!r} fits {size} bytes")


def write_filler(
    buf: WritableBuffer,
    pos: int,
    size: int,
    topic: str | None,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    store_host: str = "127.0.0.1:10911",
) -> None:
    """Overwrite `buf[pos:pos+size]` with a filler (topic None: a BLANK). Called by the
    publisher (`ipc.commit`) on a dead producer's reservation."""
    if topic is None:
        record.write_blank(buf, pos, size)
        return
    rec = filler_record(size, topic, queue_id, store_host)
    record.patch_append_fields(buf, pos, rec, queue_offset, physical_offset, store_timestamp)
