"""The committer's copy without the store: what a pwrite from a shared-memory pool into a
new segment costs, with and without the segment read into the page cache first.

    python -m bench.commit_first_touch [--mib 512] [--rate 400] [--runs 3] [--dir DIR]
        [--modes cold,split,pages,folios] [--split-kib 64] [--tick-ms 2]

A writer process fills a shared-memory ring with 1 KiB records at `--rate` MB/s (the
producers); this process (the committer) pwrites `[committed, published)` into a
fallocated file whenever 16 KiB or more is there, then sleeps `--tick-ms` (the
committer's tick). Each run makes a new file in `--dir` (default: the current directory,
so the disk the store would use) and tries each mode in turn:

* `cold`: one pwrite per round (the committer before `fileio.COMMIT_PIECE`);
* `split`: pwrites that end on multiples of `--split-kib` (the committer now);
* `pages`: the file read once first with readahead off (`POSIX_FADV_RANDOM`: 4 KiB
  pages), then `cold` (a warm-up by the allocator, tried and withdrawn);
* `folios`: the file read once first with readahead on (large folios), then `cold`.

Prints the copy's CPU per KiB and the read's, and how much free memory the VM gave back
to its host meanwhile (`/sys/module/page_reporting/parameters/reported_kib`, when the
kernel has it). Pins the writer to CPU 0 and this process to CPU 1 when there are two.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import struct
import time
from pathlib import Path

REPORTED = Path("/sys/module/page_reporting/parameters/reported_kib")
RECORD = 1024
MODES = ("cold", "split", "pages", "folios")
SPLIT = 64 << 10


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {cpu})


def _writer(ring: mmap.mmap, pub: mmap.mmap, size: int, rate_mb: float) -> None:
    _pin(0)
    rec = b"r" * RECORD
    t0 = time.monotonic()
    for off in range(0, size, RECORD):
        ring[off : off + RECORD] = rec
        struct.pack_into("<q", pub, 0, off + RECORD)
        if off % (64 * RECORD) == 0:
            while (off + RECORD) / 1e6 / max(time.monotonic() - t0, 1e-9) > rate_mb:
                time.sleep(0.0002)


def reported_kib() -> int:
    """The VM's free page reporting counter (KiB given back to the host since boot,
    docs/tuning.md), or -1 on a machine without one."""
    try:
        return int(REPORTED.read_text())
    except OSError:
        return -1


def run_once(
    path: Path, size: int, rate_mb: float, mode: str, tick_s: float, split: int = SPLIT
) -> dict[str, float]:
    """One copy of `size` bytes behind the writer into a new file at `path`."""
    ring = mmap.mmap(-1, size)
    ring[:] = bytes(size)  # the pool is written once when made (control._warm_pool)
    pub = mmap.mmap(-1, 8)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        rep0 = reported_kib()
        c0 = time.process_time()
        if mode in ("pages", "folios"):
            rfd = os.open(path, os.O_RDONLY)
            if mode == "pages":
                os.posix_fadvise(rfd, 0, 0, os.POSIX_FADV_RANDOM)
            buf = bytearray(1 << 20)
            for off in range(0, size, len(buf)):
                os.preadv(rfd, [buf], off)
            os.close(rfd)
        fill_s = time.process_time() - c0
        _pin(1)
        w = mp.get_context("fork").Process(target=_writer, args=(ring, pub, size, rate_mb))
        w.start()
        view = memoryview(ring)
        committed, c1, calls = 0, time.process_time(), 0
        while committed < size:
            published = struct.unpack_from("<q", pub, 0)[0]
            if published - committed >= 16384 or (published == size and published > committed):
                at = committed
                while at < published:  # split: pieces that end on multiples of `split`
                    end = published
                    if mode == "split":
                        end = min(published, (at // split + 1) * split)
                    os.pwrite(fd, view[at:end], at)
                    at = end
                committed, calls = published, calls + 1
            time.sleep(tick_s)
        copy_s = time.process_time() - c1
        view.release()
        w.join()
        kib = size / 1024
        return {
            "copy_us_per_kib": copy_s * 1e6 / kib,
            "fill_us_per_kib": fill_s * 1e6 / kib,
            "calls": calls,
            "reported_mib": (reported_kib() - rep0) / 1024 if rep0 >= 0 else -1,
        }
    finally:
        os.close(fd)
        os.unlink(path)
        ring.close()
        pub.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.commit_first_touch")
    ap.add_argument("--mib", type=int, default=512, help="bytes copied per run, MiB")
    ap.add_argument("--rate", type=float, default=400.0, help="the writer's rate, MB/s")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--split-kib", type=int, default=SPLIT >> 10, help="split: bytes per pwrite")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--tick-ms", type=float, default=2.0, help="the copier's pause per round")
    ap.add_argument("--dir", default=".", help="where the file is made (the store's disk)")
    args = ap.parse_args(argv)
    path = Path(args.dir) / f".commit-first-touch-{os.getpid()}"
    where = Path(args.dir).resolve()
    print(f"{args.mib} MiB per run, writer at {args.rate:g} MB/s, file in {where}")
    print("mode     copy us/KiB  read-in us/KiB  total  pwrites  reported to host MiB")
    for _ in range(args.runs):
        for mode in args.modes.split(","):
            tick_s, split = args.tick_ms / 1000, args.split_kib << 10
            r = run_once(path, args.mib << 20, args.rate, mode, tick_s, split)
            total = r["copy_us_per_kib"] + r["fill_us_per_kib"]
            print(
                f"{mode:8} {r['copy_us_per_kib']:11.2f}  {r['fill_us_per_kib']:14.2f}  "
                f"{total:5.2f}  {r['calls']:7.0f}  {r['reported_mib']:.0f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
