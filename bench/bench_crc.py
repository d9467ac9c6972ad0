"""What a record's CRC costs on this machine: `_native.crc32` (folding where the CPU has
PCLMULQDQ or VPCLMULQDQ, engine/native/mqs_crc32.c), its portable slicing-by-8
(`_native.crc32_slice8`) and zlib's, per call, by input size.

    python -m bench.bench_crc [--sizes 64,256,1024,4096] [--repeat 7]

Each figure is the best of `--repeat` timings of a loop over one buffer (warm caches: the
put's CRC runs over a body it has just copied), in ns per call. The three agree on every
input (asserted here too; tests/native compares them under Hypothesis).
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from collections.abc import Callable

from mqstore import _native


def _ns_per_call(fn: Callable[[bytes], int], data: bytes, repeat: int) -> float:
    loops = max(1000, 2_000_000 // max(len(data), 1))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn(data)
        best = min(best, (time.perf_counter_ns() - t0) / loops)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,256,1024,4096")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    impls: dict[str, Callable[[bytes], int]] = {
        "_native.crc32": _native.crc32,
        "crc32_slice8": _native.crc32_slice8,
        "zlib.crc32": zlib.crc32,
    }
    print(f"load {os.getloadavg()[0]:.1f}; ns per call, best of {args.repeat}")
    print(f"{'bytes':>6} " + " ".join(f"{n:>15}" for n in impls))
    for size in (int(s) for s in args.sizes.split(",")):
        data = os.urandom(size)
        crcs = {fn(data) for fn in impls.values()}
        assert len(crcs) == 1, f"the implementations disagree on {size} bytes"
        row = [_ns_per_call(fn, data, args.repeat) for fn in impls.values()]
        print(f"{size:>6} " + " ".join(f"{ns:>15.0f}" for ns in row))


if __name__ == "__main__":
    main()
