"""A producer process's start-up CPU (issue 23): `python -m bench.client_start [--runs N]`.

The perf checks (`../shared/perf/sync16_vs_naive.py`, `sync64_vs_naive.py`) start 16 or
64 client interpreters at once; each one's start (interpreter, `from mqstore import
StoreClient`, `StoreClient.attach`) runs beside the other clients' put loops. This
measures that start's CPU (user + system, from `wait4`), median of N runs, one at a
time, for: a bare interpreter, the import, and import + attach + close against a running
store (SYNC_FLUSH, started here under a temporary directory and stopped at the end).
Then, in one process, the attach's parts (CPU µs, median of N attaches).

`--callgrind` adds each start's instruction count (valgrind's callgrind, one run each,
PYTHONHASHSEED=0): unlike CPU time it does not move with the machine's load, so a
before/after pair on a shared machine compares.

Run from the checkout's root after `make setup`; prints markdown.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

PY = os.path.join(os.getcwd(), ".venv", "bin", "python")
MQ = os.path.join(os.getcwd(), ".venv", "bin", "mqstore")

CASES = {
    "bare interpreter (`-c pass`)": "pass",
    "`from mqstore import StoreClient`": "from mqstore import StoreClient",
    "import + attach + close": (
        "import sys\nfrom mqstore import StoreClient\n"
        "with StoreClient.attach(sys.argv[1]) as c:\n    pass\n"
    ),
}

# Attach's parts, timed in one process with CPU clocks (attach done N times).
PARTS = r"""
import os, statistics, sys, time
from mqstore import StoreClient
from mqstore.ipc import channel
from mqstore.ipc import session as s
store, n = sys.argv[1], int(sys.argv[2])
cpu = time.process_time_ns
parts = {}
def timed(name, fn):
    def run(*a, **k):
        t = cpu()
        try:
            return fn(*a, **k)
        finally:
            parts.setdefault(name, []).append((cpu() - t) / 1000)
    return run
channel.connect = timed("connect to the supervisor socket", channel.connect)
channel.recv_json = timed("attach request: answer wait + decode", channel.recv_json)
s._attach_checked = timed("map the control block and pool (shm)", s._attach_checked)
s.LiveLock = timed("liveness lock file", s.LiveLock)
s.settings_from_doc = timed("settings from the answer", s.settings_from_doc)
for _ in range(n):
    t = cpu()
    c = StoreClient.attach(store)
    parts.setdefault("whole attach (StoreClient.attach)", []).append((cpu() - t) / 1000)
    t = cpu()
    c.close()
    parts.setdefault("close", []).append((cpu() - t) / 1000)
for k, v in parts.items():
    print("%s\t%.0f" % (k, statistics.median(v)))
"""


def _cpu_ms(argv: list[str]) -> float:
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{argv} exited {p.returncode}")
    return (ru.ru_utime + ru.ru_stime) * 1000


def _instructions(argv: list[str]) -> int:
    """User-space instructions of one run of `argv` (callgrind's "Collected")."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"},
    ).stderr  # fmt: skip
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise SystemExit(f"no instruction count from callgrind for {argv}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--callgrind", action="store_true", help="also count instructions")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="client-start-")
    store = os.path.join(root, "store")
    os.makedirs(store)
    conf = os.path.join(root, "broker.conf")
    with open(conf, "w") as f:
        f.write("flushDiskType=SYNC_FLUSH\n")
    log = open(os.path.join(root, "supervisor.log"), "wb")  # noqa: SIM115 (closed in finally)
    sup = subprocess.Popen(
        [MQ, "start", store, "--config", conf],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([MQ, "status", store], capture_output=True).returncode != 0:
            if sup.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the store did not start")
            time.sleep(0.3)
        print("load before:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        print()
        ir_head = " instructions (M) |" if args.callgrind else ""
        print("| start | CPU ms, median | min | max |" + ir_head)
        print("| --- | ---: | ---: | ---: |" + (" ---: |" if args.callgrind else ""))
        for name, code in CASES.items():
            ms = [_cpu_ms([PY, "-c", code, store]) for _ in range(args.runs)]
            ir = f" {_instructions([PY, '-c', code, store]) / 1e6:.1f} |" if args.callgrind else ""
            print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f} | {max(ms):.1f} |{ir}")
        print()
        out = subprocess.run(
            [PY, "-c", PARTS, store, str(args.runs)], capture_output=True, text=True, check=True
        ).stdout
        print(f"attach's parts, CPU µs, median of {args.runs} attaches in one process:")
        print()
        print("| part | CPU µs |")
        print("| --- | ---: |")
        for line in out.splitlines():
            k, v = line.split("\t")
            print(f"| {k} | {v} |")
        print()
        print("load after:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    finally:
        subprocess.run([MQ, "stop", store], capture_output=True)
        try:
            sup.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(sup.pid, 9)
            sup.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
