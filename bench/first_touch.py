"""What first writes to memory cost on this VM, by how much has been touched already:
one process maps `--gib` GiB of anonymous memory and writes one byte to each 4 KiB page,
256 MiB at a time, and prints each chunk's milliseconds (a Python loop of 65,536 writes,
~150 ms of it, is in every chunk).

    python -m bench.first_touch [--gib 10]

A page-cache page the committer's pwrite fills is new memory the same way: if chunks
get several times dearer past some GiB, so does the committer's copy once a run has
written that much (bench/results/dispatch_lag.md, stop 35).
"""

from __future__ import annotations

import argparse
import mmap
import time

CHUNK = 256 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=int, default=10)
    n = ap.parse_args().gib * 4
    m = mmap.mmap(-1, CHUNK * n)
    out = []
    try:
        for c in range(n):
            t = time.perf_counter()
            for off in range(c * CHUNK, (c + 1) * CHUNK, 4096):
                m[off] = 1
            out.append((time.perf_counter() - t) * 1000)
    finally:
        m.close()
    print(" ".join(f"{ms:.0f}" for ms in out))


if __name__ == "__main__":
    main()
