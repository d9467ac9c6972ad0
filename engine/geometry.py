"""The store's geometry: the file sizes its files are laid out by, and the record of them
that the store keeps (as Kafka's `meta.properties`).

| setting                         | `Geometry` field     | what depends on it                |
| ------------------------------- | -------------------- | --------------------------------- |
| `segment_size_bytes`            | `segment_size_bytes` | commit-log file names and offsets |
| `consume_queue_file_size_bytes` | `cq_file_size_bytes` | consume-queue file names          |
| `max_hash_slot_num`             | `hash_slot_num`      | index file layout                 |
| `max_index_num`                 | `index_num`          | index file layout                 |

The supervisor records them in `config/geometry.json` (`RECORD_FILE`, owner-only JSON
named by the settings) at a store's first start, once recovery has opened the files with
them: a new store at its creation, a store written by RocketMQ or by an older mqstore
(which has no record) at the first start that opens it with the settings given. From
then on the store owns them:

* a start whose settings differ refuses, naming the setting, the recorded value and the
  value given (`check_settings` raises GeometryMismatch: a configuration error, exit 3);
  a worker restarted after its config file changed warns so and keeps the record's;
* clients take them from the supervisor at attach, and the offline tools (`check`,
  `dump`, `recover`, the reader) from the record (`Geometry.of`), whatever the settings
  say;
* a store without the record is checked against its files instead: a segment or queue
  file of another size than the settings give refuses the start the same way.

The record is written once and never changed; nothing in mqstore rewrites it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio

if TYPE_CHECKING:  # the type checker sees the dataclass that engine.frozen's behaves as
    from dataclasses import dataclass
else:  # no `dataclasses` (and its `inspect`) at a producer's import
    from mqstore.engine.frozen import dataclass

RECORD_FILE: Final = os.path.join("config", "geometry.json")
# Each Geometry field and the setting it comes from (the record is keyed by setting).
SETTING_OF: Final = {
    "segment_size_bytes": "segment_size_bytes",
    "cq_file_size_bytes": "consume_queue_file_size_bytes",
    "hash_slot_num": "max_hash_slot_num",
    "index_num": "max_index_num",
}


class GeometryMismatch(ValueError):
    """The settings give a store other file sizes than it has (a configuration error)."""


class GeometryRecordError(ValueError):
    """The store's geometry record cannot be read or is not one."""


@dataclass(frozen=True, slots=True)
class Geometry:
    """File sizes of a store: its record's, else what its files say, else the settings."""

    segment_size_bytes: int
    cq_file_size_bytes: int
    hash_slot_num: int
    index_num: int

    @classmethod
    def of(cls, store_dir: str | os.PathLike[str], settings: StoreSettings) -> Geometry:
        """The store's geometry: the record, else the files, else the settings. Raises
        GeometryRecordError for a record that is not one."""
        d = os.fspath(store_dir)
        recorded = read_record(d)
        if recorded is not None:
            return recorded
        from mqstore.engine.consumequeue_files import detect_file_size

        return cls(
            _segment_size_in_files(d) or settings.segment_size_bytes,
            detect_file_size(d) or settings.consume_queue_file_size_bytes,
            settings.max_hash_slot_num,
            settings.max_index_num,
        )

    @classmethod
    def from_settings(cls, s: StoreSettings) -> Geometry:
        return cls(**{f: getattr(s, setting) for f, setting in SETTING_OF.items()})


def _segment_size_in_files(store_dir: str) -> int | None:
    """The largest commit-log file's size (a torn copy can leave the last one short)."""
    from mqstore.engine.storedir import list_segments  # the file layer: not for clients

    sizes = [seg.size_bytes for seg in list_segments(store_dir) if seg.size_bytes > 0]
    return max(sizes) if sizes else None


def record_path(store_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(store_dir), RECORD_FILE)


def read_record(store_dir: str | os.PathLike[str]) -> Geometry | None:
    """The recorded geometry, or None when the store has no record. Raises
    GeometryRecordError for one that cannot be read or holds anything but the four
    positive integers (a symbolic link is not followed)."""
    path = record_path(store_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise GeometryRecordError(f"{path}: cannot read the store's geometry: {e}") from e
    try:
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise GeometryRecordError(f"{path}: not JSON ({e})") from e
    if not isinstance(doc, dict) or set(doc) != set(SETTING_OF.values()):
        raise GeometryRecordError(f"{path}: not a geometry record: {raw[:200]!r}")
    values = {f: doc[setting] for f, setting in SETTING_OF.items()}
    bad = {f: v for f, v in values.items() if type(v) is not int or v <= 0}
    if bad:
        raise GeometryRecordError(f"{path}: not a geometry record: {bad}")
    return Geometry(**values)


def write_record(store_dir: str | os.PathLike[str], geometry: Geometry) -> None:
    """Record `geometry` in the store (atomically, fsynced). Supervisor only, at boot,
    when `read_record` found none. Raises StoreIOError."""
    fileio.makedirs(os.path.join(os.fspath(store_dir), "config"))
    doc = {setting: getattr(geometry, f) for f, setting in SETTING_OF.items()}
    fileio.write_file_atomic(record_path(store_dir), json.dumps(doc, indent=1).encode())


def check_settings(
    store_dir: str | os.PathLike[str],
    settings: StoreSettings,
    source_of: Callable[[str], str] = lambda _name: "given",
) -> Geometry | None:
    """Refuse settings that give the store other file sizes than it has: the record's,
    or for a store without one, those of its files. Returns the recorded geometry (None
    without a record). Raises GeometryMismatch naming the setting and both values
    (`source_of(setting)` says where the given value came from), GeometryRecordError."""
    given = Geometry.from_settings(settings)
    recorded = read_record(store_dir)
    if recorded is not None:
        have, where = recorded, f"the store records (in {RECORD_FILE})"
    else:
        from mqstore.engine.consumequeue_files import detect_file_size

        d = os.fspath(store_dir)
        have = Geometry(
            _segment_size_in_files(d) or given.segment_size_bytes,
            detect_file_size(d) or given.cq_file_size_bytes,
            given.hash_slot_num,
            given.index_num,
        )
        where = "the store's files are"
    for f, setting in SETTING_OF.items():
        want, got = getattr(have, f), getattr(given, f)
        if want != got:
            raise GeometryMismatch(
                f"{setting}: {where} {want}, but the settings give {got} "
                f"({source_of(setting)}); start the store with the settings it was created "
                f"with ({setting} = {want})"
            )
    return recorded


def with_record(store_dir: str | os.PathLike[str], settings: StoreSettings) -> StoreSettings:
    """`settings` with the store's recorded geometry in place of theirs (unchanged for a
    store without a record): what the offline tools open a store with. Raises
    GeometryRecordError."""
    recorded = read_record(store_dir)
    if recorded is None:
        return settings
    return settings.replace(**{setting: getattr(recorded, f) for f, setting in SETTING_OF.items()})
