"""The idempotence table rebuilt from the log, at every start.

The table that recognises a retried put (`ipc/native/mqs_uniq.h`) lives in the control
block, which a supervisor's death takes with it. Before a new block serves, the
supervisor walks the tail of the recovered log (`REBUILD_BYTES` before its end, from the
start of the segment that holds that point) and notes every record's UNIQ_KEY there as
stored, in log order, as Kafka rebuilds its producer state from the log's last segments
(the first record of a key wins, as in the live table: send_back and the scheduler put
copies with the original's UNIQ_KEY later, which a retry must not be answered with):
a retry after a restart then finds the put it repeats, whether the old run
acknowledged it or not. The window per producer is the table's (`IDEM_WINDOW` puts), so a
producer's older records are simply overwritten as the walk goes on.
"""

from __future__ import annotations

import mmap
import os
import re
import time
from typing import Final

from mqstore import _native
from mqstore.engine.scan import BIT_FILLER, scan_records
from mqstore.engine.segment import segment_file_name
from mqstore.ipc import control as c

REBUILD_BYTES: Final = 64 * 1024 * 1024
MAX_AGE_MS: Final = 24 * 3600 * 1000  # the table does not match older entries
_KEY: Final = re.compile(rb"UNIQ_KEY\x01([0-9A-Fa-f]{32})\x02")


def rebuild(store_dir: str, cb: c.ControlBlock, end: int, seg_size: int) -> int:
    """Note the UNIQ_KEYs of the records in the last REBUILD_BYTES before `end` in `cb`'s
    table; returns how many."""
    first = max(0, end - REBUILD_BYTES) // seg_size * seg_size
    oldest = time.time_ns() // 1_000_000 - MAX_AGE_MS
    noted = 0
    for base in range(first, end, seg_size):
        path = os.path.join(store_dir, "commitlog", segment_file_name(base))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            noted += _note_segment(cb, mm, base, min(end - base, len(mm)), oldest)
        finally:
            mm.close()
    return noted


def _note_segment(cb: c.ControlBlock, mm: mmap.mmap, base: int, limit: int, oldest: int) -> int:
    scan = scan_records(mm, 0, limit, check_crc=False)
    noted = 0
    for i in range(scan.count):
        if scan.bits[i] & BIT_FILLER or scan.store_timestamp[i] < oldest:
            continue
        p, n = scan.props_pos[i], scan.props_len[i]
        hit = _KEY.search(mm, p, p + n)
        if hit is None or (hit.start() != p and mm[hit.start() - 1] != 2):
            continue
        key = hit.group(1).decode()
        if _native.idem_find(cb.buf, key) is not None:
            continue  # a later record of the key (a send-back's or scheduler's copy)
        _native.idem_note(
            cb.buf, key, base + scan.pos[i], scan.size[i],
            scan.queue_id[i], scan.queue_offset[i], scan.store_timestamp[i],
        )  # fmt: skip
        noted += 1
    return noted
