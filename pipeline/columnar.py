"""Turn the record scanner's columns into Arrow record batches, in bulk.

`engine.scan.scan_records` walks a run of records in C (CRC included, GIL released) and
returns each record's header fields and the spans of its body, topic and properties as
arrays. Here those arrays become the columns of `pipeline.schema`, with a fixed number of
numpy / Arrow operations per batch and no Python object per record:

- the scanner's numeric columns are wrapped as they are (numpy views, then Arrow);
- the few fields it does not return (magic, BODYCRC, the hosts, RECONSUMETIMES, the
  prepared-transaction offset) are gathered from the buffer at fixed distances from
  the record start (`engine.record`'s positions) or from the body (`_TAIL_FROM_BODY`);
- body, topic and properties become Arrow binary-view arrays that point into the read
  buffer, then one C++ cast each makes them binary / string columns (the body's cast is
  the one gather of the body bytes);
- properties are split with Arrow's string kernels into a `map<string,string>` that
  follows RocketMQ's lenient parser (a pair with an empty name or value is dropped);
- hosts are formatted once per distinct address, message ids with a hex lookup table.

Fillers (the scanner's BIT_FILLER) are not rows. Records with an IPv6 host, or whose text
is not UTF-8, go through the engine's own `decode()` for their batch: slower, same rows.

Who may call: `pipeline.scan` (executors). Nothing here touches files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from mqstore.engine import compression, record_decode
from mqstore.engine import record as rec
from mqstore.engine.filler import is_filler
from mqstore.engine.recordcodes import format_host
from mqstore.engine.scan import BIT_FILLER, RecordScan
from mqstore.engine.scan import COLUMNS as SCAN_COLUMNS
from mqstore.pipeline.schema import COLUMN_NAMES, PROPERTIES_TYPE, arrow_schema

HOST_V6_MASK = int(rec.SysFlag.BORNHOST_V6 | rec.SysFlag.STOREHOST_V6)
CRC_MISMATCH = "body CRC mismatch"
# The fields the scanner does not return, where a record with IPv4 hosts has them
# (engine.record's positions; STOREHOSTADDRESS follows STORETIMESTAMP, and RECONSUMETIMES,
# the prepared-transaction offset and the body length end where the body starts).
_STORE_HOST = rec.store_timestamp_pos(0) + 8
_BODY_FROM_RECORD = _STORE_HOST + 8 + 16
_EXTRA = np.dtype(
    {
        "names": ["magic", "body_crc", "born_addr", "born_port", "store_addr", "store_port",
                  "reconsume_times", "prepared_transaction_offset"],
        "formats": [">u4", ">i4", ">u4", ">i4", ">u4", ">i4", ">i4", ">i8"],
        "offsets": [rec.POS_MAGIC, rec.POS_BODYCRC, rec.POS_BORNHOST, rec.POS_BORNHOST + 4,
                    _STORE_HOST, _STORE_HOST + 4, _BODY_FROM_RECORD - 16,
                    _BODY_FROM_RECORD - 12],
        "itemsize": _BODY_FROM_RECORD,
    }
)  # fmt: skip

Columns = dict[str, npt.NDArray[Any]]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# byte -> its two upper-case hex characters, as one 16-bit cell (memory order kept)
_HEX = np.frombuffer(b"".join(b"%02X" % i for i in range(256)), dtype=np.uint16)
_AR12 = np.arange(12, dtype=np.int64)
_GATHERED = frozenset(
    ("magic", "body_crc", "born_host", "store_host", "reconsume_times",
     "prepared_transaction_offset", "msg_id")
)  # fmt: skip


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


# --- the scanner's columns ------------------------------------------------------------------


def scan_columns(sc: RecordScan) -> Columns:
    """The scan's per-record columns as numpy arrays (views, no copy), by name."""
    return {
        name: np.frombuffer(getattr(sc, name), dtype=code, count=sc.count)
        for name, code in SCAN_COLUMNS
    }


def take(cols: Columns, sel: npt.NDArray[Any] | slice) -> Columns:
    """The rows `sel` (indices, a mask or a slice) of every column."""
    return {name: col[sel] for name, col in cols.items()}


def as_bytes_array(buf: bytes | memoryview) -> npt.NDArray[np.uint8]:
    return np.frombuffer(buf, dtype=np.uint8)


def _windows(nb: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.uint8]:
    """Every `width`-byte window of the buffer, row i starting at byte i (a view): indexing
    it with positions gathers those fields in one copy."""
    rows = max(len(nb) - width + 1, 0)
    return np.lib.stride_tricks.as_strided(nb, shape=(rows, width), strides=(1, 1))


