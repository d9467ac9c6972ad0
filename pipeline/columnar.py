"""Turn runs of commit-log records into Arrow record batches, in bulk.

Decoding row by row in Python (`engine.record.decode`) costs several microseconds a
record. Here a run of records whose start positions are known (`pipeline.scan` walks
the chain) is decoded with a fixed number of numpy / Arrow operations per batch:

- the fixed 88-byte header of every record is gathered into one numpy structured array
  (the V1, IPv4/IPv4 layout below, which is what brokers write);
- the variable parts (body, topic, properties) become Arrow binary-view arrays that
  point into the read buffer, then one C++ cast each makes them binary / string columns;
- properties are split with Arrow's string kernels into a `map<string,string>` that
  follows RocketMQ's lenient parser (a pair with an empty name or value is dropped);
- hosts are formatted once per distinct address, message ids with a hex lookup table.

The only per-record Python work left is the body CRC (`zlib.crc32` over a memoryview
slice, via `map`), and it runs after the DataFrame's own conditions (`RecordFilter`), on
the rows kept. Fillers (`engine.filler`) are not rows: the few records carrying the
filler flag are put to the engine's rule one by one.

Records that do not fit the fast layout (V2 magic, IPv6 hosts) or whose text is not
UTF-8 go through the engine's own `decode()` for their batch: slower, same rows.

V1 header with IPv4 hosts (spec §1.2), as gathered here:

off  size  field
0    4     TOTALSIZE
4    4     MAGICCODE
8    4     BODYCRC
12   4     QUEUEID
16   4     FLAG
20   8     QUEUEOFFSET
28   8     PHYSICALOFFSET
36   4     SYSFLAG
40   8     BORNTIMESTAMP
48   4+4   BORNHOST (address, port)
56   8     STORETIMESTAMP
64   4+4   STOREHOSTADDRESS (address, port)
72   4     RECONSUMETIMES
76   8     PREPARED TRANSACTION OFFSET
84   4     BODY length
88   n     BODY, then TOPIC length (1), TOPIC, PROPERTIES length (2), PROPERTIES

Who may call: `pipeline.scan` (executors). Nothing here touches files.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from mqstore.engine import record as rec
from mqstore.engine.filler import FILLER_FLAG, is_filler
from mqstore.pipeline.schema import ARROW_SCHEMA, COLUMN_NAMES, PROPERTIES_TYPE

FAST_HEADER_BYTES = 88
MIN_RECORD_BYTES = rec.record_length(0, 0, 0)  # 91
HOST_V6_MASK = int(rec.SysFlag.BORNHOST_V6 | rec.SysFlag.STOREHOST_V6)
CRC_MISMATCH = "body CRC mismatch"

HEADER_DTYPE = np.dtype(
    [
        ("size", ">i4"),
        ("magic", ">u4"),
        ("body_crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("physical_offset", ">i8"),
        ("sys_flag", ">i4"),
        ("born_timestamp", ">i8"),
        ("born_addr", ">u4"),
        ("born_port", ">i4"),
        ("store_timestamp", ">i8"),
        ("store_addr", ">u4"),
        ("store_port", ">i4"),
        ("reconsume_times", ">i4"),
        ("prepared_transaction_offset", ">i8"),
        ("body_len", ">i4"),
    ]
)
assert HEADER_DTYPE.itemsize == FAST_HEADER_BYTES

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_HEX = np.frombuffer(b"".join(b"%02X" % i for i in range(256)), dtype=np.uint8).reshape(256, 2)
_AR12 = np.arange(12, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which records a DataFrame holds: the `topic`, `fromStoreTimestamp` and
    `toStoreTimestamp` options of `pipeline.source`, ANDed; None means no condition.

    Bounds are inclusive, and `ts_min <= ts_max` when both are set (the source refuses
    the options otherwise). It is fixed when the DataFrame is loaded, so every query on
    that DataFrame reads the same records.
    """

    topic: str | None = None
    ts_min: int | None = None
    ts_max: int | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.topic, self.ts_min, self.ts_max))

    def overlaps_time(self, first_ms: int | None, last_ms: int | None) -> bool:
        """Can a record stored in [first_ms, last_ms] pass? None bounds are open."""
        if self.ts_max is not None and first_ms is not None and first_ms > self.ts_max:
            return False
        return not (self.ts_min is not None and last_ms is not None and last_ms < self.ts_min)

    def matches(self, topic: str, store_timestamp: int) -> bool:
        """The per-record form, for the engine-decoded path."""
        if self.topic is not None and topic != self.topic:
            return False
        if self.ts_min is not None and store_timestamp < self.ts_min:
            return False
        return not (self.ts_max is not None and store_timestamp > self.ts_max)

    def time_mask(self, store_ts: npt.NDArray[Any]) -> BoolArray:
        mask = np.ones(len(store_ts), dtype=np.bool_)
        if self.ts_min is not None:
            mask &= store_ts >= self.ts_min
        if self.ts_max is not None:
            mask &= store_ts <= self.ts_max
        return mask


