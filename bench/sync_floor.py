"""The floor of the sync checks' shape on this machine: a null store, timed as the checks
time mqstore, beside their naive peer in the same run.

    python -m bench.sync_floor [--producers 1,16,64] [--n N] [--reps 2] [--perf] [--save]
                               [--dir DIR]

`sync16_vs_naive.py` and `sync64_vs_naive.py` (the shared perf folder) start W client
processes at once, each timing its own loop of README-shape SYNC puts
(`harness.CLIENT_SNIPPET`), and divide W * N by the slowest loop's seconds; the peer is W
processes appending 1 KiB + fdatasync per message. Here the same W clients run the same
loop, but their `put` does strictly less than any store's: it announces one request in
shared memory (its own slot: no reservation, no record, no copy), wakes the
acknowledger if it sleeps, and sleeps on a shared futex word (FUTEX_WAIT_BITSET without
the private flag, as `ipc/native/mqs_futex.c`) until the acknowledger says the request
is covered. The acknowledger (the flusher's role, at the store's nice and time slice, in
a session of its own as the store's processes are) takes a snapshot of every slot,
publishes it as covered and wakes the round's sleepers with one FUTEX_WAKE_BITSET (a
sleeper waits on the bit of the first round that can cover it, so a put that arrives
while a round runs is not woken by it: one sleep per put, which the clients' voluntary
switches show and `--perf` counts with `perf stat`, every process).

Its rounds (KINDS): `null` does no I/O; `fdatasync` does one 1 KiB pwrite + fdatasync of
a file written with zeros ahead, the least a real round must do; `+gather` first waits,
as the flusher does, for as many puts as the last round covered (one timed sleep of
half a recent fdatasync, at most 1 ms); `+poll` looks for the next request for up to the
flusher's POLL_NS, yielding the CPU, before it sleeps. Which policy is fastest depends
on W, so the floor is the best of them: a store must fdatasync, so the best of the
`fdatasync` kinds is a store's floor; the best of the `null` kinds is the hand-off alone.

The null put's calls go through ctypes, which costs more than a C extension's call: that
cost (`ctypes_call_us`: a 7-argument `syscall(getppid)` through ctypes less
`os.getppid()`, a builtin making the same system call) times the calls made is taken
out of the CPU per put, and the rate is scaled up by as much (the most it could gain if
the run were CPU-bound throughout), so the figure stays an upper bound on the null
store's rate. `CPU ceiling` is 2 cores / that CPU per put: the rate if both cores did
nothing else (the other clients' starts and other jobs not counted).

Per repetition every kind and the naive peer run once, the order reversed every other
repetition. The naive peer is the checks' script (`bench.profile_sync_check.naive_peer`).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import save_text
from bench.store_run import REPO

RESULT = REPO / "bench" / "results" / "sync_floor.txt"
GOALS = {16: 2.5, 64: 5.0}  # issue 23 (sync 1's goal is 0.9)
SYS_FUTEX, SYS_GETPPID = 202, 110  # x86_64
FUTEX_WAIT, FUTEX_WAKE, FUTEX_WAIT_BITSET, FUTEX_WAKE_BITSET = 0, 1, 9, 10
INT_MAX = 2**31 - 1
CORES = os.cpu_count() or 1

# The shared block: the rounds done (the clients' futex word) and started (snapshots
# taken), the acknowledger's futex word, flags, its counters, then one 4-byte slot per
# client for the puts it announced and one for the puts covered.
DONE_AT, STARTED, WAKE, SLEEPS, STOP, READY, GATHER = 0, 64, 128, 192, 256, 320, 448
COUNTERS = 384  # u64 each
COUNTER_NAMES = ("rounds", "sleeps", "rescued", "covered", "wake_ns", "gathered", "fsync_ns")
ANN, COV = 1024, 2048
MAX_WORKERS = (COV - ANN) // 4
SIZE = 4096
# The acknowledger's rounds: no I/O or a 1 KiB fdatasync; the flusher's gather and poll.
NULL_KINDS = ("null", "null+poll")
FSYNC_KINDS = ("fdatasync", "fdatasync+gather", "fdatasync+gather+poll")
KINDS = (*NULL_KINDS, *FSYNC_KINDS)
ACK_TIMEOUT_NS = 1_000_000  # a wake lost to a store-load race costs at most this (counted)

# harness.CLIENT_SNIPPET with `StoreClient` the null client, and the client's own CPU
# (schedstat), switches and ctypes calls read before and after its loop; the loop, as
# written there.
CLIENT = r"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import ctypes, mmap

SYS_FUTEX, FUTEX_WAKE, FUTEX_WAIT_BITSET = 202, 1, 9
DONE_AT, STARTED, WAKE, SLEEPS, ANN, COV, SIZE = 0, 64, 128, 192, 1024, 2048, 4096
_call = ctypes.CDLL(None).syscall


class _Status:
    name = "PUT_OK"


class _Result:
    status, physical_offset, queue_offset = _Status(), 1 << 20, 7


DONE = _Result()


class StoreClient:
    # A put that does strictly less than a store's: announce, wake the acknowledger if it
    # sleeps, sleep until covered.
    @classmethod
    def attach(cls, d):
        for slot in range((COV - ANN) // 4):  # a slot of its own, claimed by a file
            try:
                os.close(os.open(os.path.join(d, "slot-%d" % slot), os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                pass
        else:
            raise RuntimeError("no free slot")
        with open(os.path.join(d, "shm")) as f:
            fd = os.open(f.read(), os.O_RDWR)
        self = cls()
        self.mm = mmap.mmap(fd, SIZE)
        os.close(fd)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.wake = ctypes.c_uint32.from_buffer(self.mm, WAKE)
        self.wake_addr = ctypes.c_void_p(base + WAKE)
        self.sleeps = ctypes.c_uint32.from_buffer(self.mm, SLEEPS)
        self.ann = ctypes.c_uint32.from_buffer(self.mm, ANN + 4 * slot)
        self.cov = ctypes.c_uint32.from_buffer(self.mm, COV + 4 * slot)
        self.done = ctypes.c_uint32.from_buffer(self.mm, DONE_AT)
        self.done_addr = ctypes.c_void_p(base + DONE_AT)
        self.started = ctypes.c_uint32.from_buffer(self.mm, STARTED)
        self.k = self.waits = self.wakes = 0
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def put(self, topic, body, keys=None, tags=None):
        k = self.k = self.k + 1
        seen = self.done.value  # rounds done, then the first round that can cover us
        t = self.started.value
        self.ann.value = k
        if self.sleeps.value:
            self.wakes += 1
            self.wake.value += 1
            _call(SYS_FUTEX, self.wake_addr, FUTEX_WAKE, 1, None, None, 0)
        while self.cov.value < k:
            self.waits += 1
            _call(SYS_FUTEX, self.done_addr, FUTEX_WAIT_BITSET, seen, None, None, 1 << (t & 31))
            seen = self.done.value
            if seen > t:  # round t is done and did not cover us: the next one to end will
                t = seen
        return DONE


def snap():
    with open("/proc/self/schedstat") as f:
        run = int(f.read().split()[0])
    sw = {}
    with open("/proc/self/status") as f:
        for line in f:
            if "ctxt_switches:" in line:
                sw[line.split(":")[0]] = int(line.split()[1])
    return [run, sw["voluntary_ctxt_switches"], sw["nonvoluntary_ctxt_switches"]]


store_dir, worker, n, size, topic, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
pad = b"x" * max(0, size - 24)
res = []
with StoreClient.attach(store_dir) as c:
    s0 = snap()
    t0 = time.perf_counter()
    for i in range(n):
        body = b"w%04d-m%08d|" % (worker, i) + pad
        r = c.put(topic, body, keys=["k-%d-%d" % (worker, i)], tags="t%d" % (i % 3))
        res.append((str(getattr(r.status, "name", r.status)), getattr(r, "physical_offset", None), getattr(r, "queue_offset", None), body[:24].decode()))
    dt = time.perf_counter() - t0
    s1 = snap()
with open(out, "w") as f:
    json.dump({"results": res, "seconds": dt, "start_cpu_ns": s0[0],
               "loop": [b - a for a, b in zip(s0, s1)], "waits": c.waits, "wakes": c.wakes}, f)
"""  # noqa: E501 (the snippet's lines, as written there)


