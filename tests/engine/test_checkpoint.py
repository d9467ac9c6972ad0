"""StoreCheckpoint: byte-identical to RocketMQ's, reads a real broker's file."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.engine import fileio
from mqstore.engine.checkpoint import CHECKPOINT_SIZE_BYTES, CheckpointError, StoreCheckpoint

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "checkpoint.bin"
GOLDEN_FIELDS = (1700000000123, 1700000000456, 1699999999000, 123456789, 987654321)


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    fileio.clear_faults()
    yield
    fileio.clear_faults()


def test_new_checkpoint_is_a_zero_page(tmp_path: Path) -> None:
    with StoreCheckpoint.open_in(tmp_path) as cp:
        assert cp.physic_msg_timestamp == 0 and cp.min_timestamp() == 0
    assert (tmp_path / "checkpoint").read_bytes() == bytes(CHECKPOINT_SIZE_BYTES)


def test_flush_writes_the_golden_bytes(tmp_path: Path) -> None:
    with StoreCheckpoint(tmp_path / "checkpoint") as cp:
        (
            cp.physic_msg_timestamp,
            cp.logics_msg_timestamp,
            cp.index_msg_timestamp,
            cp.master_flushed_offset,
            cp.confirm_phy_offset,
        ) = GOLDEN_FIELDS
        cp.flush()
    assert (tmp_path / "checkpoint").read_bytes() == GOLDEN.read_bytes()


def test_golden_reads_back(tmp_path: Path) -> None:
    shutil.copy(GOLDEN, tmp_path / "checkpoint")
    with StoreCheckpoint(tmp_path / "checkpoint", read_only=True) as cp:
        got = (
            cp.physic_msg_timestamp,
            cp.logics_msg_timestamp,
            cp.index_msg_timestamp,
            cp.master_flushed_offset,
            cp.confirm_phy_offset,
        )
        assert got == GOLDEN_FIELDS
        assert cp.min_timestamp() == 1700000000123 - 3000
        assert cp.min_timestamp_index() == 1700000000123 - 3000  # index is later
        with pytest.raises(PermissionError):
            cp.flush()


def test_reads_a_real_rocketmq_checkpoint(real_store_copy: object) -> None:
    copy = real_store_copy("broker-checkpoint")  # type: ignore[operator]
    path = Path(copy) / "checkpoint"
    before = path.read_bytes()
    with StoreCheckpoint(path) as cp:
        assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == 1551626238066
        assert cp.index_msg_timestamp == 0
        assert (cp.master_flushed_offset, cp.confirm_phy_offset) == (0, 0)
        assert cp.min_timestamp() == 1551626238066 - 3000
        assert cp.min_timestamp_index() == 0
        cp.flush()  # rewriting the same fields leaves the file byte-identical
    assert path.read_bytes() == before


def test_min_timestamp_never_negative(tmp_path: Path) -> None:
    with StoreCheckpoint(tmp_path / "checkpoint") as cp:
        cp.physic_msg_timestamp = 1000
        cp.logics_msg_timestamp = 5000
        assert cp.min_timestamp() == 0


def test_short_file_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_bytes(b"\0" * 10)
    with pytest.raises(CheckpointError):
        StoreCheckpoint(tmp_path / "checkpoint")


def test_fsync_failure_raises(tmp_path: Path) -> None:
    with StoreCheckpoint(tmp_path / "checkpoint") as cp:
        cp.physic_msg_timestamp = 1
        fileio.set_fault("fdatasync", lambda: OSError(errno.EIO, "injected"))
        with pytest.raises(fileio.StoreIOError) as ei:
            cp.flush()
        assert ei.value.op == "fdatasync"
