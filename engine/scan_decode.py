"""Message objects from the record scanner's columns: how reads decode the log.

A read knows where its records start (consume-queue units, an index hit, the offset in
a message id). `read_records(segment_queue, spans, limit)` finds them in the mapped
segments; within one segment's view, `find_records(view, starts)` walks them with
`engine.scan.scan_records` (CRC checked) and builds one `DecodedRecord` (a copy of the
body) or `RecordView` (the body a view of `view`) per record found, from the scanner's
columns; only what the columns lack (magic, body CRC, hosts, reconsume times, prepared
offset) is read from the record's fixed header, with one struct unpack.

Where wanted records follow one another with at most `gap_bytes` between them, one scan
walks the whole run (the records in the gaps are walked and dropped); otherwise each is
scanned alone. A start the walk passed over without a record beginning there is scanned
alone too, so that the answer at every start is exactly what `engine.record.decode` and
`check_record` (CRC on) say there: a record, or nothing. Records with an IPv6 host (rare:
the fixed header then has other offsets) take a few more unpacks.

Any reader; no state but small caches of formatted hosts and topics (bounded).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator, Sequence
from typing import Final

from mqstore.engine.record import (
    POS_BORNHOST,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    SysFlag,
    decode_properties,
)
from mqstore.engine.record_decode import DecodedRecord, RecordFields, RecordView
from mqstore.engine.recordcodes import decode_utf8, format_host
from mqstore.engine.scan import BIT_BODY_CRC_OK, RecordScan, scan_records
from mqstore.engine.segment import ReadStatus, Segment
from mqstore.engine.segment_queue import SegmentQueue

# From byte 4 of a record with IPv4 hosts: MAGIC, BODYCRC, (QUEUEID .. BORNTIMESTAMP),
# BORNHOST+port, (STORETIMESTAMP), STOREHOST+port, RECONSUMETIMES, PREPARED offset.
_V4_FIXED: Final = struct.Struct(">Ii36x8s8x8siq")
_MAGIC_CRC: Final = struct.Struct(">Ii")
_RECONSUME_PREPARED: Final = struct.Struct(">iq")
_V6_HOSTS: Final = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)  # an int: IntFlag's & is slow
_U64: Final = (1 << 64) - 1
_CACHE_MAX: Final = 4096
# Join wanted records into one scan across gaps of up to this many bytes: worth it with
# the C scanner (a record walked and dropped costs far less than a scan call).
DEFAULT_GAP_BYTES: Final = 64 * 1024

_hosts: dict[bytes, str] = {}  # address + port bytes -> "ip:port"
_id_heads: dict[bytes, str] = {}  # store address + port bytes -> its message-id hex
_topics: dict[bytes, str] = {}


def _cached(cache: dict[bytes, str], raw: bytes, value: str) -> str:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[raw] = value
    return value


def _host(raw: bytes) -> str:
    got = _hosts.get(raw)
    if got is None:
        got = _cached(_hosts, raw, format_host(raw[:-4], int.from_bytes(raw[-4:], signed=True)))
    return got


def _msg_id(store: bytes, physical_offset: int) -> str:
    """`engine.recordcodes.make_msg_id`, with the store host's hex cached."""
    head = _id_heads.get(store)
    if head is None:
        head = _cached(_id_heads, store, store.hex().upper())
    return f"{head}{physical_offset & _U64:016X}"


def _topic(raw: memoryview) -> str:
    key = bytes(raw)
    got = _topics.get(key)
    if got is None:
        got = _cached(_topics, key, decode_utf8(key))
    return got


def _fixed(view: memoryview, pos: int, sys_flag: int) -> tuple[int, int, bytes, bytes, int, int]:
    """(magic, body CRC, born host, store host, reconsume times, prepared offset) from the
    record's fixed header; a host is its address and port bytes."""
    if not sys_flag & _V6_HOSTS:
        got: tuple[int, int, bytes, bytes, int, int] = _V4_FIXED.unpack_from(view, pos + 4)
        return got
    magic, crc = _MAGIC_CRC.unpack_from(view, pos + 4)
    born_end = pos + POS_BORNHOST + (20 if sys_flag & SysFlag.BORNHOST_V6 else 8)
    store_p = born_end + 8
    store_end = store_p + (20 if sys_flag & SysFlag.STOREHOST_V6 else 8)
    reconsume, prepared = _RECONSUME_PREPARED.unpack_from(view, store_end)
    born = bytes(view[pos + POS_BORNHOST : born_end])
    return magic, crc, born, bytes(view[store_p:store_end]), reconsume, prepared


def _wanted_rows(sc: RecordScan, wanted: set[int]) -> Iterator[tuple[int, ...]]:
    """The rows that start at a position in `wanted`, as tuples of the columns
    `_build_rows` reads, in its order (the other rows are skipped in C)."""
    mask = [pos in wanted for pos in sc.pos.tolist()]
    cols = (
        sc.pos, sc.size, sc.queue_id, sc.queue_offset, sc.physical_offset, sc.sys_flag,
        sc.flag, sc.born_timestamp, sc.store_timestamp, sc.bits, sc.body_pos, sc.body_len,
        sc.topic_pos, sc.topic_len, sc.props_pos, sc.props_len,
    )  # fmt: skip
    return zip(*(itertools.compress(c.tolist(), mask) for c in cols), strict=True)


