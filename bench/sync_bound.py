"""The least CPU a SYNC_FLUSH put can cost on this machine in the sync checks' shape, and
so the highest ratio `sync16_vs_naive.py` / `sync64_vs_naive.py` can print against their
peer measured in the same run.

    python -m bench.sync_bound [--producers 16,64] [--with-check] [--save] [--dir DIR]

The checks' producers (`harness.CLIENT_SNIPPET` in the shared perf folder) block once per
put, so with more producers than cores the rate is CPU-bound: at best (both cores busy,
nothing else running) it is 2 cores / the CPU of one put, all in. This measures, each in
a process of its own, the parts nothing in the store can remove:

* **loop floor**: the check's own client loop (body formatting, the README-shape call
  with `keys=[...]` and `tags`, the result's status and positions, the list append) with
  a put that does nothing: CPU per iteration;
* **put, no wait**: the real `StoreClient.put` of that shape on a SYNC_FLUSH store with
  the pool on and `wait_store=False` (reserve, encode, copy, publish; no futex): CPU per
  put of the client process, minus the loop floor;
* **sleep/wake pair**: two processes handing a futex word back and forth (each wakes the
  other, then sleeps on its own word), CPU of both per hand-off, minus ctypes' own cost:
  what a producer that sleeps until its put is flushed pays at least once per put (its
  sleep and switch back in, and the waker's wake-up of it);
* **fdatasync per round**: one process appending G KiB + fdatasync to a fresh file, CPU
  (user + system) per round, for the group sizes a round may cover; the round's cost is
  shared by its G puts;

The CPU bound for W producers: ring + put + fdatasync(G)/G, for rounds of G = W/2 (what
the rounds settle at) and G = W (every producer in every round).

The other bound is time: the flusher forces one round at a time, and a producer woken by
round N is back with its next put while round N+1 runs, so it joins round N+2: the rounds
alternate between two halves of the producers (`bench.profile_sync_check`: 7-9 messages a
round at 16). So at most W/2 puts per fdatasync's wall time (its fastest tenth, measured
alone), whatever the CPU, while the peer's W processes overlap their fdatasyncs in the
disk's queue. In the store the half that is not in the round must also make its puts
while the round's fdatasync runs: the two bounds do not simply take the lower of them.

Both leave out everything else the store does per put (the dispatcher's consume queue
and index, the committer's copy, the flusher's own loop, the gather, the wake): lower
bounds on time and CPU, so the ratios are upper bounds. The peer (W processes, 1 KiB
write + fdatasync each, the checks' naive script) runs in the same invocation.

A third cost is the checks' own: they start every client at once and time each client's
loop, so the slowest loop can run beside the other clients' interpreter starts (a start's
CPU is printed; `bench.profile_sync_check` shows how long all W loops overlap). `--with-check`
adds, for each W, a run in the checks' shape (`bench.profile_sync_check`, pool on): the
CPU per put the store and its clients take today, beside the bound.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.profile_sync_check import naive_peer
from bench.report import save_text
from bench.store_run import REPO, client_api, running_store

RESULT = REPO / "bench" / "results" / "sync_bound.txt"
SYS_FUTEX = 202  # x86_64
FUTEX_WAIT, FUTEX_WAKE = 0, 1


def _cpu_ns() -> int:
    return time.process_time_ns()


def loop_floor(n: int) -> float:
    """CPU µs per iteration of the checks' client loop with a put that does nothing."""
    from mqstore.ipc.results import PutMessageStatus, PutResult

    done = PutResult(PutMessageStatus.PUT_OK, physical_offset=1 << 20, queue_offset=7)

    class NoPut:
        def put(
            self, topic: str, body: bytes, *, keys: object = None, tags: object = None
        ) -> PutResult:
            return done

    c, worker, topic = NoPut(), 3, "perf"
    pad = b"x" * (1024 - 24)
    res: list[tuple[object, ...]] = []
    t0 = _cpu_ns()
    for i in range(n):  # harness.CLIENT_SNIPPET's loop, as written there
        body = b"w%04d-m%08d|" % (worker, i) + pad
        r = c.put(topic, body, keys=["k-%d-%d" % (worker, i)], tags="t%d" % (i % 3))  # noqa: UP031
        res.append((str(getattr(r.status, "name", r.status)), getattr(r, "physical_offset", None), getattr(r, "queue_offset", None), body[:24].decode()))  # fmt: skip  # noqa: E501
    return (_cpu_ns() - t0) / n / 1e3


