"""Builds the golden consume-queue and index files (`tests/data/golden/`).

* `consumequeue-small.bin`: a queue of 100-byte files (5 units each) holding queue
  offsets 0..6, the two files concatenated (200 bytes).
* `index-small.bin`: an index file of 8 slots x 16 entries (392 bytes) with 6 keys, two
  of which share a hash ("Aa" and "BB" have the same Java hashCode).

Run as a module to rewrite them after a deliberate format change:

    python -m tests.engine.cq_index_golden
"""

from __future__ import annotations

from pathlib import Path

from mqstore.engine.consumequeue import ConsumeQueue
from mqstore.engine.indexfile import IndexFile
from mqstore.engine.segment_queue import SegmentQueue

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "data" / "golden"
CQ_GOLDEN = GOLDEN_DIR / "consumequeue-small.bin"
INDEX_GOLDEN = GOLDEN_DIR / "index-small.bin"
CQ_FILE_SIZE = 100
CQ_UNITS = [(i * 150, 150, 1722 if i % 2 else 0) for i in range(7)]  # 1722 = hash("60")
INDEX_SLOTS, INDEX_ENTRIES = 8, 16
INDEX_KEYS = [
    ("T#k1", 0, 1_700_000_000_000),
    ("T#k2", 150, 1_700_000_001_000),
    ("T#Aa", 300, 1_700_000_002_500),
    ("T#BB", 450, 1_700_000_003_000),
    ("T#k1", 600, 1_700_000_010_999),
    ("Other#k1", 750, 1_700_000_011_000),
]


def build_cq(directory: Path) -> ConsumeQueue:
    cq = ConsumeQueue(SegmentQueue(directory, CQ_FILE_SIZE), "T", 0).load()
    cq.recover()
    for qo, (phy, size, tags) in enumerate(CQ_UNITS):
        cq.put(phy, size, tags, qo)
    return cq


def cq_bytes(cq: ConsumeQueue) -> bytes:
    return b"".join(Path(seg.path).read_bytes() for seg in cq.queue.segments)


def build_index(directory: Path) -> IndexFile:
    f = IndexFile.create(directory, INDEX_SLOTS, INDEX_ENTRIES, now_ms_value=1_700_000_000_000)
    for key, phy, ts in INDEX_KEYS:
        assert f.put_key(key, phy, ts)
    return f


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cq = build_cq(Path(tmp) / "cq")
        CQ_GOLDEN.write_bytes(cq_bytes(cq))
        cq.close()
        f = build_index(Path(tmp) / "index")
        INDEX_GOLDEN.write_bytes(Path(f.path).read_bytes())
        f.close()


if __name__ == "__main__":
    main()