def puts_for(producers: int) -> int:
    """The checks' N: 6,000 puts for 1 client (sync1), 2,000 up to 16, 600 above."""
    return 6000 if producers == 1 else 2000 if producers <= 16 else 600


def check_rate(producers: int, n: int, loop_seconds: list[float]) -> float:
    """The checks' rate: every put of every client over the slowest client's loop."""
    if len(loop_seconds) != producers or not loop_seconds:
        raise ValueError(f"{len(loop_seconds)} loop times for {producers} clients")
    return producers * n / max(loop_seconds)


def without_ctypes(rate: float, cpu_us: float, ctypes_us: float) -> tuple[float, float]:
    """The rate and CPU per put with ctypes' own cost (`ctypes_us` per put) taken out: the
    CPU less it, the rate scaled up as much as the CPU went down (what the run would gain
    at most, were it CPU-bound throughout)."""
    if not 0 <= ctypes_us < cpu_us:
        raise ValueError(f"ctypes cost {ctypes_us} µs not within the CPU per put {cpu_us} µs")
    left = cpu_us - ctypes_us
    return rate * cpu_us / left, left


def changed_slots(snap: bytes, old: bytes) -> list[int]:
    """The clients whose slot (4 bytes each) differs between two copies of the slots: the
    puts a round covers (one a client: a client has one put outstanding)."""
    if len(snap) != len(old) or len(snap) % 4:
        raise ValueError(f"slots of {len(snap)} and {len(old)} bytes")
    a, b = memoryview(snap).cast("I"), memoryview(old).cast("I")
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


