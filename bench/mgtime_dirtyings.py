"""How often a file written in a 1 KiB pwrite + fdatasync loop has its inode dirtied by
a time stamp, alone and beside another process's activity (multigrain time stamps).

    python -m bench.mgtime_dirtyings [--writes 3000] [--reps 2] [--save] [--dir DIR]

On ext4 without a journal every fdatasync also writes the file's inode-table block when
the inode is dirty, and a write dirties it whenever its new time stamp differs from the
one stored (`bench/results/sync_disk.md`). Linux 6.13 made ext4's time stamps
multigrain: a write takes the coarse clock (a 4 ms tick here), but never earlier than
the latest fine-grained stamp handed out on the machine, and a file whose time stamps
were read (`stat`) since its last change gets a fine-grained one. So the rate of
dirtyings depends on what other processes do. Three cases, alternated:

* `alone`: nothing else touches the file;
* `stat-own`: another process `stat`s the file every 200 µs;
* `other-file`: another process writes a byte of a file of its own and `fstat`s it
  every 200 µs (nothing touches ours: it moves the machine-wide floor only).

Counts `ext4:ext4_mark_inode_dirty` of the looped file's inode by the loop (`perf
record -a`; root). `--save` appends to `bench/results/mgtime_dirtyings.txt`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import save_text
from bench.store_run import REPO

RESULT = REPO / "bench" / "results" / "mgtime_dirtyings.txt"
HELPERS = {
    "alone": None,
    "stat-own": "import os, sys, time\nwhile True:\n    os.stat(sys.argv[1])\n"
    "    time.sleep(0.0002)\n",
    "other-file": "import os, sys, time\nfd = os.open(sys.argv[2], os.O_RDWR)\nwhile True:\n"
    "    os.pwrite(fd, b'x', 0)\n    os.fstat(fd)\n    time.sleep(0.0002)\n",
}
HZ = 250  # CONFIG_HZ of the test machine: the coarse clock's tick


def one(d: Path, mode: str, writes: int) -> str:
    seg, other, data = d / "seg", d / "other", d / "mg.data"
    fd = os.open(seg, os.O_RDWR | os.O_CREAT, 0o600)
    ofd = os.open(other, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, bytes(writes * 1024 + 4096), 0)  # written: no extent conversion
        os.fsync(fd)
        os.pwrite(ofd, bytes(4096), 0)
        os.fsync(ofd)
        ino = os.fstat(fd).st_ino
        script = HELPERS[mode]
        helper = None
        if script is not None:
            helper = subprocess.Popen([sys.executable, "-c", script, str(seg), str(other)])
        rec = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-e", "ext4:ext4_mark_inode_dirty", "-o", str(data)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # perf's events enabled
        body = os.urandom(1024)
        t0 = time.perf_counter()
        for i in range(writes):
            os.pwrite(fd, body, i * 1024)
            os.fdatasync(fd)
        dt = time.perf_counter() - t0
        rec.send_signal(signal.SIGINT)
        rec.wait()
        if helper is not None:
            helper.kill()
            helper.wait()
    finally:
        os.close(fd)
        os.close(ofd)
        seg.unlink()
        other.unlink()
    script_out = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "pid,trace"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    data.unlink()
    me = str(os.getpid())
    n = sum(
        1 for line in script_out.splitlines() if line.split()[:1] == [me] and f"ino {ino} " in line
    )
    return (
        f"{mode:10s} {writes / dt:7,.0f} writes/s; the file's inode dirtied "
        f"{n / writes:.3f} per write, {n / (dt * HZ):.2f} per {1000 // HZ} ms tick; "
        f"load {os.getloadavg()[0]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.mgtime_dirtyings", description=__doc__)
    ap.add_argument("--writes", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args(argv)
    d = Path(tempfile.mkdtemp(prefix="perf-mgtime-", dir=a.dir))
    lines = []
    try:
        for rep in range(a.reps):
            modes = list(HELPERS) if rep % 2 == 0 else list(HELPERS)[::-1]
            for mode in modes:
                lines.append(one(d, mode, a.writes))
                print(lines[-1], flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if a.save:
        save_text(RESULT, "bench.mgtime_dirtyings", argv, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
