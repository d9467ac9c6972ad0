"""Index files: RocketMQ's IndexFile and IndexService (spec §4).

An index file maps message keys (`topic#key`) to commit-log physical offsets through a
hash-slot table with chained entries. File size = 40 + slots*4 + entries*20, big-endian:

Header (40 bytes), written through at every put by the dispatcher:

| off | size | field                | meaning                                          |
| --- | ---- | -------------------- | ------------------------------------------------ |
| 0   | 8    | begin_timestamp      | store time of the first key (ms)                 |
| 8   | 8    | end_timestamp        | store time of the last key                       |
| 16  | 8    | begin_phy_offset     | commit-log offset of the first key's message     |
| 24  | 8    | end_phy_offset       | commit-log offset of the last key's message      |
| 32  | 4    | hash_slot_count      | slots ever used                                  |
| 36  | 4    | index_count          | next entry number; starts at 1 (0 means "none")  |

Slot table: `slots` int32 at byte 40; slot *s* holds the number of the newest entry whose
key hash falls in *s* (0: empty). Entry *k* (1-based) at `40 + slots*4 + k*20`:

| off | size | field      | meaning                                                     |
| --- | ---- | ---------- | ----------------------------------------------------------- |
| 0   | 4    | key_hash   | abs(Java hashCode of the key); Integer.MIN_VALUE gives 0    |
| 4   | 8    | phy_offset | commit-log offset of the message                            |
| 12  | 4    | time_diff  | (store time - begin_timestamp) / 1000, clamped to [0, 2^31) |
| 16  | 4    | prev       | previous entry number in the same slot (0: end of chain)    |

A file is full when `index_count >= entries` (it holds `entries - 1` keys). Files are
named by their creation time `yyyyMMddHHmmssSSS` (local time) and loaded in name order.
Lookups compare only the 32-bit hash, as RocketMQ's; callers that care re-check keys.

Geometry is not stored in the file. `IndexFile.open` takes the configured slots and
entries; a file of another size is read with slots = (size - 40) / 84 and entries =
4 * slots when that divides (RocketMQ's 5M x 20M, mqstore's 500k x 2M and rocketmq-rust's
32 x 128 all have that ratio), else `IndexGeometryError`.

Beyond RocketMQ: `IndexFile.truncate(phy, store_time_of)` drops entries of messages at
or past a commit-log offset (abnormal recovery cuts the log; RocketMQ instead destroys
whole files newer than the checkpoint's index timestamp, which it also does at load), and
leaves the header RocketMQ's puts of the entries kept wrote (the end time in ms, read
from the commit log).

This module is one file: its layout, the key hash, the put (`put_hashes` is the Python
twin of the C put), lookups and truncation. A store's set of index files (load, rolls,
files made ahead, queries over files) is `engine.indexservice.IndexService`.

One writer (the dispatcher); readers open files read-only in their own process and
look keys up while it writes. So every store of a field a reader may be loading (a slot
head, a header field) is one store of the whole field: a slice assignment of its packed
bytes, one memcpy (glibc copies 4-7 bytes with 4-byte moves, 8-15 with 8-byte moves; the
fields are aligned), never `struct.pack_into`, which clears the field first (a reader
loads a 0 nobody stored). A reader loads each such field with one memcpy too (a slice, a
private copy), not `unpack_from(">i")`, which loads it byte by byte (a mix of old and new
bytes). A new entry is written before its slot's head points at it, so its own stores are
plain. The C put stores the same fields with released atomic stores (`mqs_publish32`).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias

from mqstore import _native
from mqstore.engine import fileio
from mqstore.engine.filesync import DEFAULT_MMAP_SYNC, FileSync, SyncMethod
from mqstore.engine.record import WritableBuffer
from mqstore.engine.recordcodes import java_string_hash

_HEADER: Final = struct.Struct(">qqqqii")  # the header's six fields (module doc)
_ENTRY: Final = struct.Struct(">iqii")  # an entry's four
_I32: Final = struct.Struct(">i")  # a slot; index_count
_I64: Final = struct.Struct(">q")  # a header timestamp or offset
INDEX_HEADER_SIZE: Final = _HEADER.size
HASH_SLOT_SIZE: Final = _I32.size
INDEX_ENTRY_SIZE: Final = _ENTRY.size
_I32_PACK: Final = _I32.pack
_I64_PACK: Final = _I64.pack
_I32_UNPACK: Final = _I32.unpack
_I64_UNPACK: Final = _I64.unpack
_INT_MAX: Final = 2_147_483_647
_ONE_KEY: Final = array("i", [0, 1])  # key_first of a single record with one key
IntColumn: TypeAlias = "memoryview | array[int]"  # a scan column (engine.scan), or an array
# The store time (ms) of the record at a commit-log offset; None: not in the log
# (`CommitLog.store_time_of`).
StoreTimeOf: TypeAlias = Callable[[int], "int | None"]


class IndexGeometryError(ValueError):
    """An index file that cannot be opened as one: its size fits neither the configured
    geometry nor the 1:4 ratio, or its header counts more entries than it holds."""


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


def key_hash(key: str) -> int:
    """RocketMQ's indexKeyHashMethod: abs(hashCode), with abs(MIN_VALUE) replaced by 0."""
    h = abs(java_string_hash(key))
    return 0 if h > _INT_MAX else h


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def index_file_name(ms: int) -> str:
    """`yyyyMMddHHmmssSSS` of `ms` in local time (RocketMQ's UtilAll.timeMillisToHumanString)."""
    t = time.localtime(ms / 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


def put_hashes(
    buf: WritableBuffer,
    hash_slot_num: int,
    index_num: int,
    key_first: IntColumn,
    key_hashes: IntColumn,
    pos: IntColumn,
    store_timestamp: IntColumn,
    base: int,
    rec_from: int,
    rec_to: int,
    key_from: int,
) -> int:
    """The reference of `mqstore._native.index_put`: RocketMQ's putKey (spec §4.3) for
    each key k in [key_from, key_first[rec_to]) of record r (key_first[r] <= k <
    key_first[r + 1]) at commit-log offset base + pos[r] and store time
    store_timestamp[r], into the index file mapped as `buf`, until it is full. Returns
    the next key not put. Raises ValueError for input the C twin refuses too."""
    if not (0 < hash_slot_num < 2**31 and 0 < index_num < 2**31):
        raise ValueError("hash_slot_num and index_num must be in [1, 2^31)")
    if rec_from < 0 or rec_to < rec_from or base < 0:
        raise ValueError("need 0 <= rec_from <= rec_to and base >= 0")
    entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
    mm = memoryview(buf)
    if mm.nbytes < entries_at + index_num * INDEX_ENTRY_SIZE:
        raise ValueError("buf is smaller than the index file's geometry")
    kf = _column(key_first, "key_first", 4, rec_to + 1)
    if any(kf[r] < 0 or kf[r + 1] < kf[r] for r in range(rec_from, rec_to)):
        raise ValueError("key_first must rise from rec_from to rec_to")
    if not kf[rec_from] <= key_from <= kf[rec_to]:
        raise ValueError("key_from is outside the records' keys")
    kh = _column(key_hashes, "key_hash", 4, kf[rec_to])
    ps = _column(pos, "pos", 8, rec_to)
    ts = _column(store_timestamp, "store_timestamp", 8, rec_to)
    k, r = key_from, rec_from
    while k < kf[rec_to]:
        while r < rec_to and kf[r + 1] <= k:
            r += 1
        if ps[r] < 0 or base + ps[r] >= 2**63:
            raise ValueError("base + pos is not a commit-log offset")
        if not _put_hash(mm, hash_slot_num, index_num, entries_at, kh[k], base + ps[r], ts[r]):
            break
        k += 1
    return k


def _column(b: IntColumn, name: str, itemsize: int, min_len: int) -> memoryview:
    v = memoryview(b)
    if v.itemsize != itemsize or v.nbytes // itemsize < min_len:
        raise ValueError(f"{name} must hold at least {min_len} items of {itemsize} bytes")
    return v.cast("B").cast("i" if itemsize == 4 else "q")


def _put_hash(
    mm: memoryview, slots: int, entries: int, entries_at: int, h: int, phy: int, ts: int
) -> bool:
    """One key of `put_hashes`; False when the file is full."""
    begin_ts, _e, _bp, _ep, slot_count, count = _HEADER.unpack_from(mm, 0)
    if count >= entries:
        return False
    if h < 0:
        raise ValueError("key_hash holds a negative hash")
    if count < 0:
        raise ValueError("the index file's index_count is negative")
    slot_pos = INDEX_HEADER_SIZE + (h % slots) * HASH_SLOT_SIZE
    slot_value = _I32.unpack_from(mm, slot_pos)[0]
    if slot_value <= 0 or slot_value > count:
        slot_value = 0
    if slot_value == 0 and slot_count == _INT_MAX:
        raise ValueError("the index file's hash_slot_count is at its maximum")
    diff = 0
    if begin_ts > 0:
        diff = min(max((ts - begin_ts) // 1000, 0), _INT_MAX)
    # The new entry is seen by no lookup before the slot's head points at it, stored
    # after it: pack_into's clear-then-write is harmless here.
    _ENTRY.pack_into(mm, entries_at + count * INDEX_ENTRY_SIZE, h, phy, diff, slot_value)
    # The visible fields: each one whole store (module doc), the count last (a lookup
    # loads the head, then the count: `IndexFile.select_phy_offsets`).
    mm[slot_pos : slot_pos + 4] = _I32_PACK(count)
    if count <= 1:
        mm[0:8] = _I64_PACK(ts)
        mm[16:24] = _I64_PACK(phy)
    if slot_value == 0:
        slot_count += 1
    mm[8:16] = _I64_PACK(ts)
    mm[24:32] = _I64_PACK(phy)
    mm[32:36] = _I32_PACK(slot_count)
    mm[36:40] = _I32_PACK(count + 1)
    return True


_index_put: Final = _native.index_put  # the C twin of put_hashes


class KeyBatch(NamedTuple):
    """Records [rec_from, rec_to) of a scan's columns (`engine.scan`), for the index:
    record r's key hashes are key_hash[key_first[r]:key_first[r + 1]], its commit-log
    offset base + pos[r], its store time store_timestamp[r]."""

    key_first: IntColumn
    key_hash: IntColumn
    pos: IntColumn
    store_timestamp: IntColumn
    base: int
    rec_from: int
    rec_to: int


@dataclass(frozen=True, slots=True)
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int


class _HeaderField:
    """A header field of an `IndexFile`, read from its mapping at each access: one
    memcpy of the field (module doc)."""

    __slots__ = ("_end", "_fmt", "_off")

    def __init__(self, fmt: struct.Struct, off: int) -> None:
        self._fmt = fmt
        self._off = off
        self._end = off + fmt.size

    def __get__(self, f: IndexFile, owner: type | None = None) -> int:
        return int(self._fmt.unpack(f._mm[self._off : self._end])[0])


class IndexFile:
    """One index file, mapped. See the module docstring."""

    def __init__(
        self, path: str, hash_slot_num: int, index_num: int, *, read_only: bool = False
    ) -> None:
        """Map an existing file of exactly `index_file_size(...)` bytes. Prefer `open`."""
        self.path = path
        self.file_name = os.path.basename(path)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.read_only = read_only
        self.size_bytes = index_file_size(hash_slot_num, index_num)
        self._entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        self._fd = fileio.open_file(path, create=False, read_only=read_only)
        try:
            self._mm: mmap.mmap = fileio.mmap_file(
                self._fd, self.size_bytes, writable=not read_only, path=path
            )
        except BaseException:
            fileio.close(self._fd, path)
            raise
        self._closed = False
        count = self.index_count
        if count > index_num:
            self.close()
            raise IndexGeometryError(
                f"index file {path} is damaged: its header says {count} entries are used, "
                f"but it holds {index_num}; move it out of the index directory to start"
            )
        if not read_only and count <= 0:
            self._set_header(index_count=1)  # RocketMQ's load treats <= 0 as 1

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], hash_slot_num: int, index_num: int, *, read_only: bool
    ) -> IndexFile:
        """Open an index file, inferring its geometry when its size is not the
        configured one (module doc). Raises IndexGeometryError, StoreIOError."""
        path = os.fspath(path)
        size = os.stat(path).st_size
        if size != index_file_size(hash_slot_num, index_num):
            rest = size - INDEX_HEADER_SIZE
            if rest <= 0 or rest % 84:
                raise IndexGeometryError(
                    f"index file {path} is {size} bytes: neither {hash_slot_num} slots x "
                    f"{index_num} entries nor a 1:4 geometry; set maxHashSlotNum/maxIndexNum"
                )
            hash_slot_num, index_num = rest // 84, 4 * (rest // 84)
        return cls(path, hash_slot_num, index_num, read_only=read_only)

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        hash_slot_num: int,
        index_num: int,
        *,
        now_ms_value: int,
    ) -> IndexFile:
        """A new, zeroed file named by `now_ms_value` (bumped by 1 ms while the name is
        taken); `start_after` the previous file next, as RocketMQ's
        getAndCreateLastIndexFile does.

        Allocated, not sparse: built as `<name>.tmp` (fallocate, fsync), then renamed
        into place, as commit-log segments and consume queues are. A sparse file on a
        full file system (a tmpfs above all) would take its pages on first touch through
        the mapping, and a page the file system cannot give is SIGBUS, not an error; a
        full disk fails here instead, with a StoreIOError whose errno is ENOSPC
        (`fileio.is_no_space`: the dispatcher waits it out), and leaves no file behind.
        Cost: one fallocate of the file's size, a write of the slot table's zeros and two
        fsyncs. Raises StoreIOError."""
        directory = os.fspath(directory)
        path = cls.free_name(directory, now_ms_value)
        tmp = cls.prepare(directory, hash_slot_num, index_num, os.path.basename(path) + ".tmp")
        fileio.rename(tmp, path)
        fileio.fsync_dir(directory)
        return cls(path, hash_slot_num, index_num)

    @staticmethod
    def free_name(directory: str, now_ms_value: int) -> str:
        """The path of a new file named by `now_ms_value`, bumped by 1 ms while taken."""
        ms = now_ms_value
        while os.path.exists(os.path.join(directory, index_file_name(ms))):
            ms += 1
        return os.path.join(directory, index_file_name(ms))

    @staticmethod
    def prepare(directory: str, hash_slot_num: int, index_num: int, tmp_name: str) -> str:
        """The first half of `create`, ahead of need: `directory/tmp_name` allocated,
        its slot table written, fsynced, and left there; returns its path. Rename it to a
        `free_name`, then open it; the directory's fsync is the caller's. A writable
        `IndexService.load` deletes `.tmp` leftovers. Raises StoreIOError (no file left
        behind)."""
        fileio.makedirs(directory)
        tmp = os.path.join(directory, tmp_name)
        # The slot table is written at random: zeros written now make its blocks written
        # extents at once, so the dispatcher's first keys do not each take a page fault
        # that converts one (RocketMQ warms its mapped files likewise).
        slot_table = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        size = index_file_size(hash_slot_num, index_num)
        fileio.preallocate(tmp, size, zeros_from_start=slot_table)
        return tmp

    def start_after(self, prev_end_phy_offset: int, prev_end_timestamp: int) -> None:
        """Start a new, empty file's header at the previous file's end values (each when
        > 0): its begin and end offset, its begin and end time."""
        if prev_end_phy_offset > 0:
            self._set_header(
                begin_phy_offset=prev_end_phy_offset, end_phy_offset=prev_end_phy_offset
            )
        if prev_end_timestamp > 0:
            self._set_header(begin_timestamp=prev_end_timestamp, end_timestamp=prev_end_timestamp)

    # --- header -----------------------------------------------------------------------

    def header(self) -> IndexHeader:
        """The header, copied at once (one memcpy; while the writer writes, its fields
        may be of different puts: a lookup loads the fields it trusts one by one)."""
        return IndexHeader(*_HEADER.unpack(self._mm[0:INDEX_HEADER_SIZE]))

    # Header fields read through the mapping, at their offsets in the module doc's table.
    begin_timestamp = _HeaderField(_I64, 0)
    end_timestamp = _HeaderField(_I64, 8)
    begin_phy_offset = _HeaderField(_I64, 16)
    end_phy_offset = _HeaderField(_I64, 24)
    hash_slot_count = _HeaderField(_I32, 32)
    index_count = _HeaderField(_I32, 36)

    def _set_header(self, **fields: int) -> None:
        """Store the given header fields, in the order given (the count last, where it
        is given), each one whole store (module doc); the others are left as they are."""
        for name, v in fields.items():
            f: _HeaderField = IndexFile.__dict__[name]
            self._mm[f._off : f._end] = f._fmt.pack(v)

    @property
    def mm(self) -> mmap.mmap:
        """The file's mapping (the dispatcher's C round writes keys into it)."""
        return self._mm

    def is_write_full(self) -> bool:
        return self.index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """RocketMQ's isTimeMatched: the file's time span meets [begin, end]."""
        fb, fe = self.begin_timestamp, self.end_timestamp
        return (begin < fb and end > fe) or fb <= begin <= fe or fb <= end <= fe

    # --- put and lookup ---------------------------------------------------------------

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """RocketMQ's putKey (spec §4.3); False when the file is full. O(1)."""
        one = KeyBatch(_ONE_KEY, array("i", [key_hash(key)]), array("q", [0]),
                       array("q", [store_timestamp]), phy_offset, 0, 1)  # fmt: skip
        return self.put_hashes(one, 0) == 1

    def put_hashes(self, batch: KeyBatch, key_from: int) -> int:
        """Put the keys of `batch` from key `key_from` on, until the file is full.
        Returns the next key not put (`key_first[rec_to]`: all). In C
        (`_native.index_put`; `put_hashes` is its twin). Raises ValueError for columns
        that do not fit. O(keys)."""
        return _index_put(self._mm, self.hash_slot_num, self.index_num, *batch, key_from)

    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """RocketMQ's selectPhyOffset (spec §4.4): newest first, hash compared only."""
        out: list[int] = []
        mm = self._mm
        h = key_hash(key)
        at = INDEX_HEADER_SIZE + (h % self.hash_slot_num) * HASH_SLOT_SIZE
        # Each field one load (module doc); the slot's head before the count: the writer
        # stores the head, then the count, so a head loaded first is below the count
        # loaded after it. A count loaded first can be passed by two puts into the slot,
        # whose head then looks past it, as an empty slot (x86-64 keeps loads in order).
        slot_value = _I32_UNPACK(mm[at : at + 4])[0]
        count = _I32_UNPACK(mm[36:40])[0]
        begin_ts = _I64_UNPACK(mm[0:8])[0]
        if slot_value <= 0 or slot_value > count or count <= 1:
            return out
        nxt = slot_value
        while len(out) < max_num:
            kh, phy, diff, prev = _ENTRY.unpack_from(mm, self._entries_at + nxt * INDEX_ENTRY_SIZE)
            if diff < 0:
                break
            t = begin_ts + diff * 1000
            if kh == h and begin <= t <= end:
                out.append(phy)
            if prev <= 0 or prev > count or prev == nxt or t < begin:
                break
            nxt = prev
        return out

    def entries(self) -> Iterable[tuple[int, int, int, int, int]]:
        """(entry number, key hash, phy offset, time diff, prev) of every entry written."""
        count = self.index_count
        for k in range(1, max(count, 1)):
            yield (k, *_ENTRY.unpack_from(self._mm, self._entries_at + k * INDEX_ENTRY_SIZE))

    # --- truncation, flush, lifecycle -------------------------------------------------

    def truncate(self, phy_offset: int, store_time_of: StoreTimeOf) -> int:
        """Drop the entries of messages at or past commit-log `phy_offset` (entries are
        in log order): chains are re-pointed past them, their bytes zeroed and the
        header rewound to the last entry kept, as its put wrote it: its offset and its
        store time in ms, `store_time_of(its offset)` (an entry keeps only whole seconds
        past the file's begin; None, a record no longer in the log: those seconds).
        Every entry dropped, the end fields become the begin ones, and the file holds
        nothing: its caller destroys it (`IndexService.truncate_dirty`). Returns entries
        dropped. Recovery and the dispatcher's failed roll only. O(entries dropped)."""
        mm = self._mm
        begin_ts, _e, begin_phy, _ep, slot_count, count = _HEADER.unpack_from(mm, 0)
        k = count
        while k > 1:
            _h, phy, _d, _p = _ENTRY.unpack_from(mm, self._entries_at + (k - 1) * 20)
            if phy < phy_offset:
                break
            k -= 1
        dropped: int = count - k
        if dropped == 0:
            return 0
        slots = {
            _ENTRY.unpack_from(mm, self._entries_at + j * 20)[0] % self.hash_slot_num
            for j in range(k, count)
        }
        for s in slots:
            pos = INDEX_HEADER_SIZE + s * 4
            v = _I32.unpack_from(mm, pos)[0]
            while v >= k:
                v = _ENTRY.unpack_from(mm, self._entries_at + v * 20)[3]
            mm[pos : pos + 4] = _I32_PACK(v)  # a head a lookup may load: one store
            if v == 0:
                slot_count -= 1
        start = self._entries_at + k * 20
        mm[start : self._entries_at + count * 20] = bytes((count - k) * 20)
        if k > 1:
            _h, last_phy, last_diff, _p = _ENTRY.unpack_from(mm, self._entries_at + (k - 1) * 20)
            ts = store_time_of(last_phy)
            self._set_header(
                end_phy_offset=last_phy,
                end_timestamp=begin_ts + last_diff * 1000 if ts is None else ts,
                hash_slot_count=max(slot_count, 0),
                index_count=k,
            )
        else:
            self._set_header(
                end_phy_offset=begin_phy, end_timestamp=begin_ts, hash_slot_count=0, index_count=1
            )
        return dropped

    def rechain(self) -> int:
        """Rebuild the hash slots and the entries' chains from the entries the header
        counts when a slot points at an entry it does not count; return the entries
        re-chained (0: none pointed past).

        Recovery only, after an abnormal exit, on a file it keeps. A power cut can keep a
        slot page written after the header page that counts the entries: such a slot
        would become a chain that loops at the next put (`check`: "entry k chains to k").
        The check is O(slots) in C; a rebuild re-puts the counted entries' chains in
        order, as the puts that wrote them did, O(slots + entries)."""
        mm = self._mm
        count = self.index_count
        slots = array("i", mm[INDEX_HEADER_SIZE : self._entries_at])
        if sys.byteorder == "little":
            slots.byteswap()  # the file is big-endian (Java's ByteBuffer)
        if max(slots, default=0) < max(count, 1):
            return 0
        chained = [0] * self.hash_slot_num
        for j in range(1, count):
            at = self._entries_at + j * INDEX_ENTRY_SIZE
            h = _ENTRY.unpack_from(mm, at)[0]
            s = h % self.hash_slot_num
            mm[at + 16 : at + 20] = _I32_PACK(chained[s])  # its prev only, one store
            chained[s] = j
        # The slot table at once (a large memcpy promises no whole field): recovery runs
        # before the store serves lookups.
        slots = array("i", chained)
        if sys.byteorder == "little":
            slots.byteswap()
        mm[INDEX_HEADER_SIZE : self._entries_at] = slots.tobytes()
        self._set_header(hash_slot_count=sum(1 for v in chained if v))
        return max(count - 1, 0)

    def flush(self) -> None:
        """Force the whole file (header included), as `sync_handle` does. Raises
        StoreIOError."""
        h = self.sync_handle()
        try:
            h.run()
        finally:
            h.close()

    def sync_handle(self) -> FileSync:
        """What forcing the whole file takes, for a thread that does not write it (the
        dispatcher's flush thread, `workers.cq_flusher`): fdatasync of a duplicate
        descriptor where that covers data written through the mapping (Linux, see
        `filesync.SyncMethod`: it also releases the GIL, which `mmap.flush` does not), else
        msync of the mapping. Raises StoreIOError."""
        if DEFAULT_MMAP_SYNC is SyncMethod.FDATASYNC:
            return FileSync(fileio.dup(self._fd, self.path), self.path)
        return FileSync(-1, self.path, mapping=self._mm, length=self.size_bytes)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._mm.close()
            finally:
                fileio.close(self._fd, self.path)

    def destroy(self) -> None:
        self.close()
        fileio.unlink(self.path, missing_ok=True)

    def __repr__(self) -> str:
        return f"IndexFile({self.file_name}, {self.header()})"