NO_FILTER = RecordFilter()


# --- gathering -------------------------------------------------------------------------------


def as_bytes_array(buf: bytes) -> npt.NDArray[np.uint8]:
    return np.frombuffer(buf, dtype=np.uint8)


def gather_headers(nb: npt.NDArray[np.uint8], starts: IntArray) -> npt.NDArray[Any]:
    """The 88-byte fixed header of each record start, as a structured array (one copy).

    Every start must have 88 bytes after it in the buffer (the walk guarantees 91).
    """
    if len(starts) == 0 or len(nb) < FAST_HEADER_BYTES:
        return np.zeros(0, dtype=HEADER_DTYPE)
    windows = np.lib.stride_tricks.as_strided(
        nb, shape=(len(nb) - FAST_HEADER_BYTES + 1, FAST_HEADER_BYTES), strides=(1, 1)
    )
    rows = windows[starts]
    return rows.view(HEADER_DTYPE).reshape(len(starts))


def filler_mask(buf: bytes, starts: IntArray, h: npt.NDArray[Any]) -> BoolArray:
    """Which records are fillers (`engine.filler.is_filler`). Their flag picks the few
    candidates in bulk; the engine's rule decides each one from its header."""
    mask: BoolArray = h["flag"] == FILLER_FLAG
    for i in np.nonzero(mask)[0].tolist():
        header = rec.check_record(buf, int(starts[i]), check_crc=False, read_body=False)
        mask[i] = is_filler(header)
    return mask


def _signed_byte(nb: npt.NDArray[np.uint8], pos: IntArray) -> IntArray:
    return np.take(nb, pos, mode="clip").astype(np.int8).astype(np.int64)


