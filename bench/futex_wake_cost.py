"""What waking sync waiters costs the waker on this machine: per system call or per task.

    python -m bench.futex_wake_cost [--waiters 1,2,4,8,16] [--rounds 300]

N processes sleep on one shared futex word (FUTEX_WAIT, not private: the store's waiters
are other processes, `ipc/native/mqs_futex.c`). Each round, once all N are asleep, the
waker bumps the word and wakes them either with one FUTEX_WAKE for all (what the
flusher's round does, with a bitset) or with one FUTEX_WAKE per waiter (a wake per
waiter slot). The waker's own CPU time around the wake (CLOCK_THREAD_CPUTIME_ID), less
the same call with nobody asleep, is what a round's wake takes from the flusher. The
figure per woken task against the one with a single waiter says whether a round's wake
costs per system call or per task.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import struct
import time

SYS_FUTEX = 202  # x86-64
FUTEX_WAIT, FUTEX_WAKE = 0, 1
INT_MAX = 2**31 - 1

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def futex(addr: int, op: int, val: int) -> int:
    return int(libc.syscall(SYS_FUTEX, ctypes.c_void_p(addr), op, val, None, None, 0))


def waiter(addr: int, word: mmap.mmap) -> None:
    while True:
        seen = struct.unpack_from("=I", word, 0)[0]
        if seen == 0xFFFFFFFF:
            os._exit(0)
        futex(addr, FUTEX_WAIT, seen)


def asleep(pids: list[int]) -> bool:
    """Every waiter is in S state (sleeping in its futex wait)."""
    for p in pids:
        with open(f"/proc/{p}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "S":
                return False
    return True


def run(n: int, rounds: int, per_task: bool) -> list[int]:
    word = mmap.mmap(-1, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(word))
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            waiter(addr, word)
        pids.append(pid)
    costs = []
    try:
        for _ in range(rounds):
            deadline = time.monotonic() + 5
            while not asleep(pids):
                if time.monotonic() > deadline:
                    raise RuntimeError("waiters not asleep within 5 s")
                time.sleep(0.0005)
            v = struct.unpack_from("=I", word, 0)[0]
            struct.pack_into("=I", word, 0, (v + 1) & 0x7FFFFFFF)
            t0 = time.thread_time_ns()
            if per_task:
                for _ in range(n):
                    futex(addr, FUTEX_WAKE, 1)
            else:
                futex(addr, FUTEX_WAKE, INT_MAX)
            costs.append(time.thread_time_ns() - t0)
    finally:
        struct.pack_into("=I", word, 0, 0xFFFFFFFF)
        futex(addr, FUTEX_WAKE, INT_MAX)
        for p in pids:
            os.waitpid(p, 0)
    del word
    return costs


def empty_call(rounds: int) -> float:
    """The waker's CPU for a FUTEX_WAKE that finds nobody (the call itself), ns median."""
    word = mmap.mmap(-1, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(word))
    costs = []
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        futex(addr, FUTEX_WAKE, INT_MAX)
        costs.append(time.thread_time_ns() - t0)
    return statistics.median(costs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--waiters", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=300)
    a = ap.parse_args()
    base = empty_call(a.rounds * 4)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load {load}; {os.cpu_count()} CPUs")
    print(f"a FUTEX_WAKE that finds nobody, with the clock reads around it: {base / 1000:.2f} µs")
    print("waiters  one wake for all: µs / round, µs / task"
          "   one wake per task: µs / round, µs / task")  # fmt: skip
    for n in (int(x) for x in a.waiters.split(",")):
        one = statistics.median(run(n, a.rounds, False)) - base
        each = statistics.median(run(n, a.rounds, True)) - base
        print(f"{n:7d}  {one / 1000:14.2f} {one / n / 1000:10.2f}"
              f"   {each / 1000:24.2f} {each / n / 1000:10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
