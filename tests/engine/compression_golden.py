"""Builds the golden compressed records (`tests/data/golden/record-compressed-*.bin`) and
their original body (`tests/data/golden/body-16k.json`).

One record per codec (ZLIB, LZ4, ZSTD at level 5, RocketMQ's default level): a 16 KiB
JSON document compressed as the C put compresses it (`engine.compression.compressor`),
the sysFlag RocketMQ 5.x's producer sets (0x1 | the codec's type bits), every other field
fixed. RocketMQ's decoder (`MessageDecoder.decode(..., deCompressBody=true)`, through
`CompressorFactory.getCompressor(MessageSysFlag.getCompressionType(sysFlag))`) inflates
each body to `body-16k.json`, byte for byte (checked by hand with RocketMQ's own
compressor classes compiled against Spark's lz4-java and zstd-jni: tests/data/README.md).
Run as a module to rewrite them after a deliberate change:

    python -m tests.engine.compression_golden
"""

from __future__ import annotations

import json
from pathlib import Path

from mqstore.engine import compression, record
from mqstore.engine.compression import Codec
from mqstore.engine.record import Message

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
BODY = GOLDEN / "body-16k.json"
LEVEL = 5
BODY_BYTES = 16 * 1024
QUEUE_OFFSET, PHYSICAL_OFFSET, STORE_TS = 7, 4096, 1_700_000_000_500


def record_path(codec: Codec) -> Path:
    return GOLDEN / f"record-compressed-{codec.name.lower()}.bin"


def golden_body() -> bytes:
    """A 16 KiB JSON array of order events, as a service would log them (deterministic)."""
    rows = []
    i = 0
    while True:
        rows.append({
            "order_id": 100_000 + i, "customer": f"customer-{i * 7919 % 503:04d}",
            "status": ("NEW", "PAID", "SHIPPED", "DELIVERED")[i % 4],
            "amount_cents": i * 137 % 10_000, "currency": "EUR",
            "items": [{"sku": f"SKU-{(i + j) % 89:03d}", "qty": 1 + j} for j in range(i % 3 + 1)],
        })  # fmt: skip
        doc = json.dumps(rows, separators=(",", ":")).encode()
        if len(doc) > BODY_BYTES - 300:
            return doc + b" " * (BODY_BYTES - len(doc))
        i += 1


def golden_message(codec: Codec, packed: bytes) -> Message:
    return Message(
        "GoldenTopic", packed, {"TAGS": "TagZ", "KEYS": f"order-{codec.name.lower()}"},
        queue_id=1, sys_flag=codec.flag, born_timestamp=1_700_000_000_000,
        born_host="192.168.0.10:50000", store_host="192.168.0.1:10911",
    )  # fmt: skip


def record_of(codec: Codec, packed: bytes) -> bytes:
    """The record of `packed` (the body as stored) with the golden fixed fields."""
    enc = record.encode(golden_message(codec, packed))
    assert enc.status is record.EncodeStatus.OK, enc.reason
    out = bytearray(len(enc.data))
    record.patch_append_fields(out, 0, enc, QUEUE_OFFSET, PHYSICAL_OFFSET, STORE_TS)
    return bytes(out)


def build_body(codec: Codec) -> bytes:
    """The golden body as the C put compresses it with `codec` at LEVEL."""
    return compression.compressor(codec, LEVEL)(golden_body())


def build(codec: Codec) -> bytes:
    return record_of(codec, build_body(codec))


if __name__ == "__main__":
    BODY.write_bytes(golden_body())
    for c in Codec:
        record_path(c).write_bytes(build(c))
        print(record_path(c).name, record_path(c).stat().st_size)