def _signed_short(nb: npt.NDArray[np.uint8], pos: IntArray) -> IntArray:
    hi = np.take(nb, pos, mode="clip").astype(np.int64)
    lo = np.take(nb, pos + 1, mode="clip").astype(np.int64)
    v = (hi << 8) | lo
    return np.where(v >= 0x8000, v - 0x10000, v)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the variable parts of each fast-layout record sit in the buffer."""

    body_pos: IntArray
    body_len: IntArray
    topic_pos: IntArray
    topic_len: IntArray
    props_pos: IntArray
    props_len: IntArray

    def take(self, sel: IntArray) -> Layout:
        return Layout(
            self.body_pos[sel], self.body_len[sel], self.topic_pos[sel],
            self.topic_len[sel], self.props_pos[sel], self.props_len[sel],
        )  # fmt: skip


def fast_layout(nb: npt.NDArray[np.uint8], starts: IntArray, h: npt.NDArray[Any]) -> Layout:
    body_len = np.maximum(h["body_len"].astype(np.int64), 0)
    body_pos = starts + FAST_HEADER_BYTES
    tl_pos = body_pos + body_len
    topic_len = np.maximum(_signed_byte(nb, tl_pos), 0)
    topic_pos = tl_pos + 1
    pl_pos = topic_pos + topic_len
    props_len = np.maximum(_signed_short(nb, pl_pos), 0)
    return Layout(body_pos, body_len, topic_pos, topic_len, pl_pos + 2, props_len)


def check_structure(
    buf: bytes, nb: npt.NDArray[np.uint8], base: int, starts: IntArray, limit: int
) -> tuple[int, npt.NDArray[Any]]:
    """How many leading records are sound, and the gathered headers of all of them.

    Sound means what `engine.record.check_record` (without the CRC) accepts, plus the
    record's own PHYSICALOFFSET equal to where it lies (`base` + its position). The walk
    has already checked magic, TOTALSIZE range and that the record fits before `limit`.
    """
    h = gather_headers(nb, starts)
    if len(starts) == 0:
        return 0, h
    fast = (h["magic"] == rec.MESSAGE_MAGIC_CODE) & ((h["sys_flag"] & HOST_V6_MASK) == 0)
    ok = h["physical_offset"] == starts + base
    lay = fast_layout(nb, starts, h)
    size = h["size"].astype(np.int64)
    expected = MIN_RECORD_BYTES + lay.body_len + lay.topic_len + lay.props_len
    ok &= ~fast | ((expected == size) & (lay.body_pos + lay.body_len + 1 <= starts + size))
    # a torn end leaves zeros where the properties end (check_record refuses it too)
    last = nb[np.minimum(starts + size - 1, len(nb) - 1)]
    ok &= ~fast | (lay.props_len == 0) | (last != 0)
    slow_idx = np.nonzero(~fast & ok)[0]
    for i in slow_idx.tolist():
        header = rec.check_record(
            buf, int(starts[i]), check_crc=False, read_body=False, limit=limit
        )
        if header.status is not rec.CheckStatus.OK:
            ok[i] = False
    bad = np.nonzero(~ok)[0]
    return (int(bad[0]) if len(bad) else len(starts)), h


# --- building columns ----------------------------------------------------------------------


def _view_buffer(nb: npt.NDArray[np.uint8], pos: IntArray, length: IntArray) -> pa.Buffer:
    """Arrow binary-view structs (16 bytes each) for the slices buf[pos:pos+length]."""
    n = len(pos)
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = length.astype("<i4").view(np.uint8).reshape(n, 4)
    idx = np.minimum(pos[:, None] + _AR12, len(nb) - 1)
    head = nb[idx]
    head[_AR12[None, :] >= length[:, None]] = 0
    views[:, 4:16] = head
    long_ = length > 12
    if long_.any():
        views[long_, 8:12] = 0  # buffer index 0
        views[long_, 12:16] = pos[long_].astype("<i4").view(np.uint8).reshape(-1, 4)
    return pa.py_buffer(views)


def slices_to_array(
    data: pa.Buffer, nb: npt.NDArray[np.uint8], pos: IntArray, length: IntArray, kind: pa.DataType
) -> pa.Array:
    """A binary or string array of buf[pos:pos+length] per row; raises ArrowInvalid on bad UTF-8."""
    n = len(pos)
    views = pa.Array.from_buffers(pa.binary_view(), n, [None, _view_buffer(nb, pos, length), data])
    return views.cast(kind)


def properties_map(props: pa.Array) -> pa.Array:
    """RocketMQ's `string2messageProperties` over a whole string column, as a map column."""
    n = len(props)
    pairs = pc.split_pattern(props, pattern=rec.PROPERTY_SEPARATOR)
    parent = np.asarray(pc.list_parent_indices(pairs))
    kv = pc.split_pattern(pairs.flatten(), pattern=rec.NAME_VALUE_SEPARATOR, max_splits=1)
    two = np.asarray(pc.equal(pc.list_value_length(kv), 2))
    kv = kv.filter(pa.array(two))
    parent = parent[two]
    keys = pc.list_element(kv, 0)
    values = pc.list_element(kv, 1)
    keep = (np.asarray(pc.binary_length(keys)) > 0) & (np.asarray(pc.binary_length(values)) > 0)
    counts = np.bincount(parent[keep], minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    mask = pa.array(keep)
    out = pa.MapArray.from_arrays(
        pa.array(offsets), keys.filter(mask), values.filter(mask), type=PROPERTIES_TYPE
    )
    return out


def _hosts(addr: npt.NDArray[Any], port: npt.NDArray[Any]) -> pa.Array:
    key = (addr.astype(np.uint64) << np.uint64(32)) | port.astype(np.uint32).astype(np.uint64)
    uniq, inverse = np.unique(key, return_inverse=True)
    names = []
    for k in uniq.tolist():
        p = k & 0xFFFFFFFF
        names.append(rec.format_host((k >> 32).to_bytes(4, "big"), p - (1 << 32) if p >> 31 else p))
    return pa.array(names, pa.string()).take(pa.array(inverse.reshape(-1)))


def _msg_ids(h: npt.NDArray[Any]) -> pa.Array:
    n = len(h)
    raw = h.view(np.uint8).reshape(n, FAST_HEADER_BYTES)
    ident = np.concatenate([raw[:, 64:72], raw[:, 28:36]], axis=1)  # store addr, port, offset
    chars = _HEX[ident].reshape(n * 32)
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))


def _ints(a: npt.NDArray[Any], dtype: type[np.integer[Any]]) -> pa.Array:
    return pa.array(a.astype(dtype))


def _crc_ok(buf: bytes, pos: IntArray, length: IntArray, stored: npt.NDArray[Any]) -> BoolArray:
    view = memoryview(buf)
    ends = pos + length
    crcs = np.fromiter(
        map(zlib.crc32, map(view.__getitem__, map(slice, pos.tolist(), ends.tolist()))),
        dtype=np.int64,
        count=len(pos),
    )
    ok: BoolArray = ((crcs & 0x7FFFFFFF) == stored.astype(np.int64)) | (length == 0)
    return ok


