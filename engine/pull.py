"""A pull's walk over consume-queue units, and its messages, in C (issue 13).

`StoreReader.get_messages` (RocketMQ's getMessage) reads a queue's units and the records
they point at. Per unit, in queue order, `pull_units` applies getMessage's rules and
appends the messages found to `out`:

1. a pre-blank is passed; a unit that is no unit (offset < 0 or size <= 0), or whose
   offset lies below the end of the real unit just before it in `units`, is not written
   yet and ends the walk there (`UNWRITTEN`): the queue ends there for now. A reader
   in another process than the dispatcher can see a run of units the dispatcher writes
   with one slice write (memcpy) in part: its first bytes stored last (glibc's memcpy
   stores the first vector after the rest), so the units after it already look valid
   and the read-only refresh's search sets the queue's end past them. Passing such a
   unit lost its message for good (the consumer moved past it); one whose offset was
   still zero with its size written gave the record at offset 0 again (a duplicate);
2. a real unit when `out` is full (`max_count` messages, or its size would take the
   sizes added past `max_bytes`) ends the walk before it (`FULL`): the pull ends there;
3. the tag-code filter (`codes`: the `TAGS` hashes wanted; a ConsumeQueueExt address
   is no code and passes) may pass the unit over;
4. the record must start at the unit's offset, end at or below `limit`, be valid
   (`engine.record.check_record`, body CRC checked) and be as long as the unit says;
   otherwise the unit is *removing* (RocketMQ's MESSAGE_WAS_REMOVING when nothing was
   found before it) and passed;
5. a filler (`engine.filler.is_filler`) is passed, and so is a record whose `TAGS` is
   not one of `wanted`;
6. the record becomes a message: `engine.record.decode`'s `DecodedRecord`, or with
   `zero_copy` a `RecordView` whose body is a slice of `log`; or, with `into` an
   (owner, tag) pair, a *lazy* message of the class `register_lazy` named (a group
   consumer's `ConsumedMessage`): the record's bytes, its body (None when compressed),
   its queue offset, the owner and tag given, done False, nothing cached. Nothing else
   of the record is decoded until asked (its properties, hosts, msg id: ~20 objects a
   message fewer than a `DecodedRecord`).

`log` is the commit log's bytes from offset `log_base`: one mapped segment, cut at the
limit. A unit whose record lies below the limit but outside `log` stops the walk
(`NEED_LOG`) at that unit: the caller maps the segment holding it and calls again from
there (or, when no segment holds it, takes it as removing and goes on after it).

Returns (the next unit, why it stopped, the sizes added, whether a unit was removing).
Units from `start` on are walked; the walk is resumable: pass back the next unit, the
sizes and the same `out`.

`pull_units` is the C twin (`mqstore._native.pull_units`, engine/native/mqs_pull.c and
mqs_pull_py.c): each message object is made in C, its slots filled, with no Python code
run per message. `pull_units_py` is the reference, step by step with
`engine.record.check_record` and `decode`; tests/native/test_pull_diff.py compares the
two message by message, field by field. Cost: O(units walked + bytes of the records
taken) (the CRC), one object per message and per field.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, Final

from mqstore import _native
from mqstore.engine.consumequeue_files import CQ_STORE_UNIT_SIZE, PRE_BLANK_SIZE, UNIT
from mqstore.engine.filler import is_filler
from mqstore.engine.record import PROPERTY_TAGS, Buffer, CheckStatus, SysFlag, check_record
from mqstore.engine.record_decode import DecodedRecord, RecordFields, RecordView, decode
from mqstore.engine.recordcodes import format_host, tags_code

MAX_EXT_ADDR: Final = -2_147_483_649  # ConsumeQueueExt addresses are <= this (spec §3.2)

Walk = tuple[int, int, int, bool]  # (next unit, PullStop, sizes added, removing)
# the roles of a lazy message's slots, in the order `register_lazy` names them
LAZY_ROLES: Final = ("raw", "body", "queue_offset", "owner", "tag", "done", "cache")
_lazy: list[tuple[type[Any], tuple[str, ...]]] = []  # what register_lazy set


class PullStop(enum.IntEnum):
    """Why a walk stopped (mqs_pull.h's mqs_pull_step)."""

    END = 0  # every unit was walked
    FULL = 1  # the unit at `next unit` is real and `out` is full: the pull ends before it
    NEED_LOG = 2  # the unit at `next unit` wants a record outside `log`, below the limit
    UNWRITTEN = 4  # the unit at `next unit` is not written yet: the queue ends there for now


@dataclasses.dataclass(frozen=True, slots=True)
class TagFilter:
    """A pull's `tags` ("a || b"): the tags kept and their codes; None keeps every
    message (no filter, "" or "*")."""

    wanted: frozenset[str] | None
    codes: tuple[int, ...] | None

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def of(tags: str | None) -> TagFilter:
        """Cached: a consumer pulls with the same filter again and again."""
        if tags is None:
            return _EVERY
        items = frozenset(t.strip() for t in tags.split("||") if t.strip())
        if not items or "*" in items:
            return _EVERY
        return TagFilter(items, tuple(sorted({tags_code(t) for t in items})))


_EVERY: Final = TagFilter(None, None)


def _real_end(units: Buffer, i: int) -> int:
    """Where the record of real unit i ends; 0 for a pre-blank or no unit."""
    off, size, _code = UNIT.unpack_from(units, i * CQ_STORE_UNIT_SIZE)
    return 0 if size == PRE_BLANK_SIZE or off < 0 or size <= 0 else int(off + size)


def _check_args(units: Buffer, start: int, log_base: int, max_count: int) -> int:
    """The number of units; ValueError as the C door raises it."""
    size = memoryview(units).nbytes
    if size % CQ_STORE_UNIT_SIZE:
        raise ValueError("units must hold whole 20-byte units")
    n = size // CQ_STORE_UNIT_SIZE
    if not 0 <= start <= n:
        raise ValueError(f"start {start} is not a unit of units")
    if log_base < 0:
        raise ValueError("log_base must not be negative")
    if max_count < 1:
        raise ValueError("max_count must be at least 1")
    return n


def _message(view: memoryview, pos: int, end: int, zero_copy: bool) -> RecordFields | None:
    """The valid record (CRC checked) at view[pos:], ending at or below `end`, decoded."""
    h = check_record(view, pos, check_crc=True, limit=end)
    if h.status is not CheckStatus.OK:
        return None
    rec = decode(view, pos, limit=end)
    if not zero_copy:
        return rec
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}
    fields["body"] = view[h.body_pos : h.body_pos + h.body_len]
    return RecordView(**fields)


