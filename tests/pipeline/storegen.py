"""Write small commit logs for the pipeline tests, with the engine's codec.

Records are encoded with `engine.record.encode`, placed with `patch_append_fields` and
each full segment is ended with `write_blank`, as RocketMQ's appender does: a record
goes to the next segment when it and an 8-byte BLANK do not fit the space left. The
last segment is written at full size (zeros after the last record), as a pre-allocated
mapped file is.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Collection, Iterable
from pathlib import Path

from mqstore.engine import record as rec
from mqstore.engine.compression import Codec, compressor
from mqstore.engine.filler import write_filler
from mqstore.engine.storedir import FLUSHED_OFFSET_FILE, FLUSHED_OFFSET_MAGIC

BASE_TS_MS = 1_700_000_000_000


def to_v2(enc: rec.EncodedRecord) -> rec.EncodedRecord:
    """The same record in RocketMQ 5's V2 layout (magic 0xDAA320AB, 2-byte topic length)."""
    data = enc.data
    sys_flag = struct.unpack_from(">i", data, rec.POS_SYSFLAG)[0]
    store_host_len = 20 if sys_flag & rec.SysFlag.STOREHOST_V6 else 8
    body_len_pos = enc.store_ts_pos + 8 + store_host_len + 4 + 8
    body_len = struct.unpack_from(">i", data, body_len_pos)[0]
    tl_pos = body_len_pos + 4 + body_len
    topic_len = data[tl_pos]
    out = bytearray(data[:tl_pos] + struct.pack(">h", topic_len) + data[tl_pos + 1 :])
    struct.pack_into(">iI", out, 0, len(out), rec.MESSAGE_MAGIC_CODE_V2)
    return enc._replace(data=bytes(out))


def write_store(
    root: Path,
    messages: Iterable[rec.Message],
    *,
    segment_bytes: int = 64 * 1024,
    ts_step_ms: int = 7,
    v2_every: int = 0,
    stale_after_blank: bool = False,
    fillers: Collection[int] = (),
) -> list[int]:
    """Write `messages` as `root/commitlog/<20 digits>` files; return their physical offsets.

    `v2_every` = n > 0 writes every n-th record in the V2 layout. `stale_after_blank`
    fills the bytes after each BLANK header with a copy of the segment's first record,
    its PHYSICALOFFSET patched to where the copy lies (old pool bytes at their worst).
    The messages whose index is in `fillers` are put as if their producer died after
    reserving: the publisher's `write_filler` takes their place, size and queue offset.
    """
    log = root / "commitlog"
    log.mkdir(parents=True, exist_ok=True)
    seg_start = 0
    buf = bytearray(segment_bytes)
    pos = 0
    ts = BASE_TS_MS
    queue_offsets: dict[tuple[str, int], int] = {}
    offsets = []
    for i, msg in enumerate(messages):
        enc = rec.encode(msg)
        assert enc.status is rec.EncodeStatus.OK, enc.reason
        if v2_every and i % v2_every == v2_every - 1:
            enc = to_v2(enc)
        if len(enc.data) + rec.END_FILE_MIN_BLANK_LENGTH > segment_bytes - pos:
            rec.write_blank(buf, pos, segment_bytes - pos)
            first_size = struct.unpack_from(">i", buf, 0)[0]
            stale_at = pos + rec.END_FILE_MIN_BLANK_LENGTH
            if stale_after_blank and stale_at + first_size <= segment_bytes:
                buf[stale_at : stale_at + first_size] = buf[:first_size]
                struct.pack_into(">q", buf, stale_at + rec.POS_PHYSICALOFFSET, seg_start + stale_at)
            (log / f"{seg_start:020d}").write_bytes(buf)
            seg_start += segment_bytes
            buf = bytearray(segment_bytes)
            pos = 0
        key = (msg.topic, msg.queue_id)
        qo = queue_offsets.get(key, 0)
        queue_offsets[key] = qo + 1
        if i in fillers:
            write_filler(buf, pos, len(enc.data), msg.topic, msg.queue_id, qo, seg_start + pos, ts)
        else:
            rec.patch_append_fields(buf, pos, enc, qo, seg_start + pos, ts)
        offsets.append(seg_start + pos)
        pos += len(enc.data)
        ts += ts_step_ms
    (log / f"{seg_start:020d}").write_bytes(buf)
    return offsets


def mixed_messages(count: int, seed: int = 7) -> list[rec.Message]:
    """Varied records: several topics and queues, tags, keys, odd properties, empty and
    larger bodies, IPv6 hosts now and then, a unicode topic."""
    rng = random.Random(seed)
    topics = ["orders", "payments", "audit-log", "tópico"]
    out = []
    for i in range(count):
        props: dict[str, str] = {"UNIQ_KEY": f"U{i:08d}"}
        if i % 3:
            props["TAGS"] = rng.choice(["a", "b", "tag-c"])
        if i % 4:
            props["KEYS"] = f"k{i} order-{i % 11}"
        if i % 17 == 0:
            props["x\x03y"] = "v=1"
        body_len = rng.choice([0, 1, 12, 13, 50, 300, 2000])
        born = "[::1]:4321" if i % 29 == 0 else f"10.0.{i % 3}.{i % 7}:{5000 + i % 5}"
        out.append(
            rec.Message(
                topic=topics[i % len(topics)],
                body=rng.randbytes(body_len),
                properties=props,
                queue_id=i % 4,
                flag=i % 5,
                born_timestamp=BASE_TS_MS - 1000 + i,
                born_host=born,
                store_host="192.168.1.20:10911" if i % 31 else "[fe80::1]:10911",
                reconsume_times=i % 2,
            )
        )
    return out


def write_flushed_offset(root: Path, offset: int) -> None:
    (root / FLUSHED_OFFSET_FILE).write_bytes(FLUSHED_OFFSET_MAGIC + struct.pack(">q", offset))


def commitlog_store(
    root: Path, messages: Iterable[rec.Message], *, segment_bytes: int = 64 * 1024
) -> list[int]:
    """Append `messages` through `engine.commitlog.CommitLog` (the store's own appender)
    into `root/commitlog`, with a clock that steps 7 ms a record; return their offsets."""
    from mqstore.engine.commitlog import CommitLog

    ticks = iter(range(BASE_TS_MS, BASE_TS_MS + (1 << 40), 7))
    log = CommitLog.open(root / "commitlog", segment_bytes, clock_ms=lambda: next(ticks))
    try:
        offsets = []
        for msg in messages:
            res = log.append(msg)
            assert res.ok, res
            offsets.append(res.wrote_offset)
        log.flush(0)
    finally:
        log.close()
    return offsets


def compressed_messages(count: int) -> list[rec.Message]:
    """Compressed bodies: zlib flagged COMPRESSED alone (4.x's codec), then each of 5.x's
    codecs with its type bits, and one flagged body that does not inflate (kept as
    stored). Stored as they are; every reader gives the original bytes."""
    codecs = [None, *Codec]
    out = []
    for i in range(count):
        body = b"squeeze me %d " % i * 20
        codec = codecs[i % len(codecs)]
        packed = zlib.compress(body) if codec is None else compressor(codec, 3)(body)
        out.append(
            rec.Message(
                topic="zipped",
                body=packed,
                properties={"KEYS": f"z{i}"},
                sys_flag=int(rec.SysFlag.COMPRESSED) | (0 if codec is None else codec.flag),
                queue_id=i % 2,
            )
        )
    out.append(rec.Message(topic="zipped", body=b"not zlib", sys_flag=0x301, queue_id=0))
    return out