def verdict(ratio: float, goal: float) -> str:
    """What a null store's best ratio says of the goal."""
    if ratio < goal:
        return f"{ratio:.2f} < {goal}: not even this null store meets the goal here"
    return f"{ratio:.2f} >= {goal}: this null store meets it, by {ratio / goal:.2f}x"


# --- the acknowledger ---------------------------------------------------------------


def _syscall() -> Any:
    return ctypes.CDLL(None, use_errno=True).syscall


def acknowledge(shm: str, workers: int, sync_file: str, kind: str) -> None:
    """The acknowledger's loop (its own process): while some slot announced more than is
    covered, a round: [gather: while fewer puts wait than the last round covered, sleep
    the flusher's gather time once], snapshot, [1 KiB pwrite + fdatasync], publish the
    snapshot as covered, wake the round's sleepers with one FUTEX_WAKE_BITSET; else
    [poll: as the flusher, look again for up to its POLL_NS, yielding the CPU between
    looks, after a round] sleep on its own word until a client wakes it."""
    from mqstore.conf.settings import StoreSettings
    from mqstore.workers import flusher, priority

    s = StoreSettings()
    priority.apply(s.store_nice)
    priority.apply_slice(s.store_slice_us)
    call = _syscall()
    fd = os.open(shm, os.O_RDWR)
    mm = mmap.mmap(fd, SIZE)
    os.close(fd)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    done, done_addr = ctypes.c_uint32.from_buffer(mm, DONE_AT), ctypes.c_void_p(base + DONE_AT)
    started = ctypes.c_uint32.from_buffer(mm, STARTED)
    wake, wake_addr = ctypes.c_uint32.from_buffer(mm, WAKE), ctypes.c_void_p(base + WAKE)
    sleeps, stop = ctypes.c_uint32.from_buffer(mm, SLEEPS), ctypes.c_uint32.from_buffer(mm, STOP)
    counters = (ctypes.c_uint64 * len(COUNTER_NAMES)).from_buffer(mm, COUNTERS)
    ann, cov = slice(ANN, ANN + 4 * workers), slice(COV, COV + 4 * workers)
    timeout = (ctypes.c_long * 2)(0, ACK_TIMEOUT_NS)
    sfd, body, at, span = -1, os.urandom(1024), 0, 8 << 20
    if sync_file:
        sfd = os.open(sync_file, os.O_RDWR | os.O_CREAT, 0o600)
        os.write(sfd, bytes(span))  # written ahead: the round converts no extent
        os.fsync(sfd)
    ctypes.c_uint32.from_buffer(mm, READY).value = 1
    c = dict.fromkeys(COUNTER_NAMES, 0)
    clock, mono, group, fsync_ns = time.thread_time_ns, time.monotonic_ns, 0, 0
    gather, poll, polled = "gather" in kind, "poll" in kind, True
    gather_ts, gather_addr = (ctypes.c_long * 2)(0, 0), ctypes.c_void_p(base + GATHER)
    while not stop.value:
        snap = mm[ann]
        old = mm[cov]
        if snap != old:
            if gather and group > 1 and fsync_ns and len(changed_slots(snap, old)) < group:
                # The flusher's gather (GATHER_FRACTION of a recent fdatasync, at most
                # GATHER_MAX_NS) as one timed sleep: no client pays to end it sooner.
                ns = min(int(fsync_ns * flusher.GATHER_FRACTION), flusher.GATHER_MAX_NS)
                gather_ts[1] = ns
                call(SYS_FUTEX, gather_addr, FUTEX_WAIT, 0, gather_ts, None, 0)
                snap = mm[ann]
                c["gathered"] += 1
            r = done.value
            started.value = r + 1  # after the snapshot's loads (x86 keeps them in order)
            if sfd >= 0:
                os.pwrite(sfd, body, at)
                at = (at + 1024) % span
                t0 = mono()
                os.fdatasync(sfd)
                ns = mono() - t0
                c["fsync_ns"] += ns
                fsync_ns = (fsync_ns * 7 + ns) // 8 if fsync_ns else ns
            mm[cov] = snap
            group = len(changed_slots(snap, old))
            c["covered"] += group
            t0 = clock()
            done.value = r + 1
            call(SYS_FUTEX, done_addr, FUTEX_WAKE_BITSET, INT_MAX, None, None, 1 << (r & 31))
            c["wake_ns"] += clock() - t0
            c["rounds"] += 1
            polled = not poll
            continue
        if not polled:  # the flusher's poll before sleeping, once after a round
            polled, end = True, mono() + flusher.POLL_NS
            while mm[ann] == mm[cov] and mono() < end and not stop.value:
                os.sched_yield()
            continue
        seen = wake.value
        sleeps.value = 1
        if mm[ann] == mm[cov] and not stop.value:
            c["sleeps"] += 1
            rc = call(SYS_FUTEX, wake_addr, FUTEX_WAIT, seen, timeout, None, 0)
            if rc and ctypes.get_errno() == errno.ETIMEDOUT and mm[ann] != mm[cov]:
                c["rescued"] += 1
        sleeps.value = 0
    counters[:] = [c[k] for k in COUNTER_NAMES]
    if sfd >= 0:
        os.close(sfd)


