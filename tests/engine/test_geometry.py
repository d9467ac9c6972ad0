"""The geometry record (`engine.geometry`): written once, read back exactly; anything
else in its place is a GeometryRecordError, never a traceback of another kind; settings
that disagree with the record or with a record-less store's files are refused, naming
the setting and both values."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from mqstore.conf.settings import StoreSettings
from mqstore.engine.geometry import (
    RECORD_FILE,
    Geometry,
    GeometryMismatch,
    GeometryRecordError,
    check_settings,
    read_record,
    with_record,
    write_record,
)

SMALL = StoreSettings(segment_size_bytes=1 << 20, consume_queue_file_size_bytes=2000)


def test_the_record_is_read_back_and_wins(tmp_path: Path) -> None:
    assert read_record(tmp_path) is None
    geo = Geometry.from_settings(SMALL)
    write_record(tmp_path, geo)
    assert read_record(tmp_path) == geo
    assert Geometry.of(tmp_path, StoreSettings()) == geo
    assert with_record(tmp_path, StoreSettings()).segment_size_bytes == 1 << 20
    assert os.stat(tmp_path / RECORD_FILE).st_mode & 0o777 == 0o600
    assert check_settings(tmp_path, SMALL) == geo


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("segment_size_bytes", 64 << 20),
        ("consume_queue_file_size_bytes", 6_000_000),
        ("max_hash_slot_num", 7),
        ("max_index_num", 9),
    ],
)
def test_other_settings_are_refused_naming_both(tmp_path: Path, field: str, value: int) -> None:
    write_record(tmp_path, Geometry.from_settings(SMALL))
    have = getattr(SMALL, field)
    with pytest.raises(GeometryMismatch, match=rf"{field}: .*records.* {have}, .* give {value}"):
        check_settings(tmp_path, dataclasses.replace(SMALL, **{field: value}))


def test_a_store_without_record_is_checked_against_its_files(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / "00000000000000000000").write_bytes(bytes(8192))
    with pytest.raises(GeometryMismatch, match="files are 8192, but the settings give 1048576"):
        check_settings(tmp_path, SMALL)
    ok = dataclasses.replace(SMALL, segment_size_bytes=8192)
    assert check_settings(tmp_path, ok) is None


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"segment_size_bytes": 1}',
        b'{"segment_size_bytes": -1, "consume_queue_file_size_bytes": 20, '
        b'"max_hash_slot_num": 1, "max_index_num": 1}',
        b'{"segment_size_bytes": true, "consume_queue_file_size_bytes": 20, '
        b'"max_hash_slot_num": 1, "max_index_num": 1}',
        b'{"segment_size_bytes": 1.5, "consume_queue_file_size_bytes": 20, '
        b'"max_hash_slot_num": 1, "max_index_num": 1}',
        b"[" * 100_000,
    ],
)
def test_anything_else_is_a_record_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / RECORD_FILE).write_bytes(content)
    with pytest.raises(GeometryRecordError):
        read_record(tmp_path)


def test_a_linked_record_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_record(elsewhere, Geometry.from_settings(SMALL))
    (tmp_path / "config").mkdir()
    (tmp_path / RECORD_FILE).symlink_to(elsewhere / RECORD_FILE)
    with pytest.raises(GeometryRecordError, match="cannot read"):
        read_record(tmp_path)
