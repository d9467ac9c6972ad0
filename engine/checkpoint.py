"""`<store>/checkpoint`: RocketMQ's StoreCheckpoint, byte for byte (spec §5).

One 4096-byte page, big-endian signed longs:

| off  | size | field                  | written by (in memory)                       | version |
| ---- | ---- | ---------------------- | -------------------------------------------- | ------- |
| 0    | 8    | physic_msg_timestamp   | the flusher, after a thorough flush          | all     |
| 8    | 8    | logics_msg_timestamp   | the dispatcher's flush thread (a thorough    | all     |
|      |      |                        | flush's planned snapshot)                    |         |
| 16   | 8    | index_msg_timestamp    | the flush thread, once a full index file was | all     |
|      |      |                        | forced                                       |         |
| 24   | 8    | master_flushed_offset  | kept as read (RocketMQ 5.x HA)               | 5.x     |
| 32   | 8    | confirm_phy_offset     | kept as read (RocketMQ 5.x recovery)         | 5.x     |
| 40   | 4056 | zero (left as found)   |                                              |         |

Fields change in memory; `flush()` writes the 40 bytes with one pwrite at offset 0 and
fdatasyncs (RocketMQ puts them into its mapping and forces it: the same bytes). A 4.x
file reads 0 for the two 5.x fields and keeps its bytes past 40 untouched. A missing
file is created as 4096 zero bytes when opened for writing.

Who calls `flush()`: the dispatcher's flush thread (`workers.cq_flusher`) after a
thorough flush and after forcing a full index file, never past what it forced; recovery;
the supervisor at shutdown (spec §5). Readers may open it read-only.
"""

from __future__ import annotations

import os
import struct
from dataclasses import astuple, dataclass
from typing import Final

from mqstore.engine import fileio

CHECKPOINT_FILE: Final = "checkpoint"
CHECKPOINT_SIZE_BYTES: Final = 4096
MIN_TIMESTAMP_SLACK_MS: Final = 3000  # getMinTimestamp subtracts 3 s
_FIELDS = struct.Struct(">qqqqq")


class CheckpointError(ValueError):
    """The checkpoint file is too short to hold its fields."""


@dataclass
class CheckpointFields:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    def to_bytes(self) -> bytes:
        """The 40 field bytes (offsets 0..39)."""
        return _FIELDS.pack(*astuple(self))

    @classmethod
    def from_bytes(cls, raw: bytes) -> CheckpointFields:
        if len(raw) < _FIELDS.size:
            raise CheckpointError(f"checkpoint is {len(raw)} bytes; at least 40 are needed")
        return cls(*_FIELDS.unpack_from(raw, 0))

    def min_timestamp(self) -> int:
        """RocketMQ's getMinTimestamp: max(0, min(physic, logics) - 3000 ms)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def min_timestamp_index(self) -> int:
        """RocketMQ's getMinTimestampIndex: min(min_timestamp(), index)."""
        return min(self.min_timestamp(), self.index_msg_timestamp)


class StoreCheckpoint(CheckpointFields):
    """The checkpoint file, open. Fields are plain attributes; `flush()` persists them."""

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        """Open (or, when writable, create) the checkpoint. Raises StoreIOError,
        CheckpointError for a file shorter than 40 bytes."""
        self.path = os.fspath(path)
        self.read_only = read_only
        exists = os.path.exists(self.path)
        self._fd = fileio.open_file(self.path, create=not read_only, read_only=read_only)
        try:
            if exists:
                raw = fileio.pread(self._fd, CHECKPOINT_SIZE_BYTES, 0, self.path)
                fields = CheckpointFields.from_bytes(raw)
                if not read_only and len(raw) < CHECKPOINT_SIZE_BYTES:
                    fileio.ftruncate(self._fd, CHECKPOINT_SIZE_BYTES, self.path)
            else:
                # Real blocks, not a hole: rewriting the checkpoint never needs new space,
                # so a full disk cannot stop a flush or a boot (docs/durability.md).
                fileio.fallocate(self._fd, CHECKPOINT_SIZE_BYTES, self.path)
                fileio.fsync(self._fd, self.path)
                fileio.fsync_dir(os.path.dirname(self.path) or ".")
                fields = CheckpointFields()
        except BaseException:
            fileio.close(self._fd, self.path)
            raise
        super().__init__(*astuple(fields))
        self._closed = False

    @classmethod
    def open_in(
        cls, store_dir: str | os.PathLike[str], *, read_only: bool = False
    ) -> StoreCheckpoint:
        """`<store_dir>/checkpoint`."""
        return cls(os.path.join(store_dir, CHECKPOINT_FILE), read_only=read_only)

    def flush(self) -> None:
        """Write the five fields at offset 0 and fdatasync. Raises StoreIOError."""
        if self.read_only:
            raise PermissionError(f"{self.path}: opened read-only")
        fileio.pwrite(self._fd, self.to_bytes(), 0, self.path)
        fileio.fdatasync(self._fd, self.path)

    def close(self) -> None:
        """Close without flushing (RocketMQ's shutdown flushes first: call flush())."""
        if not self._closed:
            self._closed = True
            fileio.close(self._fd, self.path)

    def __enter__(self) -> StoreCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"StoreCheckpoint(physic={self.physic_msg_timestamp}, "
            f"logics={self.logics_msg_timestamp}, index={self.index_msg_timestamp}, "
            f"master_flushed={self.master_flushed_offset}, confirm={self.confirm_phy_offset})"
        )