def _inline(nb: npt.NDArray[np.uint8], pos: IntArray, length: IntArray) -> npt.NDArray[np.uint8]:
    """buf[pos:pos+length] for slices of at most 12 bytes, zero-padded to 12 bytes each.
    (The buffer holds a whole record, so it is longer than 12 bytes.)"""
    last = len(nb) - 12
    head = _windows(nb, 12)[np.minimum(pos, last)]
    near = np.nonzero(pos > last)[0]
    if len(near):  # a slice that ends the buffer: byte by byte, clipped to the buffer
        head[near] = nb[np.minimum(pos[near][:, None] + _AR12, len(nb) - 1)]
    head[_AR12[None, :] >= length[:, None]] = 0
    return head


# --- building columns ----------------------------------------------------------------------


def _view_buffer(nb: npt.NDArray[np.uint8], pos: IntArray, length: IntArray) -> pa.Buffer:
    """Arrow binary-view structs (16 bytes each) for the slices buf[pos:pos+length]: a
    slice of up to 12 bytes is inlined, a longer one is its 4-byte prefix, buffer 0 and
    its offset in the buffer. (Every row is first written as a long one, whole columns
    at a time; the short ones are then overwritten.)"""
    views = np.empty((len(pos), 4), dtype="<i4")
    views[:, 0] = length
    raw = views.view(np.uint8)
    raw[:, 4:8] = _windows(nb, 4)[np.minimum(pos, len(nb) - 4)]
    views[:, 2] = 0
    views[:, 3] = pos
    short = np.nonzero(length <= 12)[0]
    if len(short):
        raw[short, 4:16] = _inline(nb, pos[short], length[short])
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
        names.append(format_host((k >> 32).to_bytes(4, "big"), p - (1 << 32) if p >> 31 else p))
    return pa.array(names, pa.string()).take(pa.array(inverse.reshape(-1)))


def _msg_ids(raw: npt.NDArray[np.uint8]) -> pa.Array:
    """`make_msg_id` from each record's fixed part: the store host's 8 bytes and
    PHYSICALOFFSET's 8, in upper-case hex."""
    n = len(raw)
    ident = np.empty((n, 16), dtype=np.uint8)
    ident[:, :8] = raw[:, _STORE_HOST : _STORE_HOST + 8]
    ident[:, 8:] = raw[:, rec.POS_PHYSICALOFFSET : rec.POS_PHYSICALOFFSET + 8]
    chars = _HEX[ident]  # two characters per byte
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))


def _ints(a: npt.NDArray[Any], dtype: type[np.integer[Any]]) -> pa.Array:
    return pa.array(a.astype(dtype, copy=False))


def _gathered(nb: npt.NDArray[np.uint8], pos: IntArray) -> dict[str, pa.Array]:
    """The columns the scanner does not return, from records with IPv4 hosts: their fixed
    parts are copied out in one gather, then read as `_EXTRA` fields."""
    raw = _windows(nb, _BODY_FROM_RECORD)[pos]
    f = raw.view(_EXTRA).reshape(len(pos))
    return {
        "magic": _ints(f["magic"], np.int64),
        "body_crc": _ints(f["body_crc"], np.int32),
        "born_host": _hosts(f["born_addr"], f["born_port"]),
        "store_host": _hosts(f["store_addr"], f["store_port"]),
        "reconsume_times": _ints(f["reconsume_times"], np.int32),
        "prepared_transaction_offset": _ints(f["prepared_transaction_offset"], np.int64),
        "msg_id": _msg_ids(raw),
    }


# The codec of each sysFlag's type bits (0: 4.x's zlib; 4-7 RocketMQ does not know).
_CODEC_NAMES = np.array(["zlib", "lz4", "zstd", "zlib", *["unknown"] * 4], dtype=object)


def compression_names(sys_flag: IntArray) -> pa.Array:
    """The `compression` column: the codec a body was stored with, null where it was not
    compressed (`engine.record.RecordFields.compression`)."""
    flags = np.asarray(sys_flag)
    mask = (flags & rec.SysFlag.COMPRESSED) != 0
    if not mask.any():
        return pa.nulls(len(flags), pa.string())
    names = np.where(mask, _CODEC_NAMES[(flags >> 8) & 7], None)
    return pa.array(names, pa.string())


def inflated(body: pa.Array, sys_flag: IntArray) -> pa.Array:
    """The body column with each compressed body (sysFlag 0x1) replaced by its original
    bytes: one call of its codec's C function per such body, none when there are none
    (`engine.compression.decompress`). A body that does not inflate stays as stored."""
    flags = np.asarray(sys_flag)
    mask = (flags & rec.SysFlag.COMPRESSED) != 0
    if not mask.any():
        return body
    idx = np.flatnonzero(mask)
    stored = body.take(pa.array(idx))
    out: list[bytes | memoryview] = []
    for i, flag in enumerate(flags[idx].tolist()):
        raw = memoryview(stored[i].as_buffer())
        try:
            out.append(compression.decompress(raw, flag))
        except compression.CompressedBodyError:
            out.append(raw)
    return pc.replace_with_mask(body, pa.array(mask), pa.array(out, pa.binary()))


