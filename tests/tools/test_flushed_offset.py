"""The live-store flushed-offset file: round trip through a real file, absent and invalid cases."""

from collections.abc import Callable
from pathlib import Path

from mqstore.engine import fileio
from mqstore.engine.storedir import (
    FLUSHED_OFFSET_FILE,
    list_segments,
    read_flushed_offset,
    write_flushed_offset,
)


def test_round_trip_and_in_place_update(tmp_path: Path) -> None:
    path = tmp_path / FLUSHED_OFFSET_FILE
    fd = fileio.open_file(path, create=True)
    try:
        write_flushed_offset(fd, 1234, str(path))
        assert read_flushed_offset(tmp_path) == 1234
        write_flushed_offset(fd, 2**40, str(path))
        assert read_flushed_offset(tmp_path) == 2**40
    finally:
        fileio.close(fd, path)
    assert path.stat().st_size == 16


def test_absent_or_invalid_is_none(tmp_path: Path) -> None:
    assert read_flushed_offset(tmp_path) is None
    (tmp_path / FLUSHED_OFFSET_FILE).write_bytes(b"WRONGMAG" + (5).to_bytes(8, "big"))
    assert read_flushed_offset(tmp_path) is None
    (tmp_path / FLUSHED_OFFSET_FILE).write_bytes(b"MQFLUSH1")
    assert read_flushed_offset(tmp_path) is None


def test_list_segments_of_real_store(real_store_copy: Callable[[str], Path]) -> None:
    store = real_store_copy("broker-4.2-unit-store")
    segs = list_segments(store)
    assert segs, "the 4.2 unit store has commit-log files"
    assert [s.start_offset for s in segs] == sorted(s.start_offset for s in segs)
    assert segs[0].start_offset == 0