PUT_NO_WAIT = r"""
import resource, sys, time
from mqstore import StoreClient
store, n = sys.argv[1], int(sys.argv[2])
pad = b"x" * 1000
with StoreClient.attach(store) as c:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    start_us = (ru.ru_utime + ru.ru_stime) * 1e6
    for i in range(200):
        c.put("perf", b"warm" + pad, keys=["k"], tags="t", wait_store=False)
    t0 = time.process_time_ns()
    for i in range(n):
        body = b"w%04d-m%08d|" % (1, i) + pad
        r = c.put("perf", body, keys=["k-%d-%d" % (1, i)], tags="t%d" % (i % 3), wait_store=False)
        assert r.status.name == "PUT_OK", r
    print((time.process_time_ns() - t0) / n / 1e3, start_us)
"""


def put_no_wait(root: Path, n: int, floor: float) -> tuple[float, float]:
    """CPU µs of the real put beyond the loop floor (SYNC_FLUSH store, pool on, no wait),
    and of the client's start: interpreter, `from mqstore import StoreClient`, attach."""
    client_api()
    script = root / "put_no_wait.py"
    script.write_text(PUT_NO_WAIT)
    with running_store(root, "nowait", sync=True, pool=True) as run:
        out = subprocess.run(
            [sys.executable, str(script), str(run.store_dir), str(n)],
            capture_output=True, text=True, check=True, cwd=REPO,
        )  # fmt: skip
    put, start = (float(x) for x in out.stdout.split())
    return put - floor, start


def _futex(libc: ctypes.CDLL, addr: int, op: int, val: int) -> int:
    return int(libc.syscall(SYS_FUTEX, ctypes.c_void_p(addr), op, val, None, None, 0))


def sleep_wake_pair(n: int) -> float:
    """CPU µs of one futex hand-off between two processes (the sleeper's wait and switch
    back in, the waker's wake), ctypes' own call cost taken out."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = mmap.mmap(-1, 4096)  # shared with the child (fork)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    words = (base, base + 64)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    rc0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    me = 1 if pid == 0 else 0
    mine, other = words[me], words[1 - me]
    off_mine, off_other = (mine - base), (other - base)
    for i in range(n):  # the parent sends i + 1, the child sends it back
        if me == 1:
            while struct.unpack_from("I", buf, off_mine)[0] != i + 1:
                _futex(libc, mine, FUTEX_WAIT, i)  # returns at once if already moved
        struct.pack_into("I", buf, off_other, i + 1)
        _futex(libc, other, FUTEX_WAKE, 1)
        if me == 0:
            while struct.unpack_from("I", buf, off_mine)[0] != i + 1:
                _futex(libc, mine, FUTEX_WAIT, i)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(
        (b.ru_utime + b.ru_stime) - (a.ru_utime + a.ru_stime) for a, b in ((r0, r1), (rc0, rc1))
    )
    # ctypes' cost: the same calls into a libc function that does nothing.
    t0 = _cpu_ns()
    for _ in range(n):
        libc.labs(ctypes.c_long(1))
        struct.unpack_from("I", buf, off_mine)
        struct.pack_into("I", buf, off_other, 1)
        libc.labs(ctypes.c_long(1))
    overhead = (_cpu_ns() - t0) / 1e9
    hand_offs = 2 * n
    return (cpu - 2 * overhead) / hand_offs * 1e6


RING = r"""
import ctypes, mmap, os, struct, sys, resource
from mqstore.ipc.results import PutMessageStatus, PutResult
SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 0, 1
w, n, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None)
buf = mmap.mmap(-1, 64 * w)
base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
def futex(k, op, val):
    libc.syscall(SYS_FUTEX, ctypes.c_void_p(base + 64 * k), op, val, None, None, 0)
