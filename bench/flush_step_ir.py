"""The flusher's flush step in a loop, for instruction counts (callgrind): one 1 KiB
record published, then `LogFiles.sync_round(0, 0)` (`round`) or the committer's
`commit(0)` and `LogFiles.flush_and_wake(0)` (`timed`), N times, on real files in one
8 MiB segment (`$TMPDIR`). Ir a round = (Ir at N2 - Ir at N1) / (N2 - N1), startup
cancelled out; user/sys/wall per round are printed too (noisy on a shared machine).

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m bench.flush_step_ir round 2200 [--pool-off]

`bench/results/flush_step_c.md` has the figures (the C timed flush against main's
Python one, the C round against main's)."""

from __future__ import annotations

import os
import resource
import secrets
import sys
import tempfile
import time
from pathlib import Path

from mqstore import _native
from mqstore.engine.segment import segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles
from mqstore.ipc.control_views import Flags, Positions, Reservation

SEG = 8 << 20
BODY = 1024


def main(mode: str, n: int, pool: bool) -> str:
    with tempfile.TemporaryDirectory(prefix="flush-step-ir-") as tmp:
        d = Path(tmp)
        (d / "commitlog").mkdir()
        for i in range(2):
            with open(d / "commitlog" / segment_file_name(i * SEG), "wb") as f:
                f.truncate(SEG)
        geo = c.Geometry(segment_size=SEG, pool_buffers=2 if pool else 0, slot_count=4096,
                         qtable_capacity=16)  # fmt: skip
        cb = c.ControlBlock.create(d, 1, geo, token=secrets.token_hex(4))
        Flags(cb).mark_running()
        pos, resv = Positions(cb), Reservation(cb)
        pos.raise_allocated(2 * SEG)
        files = LogFiles(str(d), cb, "127.0.0.1:10911")
        fd = os.open(d / "commitlog" / segment_file_name(0), os.O_WRONLY)
        data, at, seq = b"x" * BODY, 0, 0
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(n):
            if pool:
                view = cb.pool_view(0)
                view[at : at + BODY] = data
                view.release()
            else:
                os.pwrite(fd, data, at)
            row = c.SLOTS_OFF + (seq % cb.slot_count) * c.SLOT_ROW
            c.SLOT.pack_into(cb.buf, row, at, seq, 1000 + seq, BODY, os.getpid(), 0, c.STATE_DONE)
            at, seq = at + BODY, seq + 1
            resv.commit_reservation(at, seq)
            _native.publish(cb.buf)
            cb.set(c.OFF_SYNC_REQUEST, at)
            if mode == "round":
                forced = files.sync_round(0, 0) is not None
            else:
                files.commit(0)
                forced = files.flush_and_wake(0) is not None
            assert forced
        r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        assert pos.flushed == at
        os.close(fd)
        files.close()
        cb.close()
    us = 1e6 / n
    return (
        f"{mode} n={n} pool={pool}: user {(r1.ru_utime - r0.ru_utime) * us:.1f} µs, "
        f"sys {(r1.ru_stime - r0.ru_stime) * us:.1f} µs, wall {(w1 - w0) * us:.1f} µs a round"
    )


if __name__ == "__main__":
    print(main(sys.argv[1], int(sys.argv[2]), "--pool-off" not in sys.argv))