def build_fast(
    buf: bytes,
    data: pa.Buffer,
    nb: npt.NDArray[np.uint8],
    starts: IntArray,
    h: npt.NDArray[Any],
    flt: RecordFilter,
    include_corrupt: bool,
) -> pa.RecordBatch:
    """Rows for sound fast-layout records; raises ArrowInvalid when some text is not UTF-8."""
    lay = fast_layout(nb, starts, h)
    keep = flt.time_mask(h["store_timestamp"]) & ~filler_mask(buf, starts, h)
    topic = slices_to_array(data, nb, lay.topic_pos, lay.topic_len, pa.string())
    if flt.topic is not None:
        keep &= np.asarray(pc.equal(topic, pa.scalar(flt.topic, pa.string())))
    if not keep.all():
        sel = np.nonzero(keep)[0]
        starts, h = starts[sel], h[sel]
        topic = topic.take(pa.array(sel))
        lay = lay.take(sel)
    crc_ok = _crc_ok(buf, lay.body_pos, lay.body_len, h["body_crc"])
    if not include_corrupt and not crc_ok.all():
        sel = np.nonzero(crc_ok)[0]
        starts, h, crc_ok = starts[sel], h[sel], crc_ok[sel]
        topic = topic.take(pa.array(sel))
        lay = lay.take(sel)
    n = len(starts)
    body = slices_to_array(data, nb, lay.body_pos, lay.body_len, pa.binary())
    props = properties_map(slices_to_array(data, nb, lay.props_pos, lay.props_len, pa.string()))
    if crc_ok.all():
        problem = pa.nulls(n, pa.string())
    else:
        problem = pa.array([None if ok else CRC_MISMATCH for ok in crc_ok.tolist()], pa.string())
    columns: dict[str, pa.Array] = {
        "physical_offset": _ints(h["physical_offset"], np.int64),
        "size": _ints(h["size"], np.int32),
        "magic": _ints(h["magic"], np.int64),
        "body_crc": _ints(h["body_crc"], np.int32),
        "crc_ok": pa.array(crc_ok),
        "queue_id": _ints(h["queue_id"], np.int32),
        "flag": _ints(h["flag"], np.int32),
        "queue_offset": _ints(h["queue_offset"], np.int64),
        "sys_flag": _ints(h["sys_flag"], np.int32),
        "born_timestamp": _ints(h["born_timestamp"], np.int64),
        "born_host": _hosts(h["born_addr"], h["born_port"]),
        "store_timestamp": _ints(h["store_timestamp"], np.int64),
        "store_host": _hosts(h["store_addr"], h["store_port"]),
        "reconsume_times": _ints(h["reconsume_times"], np.int32),
        "prepared_transaction_offset": _ints(h["prepared_transaction_offset"], np.int64),
        "topic": topic,
        "body": body,
        "properties": props,
        "tags": pc.map_lookup(props, pa.scalar(rec.PROPERTY_TAGS), "last"),
        "keys": pc.map_lookup(props, pa.scalar(rec.PROPERTY_KEYS), "last"),
        "msg_id": _msg_ids(h) if n else pa.array([], pa.string()),
        "problem": problem,
    }
    return pa.RecordBatch.from_arrays([columns[c] for c in COLUMN_NAMES], schema=ARROW_SCHEMA)


def build_slow(
    buf: bytes, starts: Sequence[int], flt: RecordFilter, include_corrupt: bool
) -> pa.RecordBatch:
    """The same rows through the engine's own `decode()`, one record at a time."""
    rows = []
    for pos in starts:
        d = rec.decode(buf, pos)
        if is_filler(d) or not flt.matches(d.topic, d.store_timestamp):
            continue
        if not d.crc_ok and not include_corrupt:
            continue
        row = record_row(d)
        rows.append(row)
    return rows_to_batch(rows)


def record_row(d: rec.DecodedRecord) -> dict[str, Any]:
    """One output row of a decoded record (the engine's fields plus `problem`)."""
    row = {name: getattr(d, name) for name in COLUMN_NAMES[:-1]}
    row["problem"] = None if d.crc_ok else CRC_MISMATCH
    return row


def gap_row(physical_offset: int, size: int, magic: int | None, problem: str) -> dict[str, Any]:
    """The row that stands for an unreadable byte range (only with includeCorrupt)."""
    row: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
    row.update(
        physical_offset=physical_offset, size=size, magic=magic, crc_ok=False, problem=problem
    )
    return row


def rows_to_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=ARROW_SCHEMA)


def decode_run(
    buf: bytes,
    nb: npt.NDArray[np.uint8],
    data: pa.Buffer,
    starts: IntArray,
    h: npt.NDArray[Any],
    flt: RecordFilter,
    include_corrupt: bool,
) -> pa.RecordBatch:
    """Rows for sound records at `starts` (headers `h` already gathered), filters applied."""
    fast = bool(
        np.all((h["magic"] == rec.MESSAGE_MAGIC_CODE) & ((h["sys_flag"] & HOST_V6_MASK) == 0))
    )
    if fast:
        try:
            return build_fast(buf, data, nb, starts, h, flt, include_corrupt)
        except pa.ArrowInvalid:
            pass  # text that is not UTF-8: the engine replaces it, as Java does
    return build_slow(buf, starts.tolist(), flt, include_corrupt)