done = PutResult(PutMessageStatus.PUT_OK, physical_offset=1 << 20, queue_offset=7)
kids = []
for worker in range(w):
    pid = os.fork()
    if pid:
        kids.append(pid)
        continue
    nxt, pad, res, topic = (worker + 1) % w, b"x" * (1024 - 24), [], "perf"
    def put(topic, body, keys=None, tags=None):
        # a sync put's hand-off: sleep until our word moves, pass one on
        while struct.unpack_from("I", buf, 64 * worker)[0] <= i:
            futex(worker, FUTEX_WAIT, i)
        struct.pack_into("I", buf, 64 * nxt, struct.unpack_from("I", buf, 64 * nxt)[0] + 1)
        futex(nxt, FUTEX_WAKE, 1)
        return done
    for i in range(n):  # harness.CLIENT_SNIPPET's loop, as written there
        body = b"w%04d-m%08d|" % (worker, i) + pad
        r = put(topic, body, keys=["k-%d-%d" % (worker, i)], tags="t%d" % (i % 3))
        res.append((str(getattr(r.status, "name", r.status)),
                    getattr(r, "physical_offset", None), getattr(r, "queue_offset", None),
                    body[:24].decode()))
    os._exit(0)
for t in range(tokens):  # tokens in flight: as many producers run at once
    k = t * w // tokens
    struct.pack_into("I", buf, 64 * k, struct.unpack_from("I", buf, 64 * k)[0] + 1)
    futex(k, FUTEX_WAKE, 1)
for pid in kids:
    os.waitpid(pid, 0)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print((ru.ru_utime + ru.ru_stime) / (w * n) * 1e6)