def _build_rows(
    view: memoryview,
    sc: RecordScan,
    wanted: set[int],
    zero_copy: bool,
    found: dict[int, RecordFields],
) -> None:
    """The record of every scan row that starts at a position in `wanted`, from its
    columns and its fixed header, into `found`."""
    for (
        pos, size, queue_id, queue_offset, phys, sys_flag, flag, born_ts, store_ts, bits,
        bp, bl, tp, tl, pp, pl,
    ) in _wanted_rows(sc, wanted):  # fmt: skip
        magic, crc, born, store, reconsume, prepared = _fixed(view, pos, sys_flag)
        props = decode_properties(view[pp : pp + pl]) if pl else {}
        head = (
            phys, size, magic, crc, bool(bits & BIT_BODY_CRC_OK), queue_id, flag,
            queue_offset, sys_flag, born_ts, _host(born), store_ts, _host(store), reconsume,
            prepared, _topic(view[tp : tp + tl]),
        )  # fmt: skip
        tail = (props, props.get(PROPERTY_TAGS), props.get(PROPERTY_KEYS), _msg_id(store, phys))
        body = view[bp : bp + bl]
        if zero_copy:
            found[pos] = RecordView(*head, body, *tail)
        else:
            found[pos] = DecodedRecord(*head, bytes(body), *tail)


def _walk(
    view: memoryview, run: Sequence[int], end: int, zero_copy: bool, found: dict[int, RecordFields]
) -> None:
    """Scan from the run's first start to `end` (one record when the run has one start),
    keeping the rows that begin at a start of the run; then as the module doc says."""
    todo = list(run)
    while todo:
        sc = scan_records(view, todo[0], end, max_records=1 if len(todo) == 1 else -1)
        _build_rows(view, sc, set(todo), zero_copy, found)
        stop = sc.stop_pos
        for s in todo:
            if s < stop and s not in found:  # walked over: no record of the walk starts there
                _walk(view, [s], end, zero_copy, found)
        todo = [s for s in todo if s >= stop]
        if todo and todo[0] == stop:  # the scan stopped there: no valid record
            todo.pop(0)


def find_records(
    view: memoryview,
    starts: Sequence[int],
    sizes: Sequence[int],
    *,
    zero_copy: bool = False,
    gap_bytes: int = DEFAULT_GAP_BYTES,
) -> dict[int, RecordFields]:
    """The valid record (CRC checked, ending within `view`) at each of `starts`
    (positions in `view`, ascending, distinct), keyed by start; a start without one is
    missing. `sizes[k]` is the record size expected at `starts[k]` (0 when unknown: that
    start is scanned alone). Bodies are copies, or with `zero_copy` slices of `view`.
    O(bytes walked)."""
    found: dict[int, RecordFields] = {}
    k, n = 0, len(starts)
    while k < n:
        j = k
        while (
            j + 1 < n
            and sizes[j] > 0
            and sizes[j + 1] > 0
            and 0 <= starts[j + 1] - starts[j] - sizes[j] <= gap_bytes
        ):
            j += 1
        end = starts[j] + sizes[j] if sizes[j] > 0 else len(view)
        _walk(view, starts[k : j + 1], min(end, len(view)), zero_copy, found)
        k = j + 1
    return found


def segment_of(queue: SegmentQueue, physical_offset: int) -> Segment | None:
    """The segment holding `physical_offset`, looking for new files once if none."""
    seg = queue.find(physical_offset)
    if seg is None:
        queue.refresh()
        seg = queue.find(physical_offset)
    return seg


def read_records(
    queue: SegmentQueue, spans: Sequence[tuple[int, int]], limit: int, *, zero_copy: bool = False
) -> dict[int, RecordFields]:
    """The record at each log offset of `spans` ((offset, expected size or 0 when
    unknown)) of a read-only segment queue, keyed by offset; an offset is missing when
    no valid record (CRC included) starts there and ends at or below `limit`. One held
    view per segment, walked by `find_records`; new segment files are looked for once
    when an offset is in none. Fillers are records like any other here."""
    todo = sorted({off: size for off, size in spans if 0 <= off < limit}.items())
    out: dict[int, RecordFields] = {}
    k = 0
    while k < len(todo):
        seg = segment_of(queue, todo[k][0])
        if seg is None:
            k += 1
            continue
        seg_end = min(seg.start_offset + seg.size_bytes, limit)
        j = k
        while j < len(todo) and todo[j][0] < seg_end:
            j += 1
        group, k = todo[k:j], j
        base, (last, last_size) = group[0][0], group[-1]
        sized = all(size > 0 for _, size in group)
        end = min(seg_end, last + last_size) if sized else seg_end
        with seg.select(base - seg.start_offset, end - base) as sl:
            if sl.status is not ReadStatus.OK:
                continue
            found = find_records(
                sl.view, [o - base for o, _ in group], [s for _, s in group], zero_copy=zero_copy
            )
        out.update((base + pos, rec) for pos, rec in found.items())
    return out