def build_fast(
    data: pa.Buffer,
    nb: npt.NDArray[np.uint8],
    cols: Columns,
    flt: RecordFilter,
    crc_ok: bool,
    columns: Sequence[str] = COLUMN_NAMES,
) -> pa.RecordBatch:
    """Rows for records with IPv4 hosts, only `columns` of them (each built only when
    asked for); raises ArrowInvalid when some text is not UTF-8."""
    topic = None
    if flt.topic is not None:
        topic = slices_to_array(data, nb, cols["topic_pos"], cols["topic_len"], pa.string())
        keep = np.asarray(pc.equal(topic, pa.scalar(flt.topic, pa.string())))
        if not keep.all():
            sel = np.nonzero(keep)[0]
            cols = take(cols, sel)
            topic = topic.take(pa.array(sel))
    n = len(cols["pos"])
    wanted = set(columns)
    out: dict[str, pa.Array] = {}
    for name, kind in (
        ("physical_offset", np.int64), ("size", np.int32), ("queue_id", np.int32),
        ("flag", np.int32), ("queue_offset", np.int64), ("sys_flag", np.int32),
        ("born_timestamp", np.int64), ("store_timestamp", np.int64),
    ):  # fmt: skip
        if name in wanted:
            out[name] = _ints(cols[name], kind)
    if "crc_ok" in wanted:
        out["crc_ok"] = pa.repeat(pa.scalar(crc_ok), n)
    if "problem" in wanted:
        out["problem"] = pa.repeat(pa.scalar(None if crc_ok else CRC_MISMATCH, pa.string()), n)
    if "topic" in wanted:
        out["topic"] = (
            topic
            if topic is not None
            else slices_to_array(data, nb, cols["topic_pos"], cols["topic_len"], pa.string())
        )
    if "body" in wanted:
        body = slices_to_array(data, nb, cols["body_pos"], cols["body_len"], pa.binary())
        out["body"] = inflated(body, cols["sys_flag"])
    if "compression" in wanted:
        out["compression"] = compression_names(cols["sys_flag"])
    if wanted & {"properties", "tags", "keys"}:
        props = properties_map(
            slices_to_array(data, nb, cols["props_pos"], cols["props_len"], pa.string())
        )
        out["properties"] = props
        out["tags"] = pc.map_lookup(props, pa.scalar(rec.PROPERTY_TAGS), "last")
        out["keys"] = pc.map_lookup(props, pa.scalar(rec.PROPERTY_KEYS), "last")
    if wanted & _GATHERED:
        out.update(_gathered(nb, cols["pos"]))
    return pa.RecordBatch.from_arrays([out[c] for c in columns], schema=arrow_schema(columns))


def build_slow(
    buf: bytes | memoryview,
    starts: Sequence[int],
    flt: RecordFilter,
    include_corrupt: bool,
    columns: Sequence[str] = COLUMN_NAMES,
) -> pa.RecordBatch:
    """The same rows through the engine's own `decode()`, one record at a time."""
    rows = []
    for pos in starts:
        d = compression.inflate(record_decode.decode(buf, pos))
        if is_filler(d) or not flt.matches(d.topic, d.store_timestamp):
            continue
        if not d.crc_ok and not include_corrupt:
            continue
        row = record_row(d)
        rows.append(row)
    return rows_to_batch(rows, columns)


def record_row(d: record_decode.DecodedRecord) -> dict[str, Any]:
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


def rows_to_batch(
    rows: list[dict[str, Any]], columns: Sequence[str] = COLUMN_NAMES
) -> pa.RecordBatch:
    """`columns` of the rows (dicts holding every column)."""
    return pa.RecordBatch.from_pylist(rows, schema=arrow_schema(columns))


def decode_run(
    buf: bytes | memoryview,
    nb: npt.NDArray[np.uint8],
    data: pa.Buffer,
    cols: Columns,
    flt: RecordFilter,
    *,
    crc_ok: bool = True,
    columns: Sequence[str] = COLUMN_NAMES,
) -> pa.RecordBatch:
    """`columns` of the rows for the scanned records `cols`, fillers dropped and `flt`
    applied. `crc_ok`
    says whether their body CRCs matched (the source makes a run of mismatches only
    under includeCorrupt, so a run with crc_ok False is always kept)."""
    keep = ((cols["bits"] & BIT_FILLER) == 0) & flt.time_mask(cols["store_timestamp"])
    if not keep.all():
        cols = take(cols, keep)
    if not (cols["sys_flag"] & HOST_V6_MASK).any():
        try:
            return build_fast(data, nb, cols, flt, crc_ok, columns)
        except pa.ArrowInvalid:
            pass  # text that is not UTF-8: the engine replaces it, as Java does
    return build_slow(buf, cols["pos"].tolist(), flt, include_corrupt=not crc_ok, columns=columns)