"""


def ring(workers: int, n: int, tokens: int = 2) -> float:
    """CPU µs per put of `workers` processes each running the checks' client loop whose
    put sleeps on a futex until the process before it in a ring wakes it (`tokens` puts
    in flight): the loop and one sleep/wake pair per put, with as many processes taking
    turns on the 2 cores as in the check (each put runs with its caches cold)."""
    out = subprocess.run(
        [sys.executable, "-c", RING, str(workers), str(n), str(tokens)],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return float(out.stdout.strip())


def ctypes_calls_us(n: int) -> float:
    """CPU µs of what the ring's put does in Python beyond the system calls (two ctypes
    calls and three struct accesses) that the real put does in C: taken out of `ring`."""
    libc = ctypes.CDLL(None)
    buf = mmap.mmap(-1, 4096)
    t0 = _cpu_ns()
    for _ in range(n):
        struct.unpack_from("I", buf, 0)
        struct.pack_into("I", buf, 64, struct.unpack_from("I", buf, 64)[0] + 1)
        libc.labs(ctypes.c_long(1))
        libc.labs(ctypes.c_long(1))
    return (_cpu_ns() - t0) / n / 1e3


def fdatasync_round(root: Path, kib: int, n: int) -> tuple[float, float]:
    """CPU µs (user + system) of one round in the store's shape: `kib` KiB written over
    a segment made ahead (zeros, already on disk, so no size or extent changes) + one
    fdatasync; and the wall µs of the fdatasync alone (the fastest tenth's: the disk is
    shared, its median swings with other tenants' I/O, and a bound takes the best case)."""
    path = root / f"fsync-{kib}.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    body = os.urandom(1024 * kib)
    walls: list[int] = []
    try:
        zeros = bytes(1 << 20)
        for _ in range(-(-(n + 20) * len(body) // len(zeros))):
            os.write(fd, zeros)
        os.fsync(fd)
        for i in range(20):
            os.pwrite(fd, body, i * len(body))
            os.fdatasync(fd)
        t0 = _cpu_ns()
        for i in range(20, n + 20):
            os.pwrite(fd, body, i * len(body))
            a = time.monotonic_ns()
            os.fdatasync(fd)
            walls.append(time.monotonic_ns() - a)
        return (_cpu_ns() - t0) / n / 1e3, sorted(walls)[n // 10] / 1e3
    finally:
        os.close(fd)
        path.unlink()


def measure(root: Path, producers: list[int], with_check: bool = False) -> str:
    load0 = os.getloadavg()
    floor = loop_floor(200_000)
    put, start = put_no_wait(root, 20_000, floor)
    pair = sleep_wake_pair(20_000)
    shim = ctypes_calls_us(200_000)
    rings = {w: ring(w, 2000 if w <= 16 else 600) - shim for w in producers}
    groups = sorted({1, 8, *producers, *(w // 2 for w in producers)})
    fsw = {g: fdatasync_round(root, g, 1000) for g in groups}
    fs = {g: v[0] for g, v in fsw.items()}
    lines = [
        f"load at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}",
        "parts, CPU µs (user + system), each measured alone:",
        f"  loop floor: the check's client loop, a put that does nothing, hot     {floor:6.1f}",
        f"  put beyond the floor: SYNC_FLUSH, pool on, wait_store=False, hot      {put:6.1f}",
        f"  futex sleep/wake pair between 2 processes (both sides), hot           {pair:6.1f}",
        f"  a client's start: interpreter, import, attach (once per client)     {start:8.0f}",
        *(
            f"  loop floor + one sleep/wake pair per put, {w} processes in a ring on 2 cores "
            f"(2 in flight, caches cold as in the check)  {rings[w]:6.1f}"
            for w in producers
        ),
        "  G KiB written over a segment made ahead + fdatasync, per round: "
        + ", ".join(f"G={g} {v:.1f}" for g, v in fs.items()),
        "  its fdatasync's wall time, 10th percentile µs: "
        + ", ".join(f"G={g} {v[1]:.0f}" for g, v in fsw.items()),
        "bound: least CPU per sync put = ring + put + fdatasync(G) / G, nothing else the "
        "store does counted",
    ]
    for w in producers:
        n = 2000 if w <= 16 else 600
        rate, ncpu = naive_peer(root, w, n)
        goal = 2.5 if w <= 16 else 5.0
        lines.append(
            f"  {w} producers: naive peer {rate:,.0f}/s ({ncpu:.1f} µs CPU/message); the goal "
            f"{goal}x = {goal * rate:,.0f}/s needs <= {2e6 / (rate * goal):.1f} µs CPU/put all in"
        )
        lines.append(
            f"    the other clients' starts, if they run beside the slowest loop (the check "
            f"times each client's loop only, but starts them all at once): {w - 1} x "
            f"{start / 1e3:.0f} ms over {w} x {n} puts = {(w - 1) * start / (w * n):.1f} µs "
            f"per put more"
        )
        half = w // 2
        wall = fsw[half][1]
        lines.append(
            f"    one round in flight at a time (the flusher's design): the puts of a round's "
            f"waiters come back while the next round runs, so rounds alternate between two "
            f"halves of the producers: at most {half} puts per fdatasync, {half}/{wall:.0f} µs "
            f"= {half / wall * 1e6:,.0f}/s, ratio <= {half / wall * 1e6 / rate:.2f} (before any "
            f"gather, commit or wake time)"
        )
        for g in sorted({half, w}):
            g_fs = fs.get(g) or fs[min(fs, key=lambda x: abs(x - g))]
            least = rings[w] + put + g_fs / g
            lines.append(
                f"    rounds of {g}: {rings[w]:.1f} + {put:.1f} + {g_fs:.1f}/{g} = {least:.1f} µs: "
                f"at most {2e6 / least:,.0f} puts/s on 2 cores, ratio <= {2e6 / least / rate:.2f}"
            )
    if with_check:
        from bench.profile_sync_check import run_one

        for w in producers:
            lines += ["today, in the checks' shape:", run_one(root, w, True, True)]
    lines.append(f"load at end {os.getloadavg()[0]:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_bound", description=__doc__)
    ap.add_argument("--producers", default="16,64")
    ap.add_argument("--with-check", action="store_true", help="and a check-shaped run")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default /tmp)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="sync-bound-", dir=args.dir))
    try:
        text = measure(root, [int(w) for w in args.producers.split(",")], args.with_check)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.save:
        save_text(RESULT, "bench.sync_bound", argv, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