# --- one run ------------------------------------------------------------------------


@dataclass
class NullRun:
    producers: int
    n: int
    kind: str  # one of KINDS
    load: float
    rate: float
    loop_cpu_us: float  # the clients' loops, per put
    ack_cpu_us: float  # the acknowledger over the clients' run, per put
    start_cpu_ms: float  # a client's interpreter start, imports and attach (median)
    vol_sw: float  # the clients' voluntary switches per put (sleeps)
    invol_sw: float
    waits: float  # the clients' FUTEX_WAIT calls per put
    wakes: float  # the clients' wakes of the acknowledger per put
    rounds: int
    ack_sleeps: int
    rescued: int
    ack_runs: float  # the acknowledger's times scheduled in, per round
    gathered: int  # rounds that gathered first
    wake_us: float  # the acknowledger's CPU per round's wake (with the ctypes call in it)
    fsync_us: float  # its fdatasync's mean wall time

    @property
    def cpu_us(self) -> float:
        return self.loop_cpu_us + self.ack_cpu_us

    def ctypes_calls(self) -> float:
        """ctypes calls per put: the clients' waits and wakes, the acknowledger's wakes
        and sleeps."""
        return self.waits + self.wakes + (self.rounds + self.ack_sleeps) / (self.producers * self.n)


