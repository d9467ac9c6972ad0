"""The plain reader: one process, one record at a time, through `engine.record.decode`.

This is the yardstick the data source is measured and tested against: the most direct
way to read a local store with the engine's codec. Each segment is read from its first
byte, record after record, until a BLANK, the first record that fails its checks, or the
readable end (the flushed offset of a live store). Fillers (`engine.filler`) are not
messages and are skipped; records whose body CRC does not match are skipped unless asked
for.

Who may call: the benchmark, tests, anyone wanting a simple local read. Cost: one read of
each segment, then several microseconds of Python per record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from mqstore.engine import compression, fileio, record_decode, storedir
from mqstore.engine import record as rec
from mqstore.engine.filler import is_filler


def read_file(path: str) -> bytes:
    """The whole file, through the engine's disk door."""
    fd = fileio.open_file(path, create=False, read_only=True)
    try:
        size = os.fstat(fd).st_size
        return fileio.pread(fd, size, 0, path) if size else b""
    finally:
        fileio.close(fd, path)


def iter_records(
    store_dir: str | os.PathLike[str], *, include_corrupt: bool = False
) -> Iterator[record_decode.DecodedRecord]:
    """Every message record of a local store, in commit-log order; a compressed body
    (sysFlag 0x1) inflated to its original bytes, as the data source gives it."""
    flushed = storedir.read_flushed_offset(store_dir)
    for seg in storedir.list_segments(store_dir):
        if seg.size_bytes == 0:
            continue
        buf = read_file(seg.path)
        limit = len(buf) if flushed is None else max(0, min(len(buf), flushed - seg.start_offset))
        pos = 0
        while pos < limit:
            try:
                d = record_decode.decode(buf, pos, limit=limit)
            except rec.RecordError:
                break
            if d.physical_offset != seg.start_offset + pos:
                break
            if (d.crc_ok or include_corrupt) and not is_filler(d):
                yield compression.inflate(d) if d.crc_ok else d
            pos += d.size