def _lazy_message(
    view: memoryview, pos: int, rec: RecordFields, into: tuple[object, object]
) -> object:
    """The lazy message of `rec` (at view[pos:]) for `into`, its slots set by role."""
    cls, names = _lazy[0]
    obj = object.__new__(cls)
    body = None if rec.sys_flag & SysFlag.COMPRESSED else bytes(rec.body)
    raw = bytes(view[pos : pos + rec.size])
    for name, value in zip(
        names, (raw, body, rec.queue_offset, into[0], into[1], False, None), strict=True
    ):
        setattr(obj, name, value)
    return obj


def _check_into(into: object, zero_copy: bool) -> tuple[object, object] | None:
    """`into` as the C door checks it."""
    if into is None:
        return None
    if type(into) is not tuple or len(into) != 2:
        raise TypeError("into must be None or an (owner, tag) tuple")
    if zero_copy is True:
        raise ValueError("a pull into an owner takes zero_copy False")
    if not _lazy:
        raise RuntimeError("a pull into an owner before pull_register_lazy")
    return into[0], into[1]


def pull_units_py(
    units: Buffer,
    start: int,
    log: Buffer,
    log_base: int,
    limit: int,
    codes: tuple[int, ...] | None,
    wanted: frozenset[str] | None,
    max_count: int,
    max_bytes: int,
    got_bytes: int,
    zero_copy: bool,
    out: list[Any],
    into: tuple[object, object] | None = None,
) -> Walk:
    """The reference walk: see the module docstring (its steps are numbered here)."""
    lazy = _check_into(into, zero_copy)
    n = _check_args(units, start, log_base, max_count)
    view = memoryview(log).cast("B")
    end = min(len(view), limit - log_base)
    removing = False
    i = start
    while i < n:
        off, size, code = UNIT.unpack_from(units, i * CQ_STORE_UNIT_SIZE)
        if size == PRE_BLANK_SIZE:  # 1
            i += 1
            continue
        if off < 0 or size <= 0 or (i > 0 and off < _real_end(units, i - 1)):  # 1
            return i, PullStop.UNWRITTEN.value, got_bytes, removing
        if out and (len(out) >= max_count or got_bytes + size > max_bytes):  # 2
            return i, PullStop.FULL.value, got_bytes, removing
        if codes is not None and code > MAX_EXT_ADDR and code not in codes:  # 3
            i += 1
            continue
        if off >= limit:  # 4: not readable yet
            removing |= not out
            i += 1
            continue
        if not log_base <= off < log_base + len(view):
            return i, PullStop.NEED_LOG.value, got_bytes, removing
        rec = _message(view, off - log_base, end, zero_copy)
        i += 1
        if rec is None or rec.size != size:  # 4
            removing |= not out
            continue
        if is_filler(rec):  # 5
            continue
        if wanted is not None and rec.properties.get(PROPERTY_TAGS) not in wanted:
            continue
        out.append(rec if lazy is None else _lazy_message(view, off - log_base, rec, lazy))  # 6
        got_bytes += size
    return n, PullStop.END.value, got_bytes, removing


pull_units: Final = _native.pull_units  # the C twin, what reads call


def _register() -> None:
    """Tell the C builder which classes to make: their slots are RecordFields' fields."""
    names = [
        tuple(f.name for f in dataclasses.fields(c))
        for c in (RecordFields, DecodedRecord, RecordView)
    ]
    if len(set(names)) != 1:
        raise TypeError("DecodedRecord and RecordView must have RecordFields' fields")
    _native.pull_register(DecodedRecord, RecordView, names[0], format_host)


def register_lazy(cls: type, names: tuple[str, ...]) -> None:
    """The class a pull `into` an owner builds: `names` are its slots for `LAZY_ROLES`,
    in that order (each an object slot)."""
    _native.pull_register_lazy(cls, names)
    _lazy[:] = [(cls, names)]


_register()