def _schedstat(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/schedstat") as f:
        run, _, slices = f.read().split()[:3]
    return int(run), int(slices)


def null_run(root: Path, producers: int, n: int, kind: str) -> NullRun:
    """One null-store run in the checks' shape: the acknowledger, then W clients started as
    `harness.run_clients` starts them; every put answered PUT_OK, or RuntimeError."""
    if not 0 < producers <= MAX_WORKERS:
        raise ValueError(f"1 to {MAX_WORKERS} producers, not {producers}")
    if kind not in KINDS:
        raise ValueError(f"{kind!r}: not one of {KINDS}")
    d = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    shm = f"/dev/shm/syncfloor-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(shm, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    ack = None
    try:
        os.ftruncate(fd, SIZE)
        mm = mmap.mmap(fd, SIZE)
        (d / "shm").write_text(shm)
        (d / "client.py").write_text(CLIENT)
        sync_file = str(d / "round.log") if kind.startswith("fdatasync") else ""
        ack = subprocess.Popen(
            [sys.executable, "-m", "bench.sync_floor", "--ack", shm, str(producers), sync_file,
             kind],
            cwd=REPO, start_new_session=True,
        )  # fmt: skip
        ready = ctypes.c_uint32.from_buffer(mm, READY)
        while not ready.value:
            if ack.poll() is not None:
                raise RuntimeError(f"the acknowledger exited with {ack.returncode}")
            time.sleep(0.01)
        load = os.getloadavg()[0]
        a0 = _schedstat(ack.pid)
        kids = [
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        str(d / "client.py"),
                        str(d),
                        str(w),
                        str(n),
                        "1024",
                        "perf",
                        str(d / f"{w}.json"),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                ),
                d / f"{w}.json",
            )
            for w in range(producers)
        ]
        res = []
        for p, out in kids:
            o, _ = p.communicate(timeout=600)
            if p.returncode:
                raise RuntimeError(f"client failed: {o.decode(errors='replace')[-800:]}")
            res.append(json.loads(out.read_text()))
        a1 = _schedstat(ack.pid)
        ctypes.c_uint32.from_buffer(mm, STOP).value = 1
        ctypes.c_uint32.from_buffer(mm, WAKE).value += 1
        _syscall()(SYS_FUTEX, ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(mm, WAKE))), FUTEX_WAKE, 1, None, None, 0)  # fmt: skip  # noqa: E501
        if ack.wait(60):
            raise RuntimeError(f"the acknowledger exited with {ack.returncode}")
        counts = dict(
            zip(
                COUNTER_NAMES,
                (ctypes.c_uint64 * len(COUNTER_NAMES)).from_buffer_copy(mm, COUNTERS),
                strict=True,
            )
        )
        del ready
        mm.close()
    finally:
        if ack is not None and ack.poll() is None:
            ack.kill()
            ack.wait()
        os.close(fd)
        os.unlink(shm)
        shutil.rmtree(d, ignore_errors=True)
    bad = sum(1 for r in res for s, *_ in r["results"] if s != "PUT_OK")
    if bad:
        raise RuntimeError(f"{bad} null puts not PUT_OK")
    total = producers * n
    starts = sorted(r["start_cpu_ns"] for r in res)
    return NullRun(
        producers, n, kind, load,
        rate=check_rate(producers, n, [r["seconds"] for r in res]),
        loop_cpu_us=sum(r["loop"][0] for r in res) / total / 1e3,
        ack_cpu_us=(a1[0] - a0[0]) / total / 1e3,
        start_cpu_ms=starts[len(starts) // 2] / 1e6,
        vol_sw=sum(r["loop"][1] for r in res) / total,
        invol_sw=sum(r["loop"][2] for r in res) / total,
        waits=sum(r["waits"] for r in res) / total,
        wakes=sum(r["wakes"] for r in res) / total,
        rounds=counts["rounds"], ack_sleeps=counts["sleeps"], rescued=counts["rescued"],
        ack_runs=(a1[1] - a0[1]) / max(1, counts["rounds"]),
        gathered=counts["gathered"], wake_us=counts["wake_ns"] / max(1, counts["rounds"]) / 1e3,
        fsync_us=counts["fsync_ns"] / max(1, counts["rounds"]) / 1e3,
    )  # fmt: skip


def null_put_us(n: int = 100_000, tries: int = 3) -> float:
    """CPU µs of the null put's own Python (its put called in the checks' loop, already
    covered, so it makes no call) beyond a put that returns at once: what it adds to the
    loop besides its one FUTEX_WAIT, best of `tries`. (The real put does its reservation,
    encoding and copy in ~0.5 µs beyond the same loop: `bench.sync_bound`.)"""
    ns: dict[str, Any] = {}
    exec(CLIENT[: CLIENT.index("def snap():")], ns)  # the client's StoreClient, not its loop
    mm = mmap.mmap(-1, SIZE)
    ctypes.c_uint32.from_buffer(mm, COV).value = 2**32 - 1  # every put already covered
    c = ns["StoreClient"]()
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    c.mm, c.k, c.waits, c.wakes = mm, 0, 0, 0
    c.ann, c.cov = (ctypes.c_uint32.from_buffer(mm, o) for o in (ANN, COV))
    c.done, c.started, c.sleeps = (ctypes.c_uint32.from_buffer(mm, o) for o in (0, 64, 192))
    c.done_addr = c.wake_addr = ctypes.c_void_p(base)

    class NoPut:
        def put(self, topic: str, body: bytes, keys: object = None, tags: object = None) -> Any:
            return ns["DONE"]

    def loop(p: Any) -> int:
        worker, topic, pad, res = 3, "perf", b"x" * 1000, []
        t0 = time.thread_time_ns()
        for i in range(n):  # harness.CLIENT_SNIPPET's loop, as written there
            body = b"w%04d-m%08d|" % (worker, i) + pad
            r = p.put(topic, body, keys=["k-%d-%d" % (worker, i)], tags="t%d" % (i % 3))  # noqa: UP031
            res.append((str(getattr(r.status, "name", r.status)), getattr(r, "physical_offset", None), getattr(r, "queue_offset", None), body[:24].decode()))  # fmt: skip  # noqa: E501
        return time.thread_time_ns() - t0

    return min((loop(c) - loop(NoPut())) / n / 1e3 for _ in range(tries))


def ctypes_call_us(n: int = 200_000, tries: int = 5) -> float:
    """CPU µs that a call through ctypes (7 arguments, as the futex calls here) costs
    beyond a builtin making the same system call: `syscall(getppid, ...)` less
    `os.getppid()`, best of `tries`."""
    call, arg = _syscall(), ctypes.c_void_p(4096)
    best = float("inf")
    for _ in range(tries):
        t0 = time.thread_time_ns()
        for _ in range(n):
            call(SYS_GETPPID, arg, FUTEX_WAIT, 0, None, None, 0)
        t1 = time.thread_time_ns()
        for _ in range(n):
            os.getppid()
        t2 = time.thread_time_ns()
        best = min(best, ((t1 - t0) - (t2 - t1)) / n / 1e3)
    return best


# --- perf stat --------------------------------------------------------------------


def perf_counts(root: Path, producers: int, n: int, kind: str) -> str:
    """One null run under `perf stat` (every process of it: the acknowledger, the
    clients, this driver): futex system calls and context switches per put."""
    out = root / "perf.csv"
    cmd = [
        "perf", "stat", "-x", ",", "-o", str(out),
        "-e", "syscalls:sys_enter_futex,context-switches,cpu-migrations",
        sys.executable, "-m", "bench.sync_floor", "--one", str(producers), str(n),
        "--kind", kind, "--dir", str(root),
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if r.returncode:
        return f"  perf stat failed: {r.stderr.strip()[-300:]}"
    counts = {}
    for line in out.read_text().splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].strip().isdigit():
            counts[parts[2]] = int(parts[0])
    total = producers * n
    return f"  perf stat, one {kind} run (every process; {r.stdout.strip()}): " + ", ".join(
        f"{k} {v / total:.2f}/put" for k, v in counts.items()
    )


# --- the report -------------------------------------------------------------------


def describe(run: NullRun, call_us: float, naive: float) -> list[str]:
    ct = run.ctypes_calls() * call_us
    rate, cpu = without_ctypes(run.rate, run.cpu_us, ct)
    return [
        f"  {run.kind:21} {run.rate:9,.0f}/s (load {run.load:.2f}): ratio "
        f"{run.rate / naive:.2f}; without ctypes {rate:9,.0f}/s: ratio {rate / naive:.2f}; "
        f"CPU ceiling {CORES}e6/{cpu:.1f} = {CORES * 1e6 / cpu:,.0f}/s: ratio "
        f"{CORES * 1e6 / cpu / naive:.2f}",
        f"      CPU per put: clients' loops {run.loop_cpu_us:.1f} + acknowledger "
        f"{run.ack_cpu_us:.1f} = {run.cpu_us:.1f} µs, less ctypes {run.ctypes_calls():.2f} "
        f"calls x {call_us:.2f} = {ct:.2f} -> {cpu:.1f} µs; a client's start "
        f"{run.start_cpu_ms:.0f} ms CPU",
        f"      per put: voluntary switches {run.vol_sw:.2f}, involuntary {run.invol_sw:.2f}, "
        f"FUTEX_WAITs {run.waits:.2f}, wakes of the acknowledger {run.wakes:.2f}; "
        f"{run.rounds:,} rounds ({run.producers * run.n / max(1, run.rounds):.1f} puts each), "
        f"acknowledger scheduled in {run.ack_runs:.2f} per round, slept {run.ack_sleeps:,} "
        f"times, {run.rescued} sleeps ended by the timeout with work waiting; {run.gathered:,} "
        f"rounds gathered first; a round's wake {run.wake_us:.1f} µs CPU"
        + (
            f", its fdatasync {run.fsync_us:.0f} µs mean wall"
            if run.kind.startswith("fdatasync")
            else ""
        ),
    ]


def store_figures(profile: str) -> tuple[float, float, float]:
    """From `bench.profile_sync_check`'s text of one run: the check's rate, and the CPU µs
    per put of the clients' loops and of the store's processes."""
    rate = re.search(r"check's rate ([\d,]+) puts/s", profile)
    cpu = re.search(
        r"clients' loops ([\d.]+) .*?store's processes over the whole run ([\d.]+)", profile
    )
    if not rate or not cpu:
        raise ValueError(f"not a profile_sync_check run: {profile[:200]!r}")
    return float(rate[1].replace(",", "")), float(cpu[1]), float(cpu[2])


def _store_run(root: Path, w: int, n: int) -> tuple[float, float, float, str, float]:
    """The real store in the checks' shape (`bench.profile_sync_check.run_one`, pool on):
    its rate, CPU per put of the clients' loops and of the store, its rounds, the load."""
    from bench.profile_sync_check import run_one

    load = os.getloadavg()[0]
    text = run_one(root, w, True, False, n)
    rounds = next((ln.strip() for ln in text.splitlines() if ln.startswith("  flusher: ")), "")
    return (*store_figures(text), rounds, load)


def _store_lines(fig: tuple[float, float, float, str, float], naive: float) -> list[str]:
    rate, loops, store, rounds, load = fig
    cpu = loops + store
    return [
        f"  {'mqstore, pool on':21} {rate:9,.0f}/s (load {load:.2f}): ratio {rate / naive:.2f}",
        f"      CPU per put: clients' loops {loops:.1f} + store's processes {store:.1f} = "
        f"{cpu:.1f} µs: CPU ceiling {CORES}e6/{cpu:.1f} = {CORES * 1e6 / cpu:,.0f}/s, ratio "
        f"{CORES * 1e6 / cpu / naive:.2f}",
        f"      {rounds}",
    ]


def measure(
    root: Path, producers: list[int], n: int, reps: int, perf: bool,
    kinds: tuple[str, ...] = KINDS, with_store: bool = False,
) -> str:  # fmt: skip
    from bench.profile_sync_check import naive_peer

    call_us, put_us = ctypes_call_us(), null_put_us()
    lines = [
        f"load at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {CORES} cores; "
        f"a ctypes call costs {call_us:.2f} µs beyond a builtin's; the null put's own Python "
        f"{put_us:.2f} µs beyond a put that returns at once (no call made)",
    ]
    for w in producers:
        nw = n or puts_for(w)
        lines.append(f"== {w} producers x {nw:,} puts (the check's shape)")
        best: dict[str, float] = {}
        ceil: dict[str, float] = {}
        fastest: dict[str, float] = {}  # rate without ctypes
        for rep in range(reps):
            order = [*kinds, *(["mqstore"] if with_store else []), "naive"]
            store: tuple[float, float, float, str, float] | None = None
            runs: dict[str, NullRun] = {}
            naive, naive_load = 0.0, 0.0
            for kind in order if rep % 2 == 0 else order[::-1]:
                if kind == "naive":
                    naive = naive_peer(root, w, nw)[0]
                    naive_load = os.getloadavg()[0]
                elif kind == "mqstore":
                    store = _store_run(root, w, nw)
                else:
                    runs[kind] = null_run(root, w, nw, kind)
            lines.append(f"  rep {rep + 1}: naive peer {naive:,.0f}/s (load {naive_load:.2f})")
            if store:
                lines += _store_lines(store, naive)
            for run in runs.values():
                lines += describe(run, call_us, naive)
                ct = run.ctypes_calls() * call_us
                r = without_ctypes(run.rate, run.cpu_us, ct)[0] / naive
                best[run.kind] = max(best.get(run.kind, 0.0), r)
                fastest[run.kind] = max(fastest.get(run.kind, 0.0), r * naive)
                cpu = without_ctypes(run.rate, run.cpu_us, ct)[1]
                ceil[run.kind] = max(ceil.get(run.kind, 0.0), CORES * 1e6 / cpu / naive)
        goal = GOALS.get(w)
        lines.append(
            "  best of each kind, without ctypes (ratio; CPU ceiling's ratio): "
            + ", ".join(f"{k} {r:.2f} ({ceil[k]:.2f})" for k, r in best.items())
        )
        for title, group in (
            ("a store's floor (a null store that fdatasyncs a round)", FSYNC_KINDS),
            ("the hand-off alone (no I/O at all)", NULL_KINDS),
        ):
            if not set(group) & set(best):
                continue
            r = max(best[k] for k in group if k in best)
            lines.append(f"  {title}: " + (verdict(r, goal) if goal else f"{r:.2f}"))
            top = max(fastest[k] for k in group if k in fastest)
            lines.append(
                f"    its fastest run {top:,.0f}/s"
                + (f": {goal}x needs a peer under {top / goal:,.0f}/s" if goal else "")
            )
        if perf:
            lines += [perf_counts(root, w, nw, k) for k in kinds]
    lines.append(f"load at end {os.getloadavg()[0]:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_floor", description=__doc__)
    ap.add_argument("--producers", default="1,16,64")
    ap.add_argument("--n", type=int, default=0, help="puts per client (default: the check's)")
    ap.add_argument("--reps", type=int, default=2, help="pairs per W (default 2)")
    ap.add_argument("--perf", action="store_true", help="and one run of each under perf stat")
    ap.add_argument("--kinds", default=",".join(KINDS), help="the null stores to run")
    ap.add_argument(
        "--with-store", action="store_true",
        help="and mqstore itself in each repetition (bench.profile_sync_check, pool on)",
    )  # fmt: skip
    ap.add_argument("--save", action="store_true", help=f"append to {RESULT.name}")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default /tmp)")
    ap.add_argument("--ack", nargs=4, help=argparse.SUPPRESS)  # the acknowledger's process
    ap.add_argument("--one", nargs=2, type=int, help=argparse.SUPPRESS)  # one run, for perf
    ap.add_argument("--kind", default="null", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ack:
        acknowledge(args.ack[0], int(args.ack[1]), args.ack[2], args.ack[3])
        return 0
    root = Path(tempfile.mkdtemp(prefix="sync-floor-", dir=args.dir))
    try:
        if args.one:
            run = null_run(root, args.one[0], args.one[1], args.kind)
            print(f"{run.rate:,.0f}/s")
            return 0
        producers = [int(w) for w in args.producers.split(",")]
        kinds = tuple(args.kinds.split(","))
        if set(kinds) - set(KINDS):
            ap.error(f"--kinds: one or more of {','.join(KINDS)}")
        text = measure(root, producers, args.n, args.reps, args.perf, kinds, args.with_store)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.save:
        save_text(RESULT, "bench.sync_floor", argv, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
