"""CPU per put of every process of the store, in put_shapes.py's shape.

    python -m bench.put_procs_cpu [--rounds 6] [--n 100000] [--shapes readme,properties]

Shapes: put_shapes.py's (str_key, readme, two_keys, properties) and batch128,
batch_1m.py's put_batch of 128 dicts with tags and a str key.

One ASYNC_FLUSH store with the write pool and 1 GiB segments, as `../shared/perf/
put_shapes.py` starts it; one producer process attached to it making ASYNC puts of 1 KiB
bodies in that check's call shapes (the README's `keys=[k]`, tags; and the others by
name). Each round: the bench reads the CPU time of the producer and of every process of
the store's tree (supervisor, committer, flusher, dispatcher, ...) from
`/proc/<pid>/task/*/schedstat` (ns, summed over threads), tells the producer to run
`--n` puts of one shape, reads them again when it is done (the producer then waits), and
again after `--settle` seconds more, so that what the store's processes do behind the
puts (the commit, the dispatch of the last records) counts too. Rounds of the shapes are
interleaved. It prints, per shape, the median over rounds of each process's CPU ns per
put, its context switches per 1,000 puts, and the round's wall-clock rate.

On a 2-core machine the sum is what bounds the rate: every process shares the two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.callgrind_put_shapes import SHAPES_SRC
from bench.store_run import running_store

CLIENT = (
    r"""
import sys, time
from mqstore import StoreClient
store, n = sys.argv[1], int(sys.argv[2])
count = n
"""
    + SHAPES_SRC
    + r"""
# batch_1m.py's call: put_batch of 128 dicts (tags, a str key), each result's status read.
# One step of the shape per 128 puts (`--n` a multiple of 128).
batches = [[{"topic": "t", "body": bodies[j * 128 + i], "tags": "t", "keys": keys[j * 128 + i]}
            for i in range(128)] for j in range(count // 128)]
class _Ok:
    class status:
        name = "PUT_OK"
def _batch128(c, i):
    if i % 128:
        return _Ok
    for r in c.put_batch(batches[i // 128]):
        if r.status.name != "PUT_OK":
            return r
    return _Ok
shapes["batch128"] = _batch128
with StoreClient.attach(store) as c:
    for i in range(2000):
        c.put("warm", pad)
    print("ready", flush=True)
    for line in sys.stdin:
        f = shapes[line.strip()]
        bad = 0
        t0 = time.perf_counter()
        for i in range(n):
            if f(c, i).status.name != "PUT_OK":
                bad += 1
        print("done %f %d" % (time.perf_counter() - t0, bad), flush=True)
"""
)


def proc_name(p: psutil.Process) -> str:
    cmd = p.cmdline()
    if "mqstore.workers.worker_main" in cmd:
        i = cmd.index("mqstore.workers.worker_main")
        return cmd[i + 1]
    if "start" in cmd:
        return "supervisor"
    return os.path.basename(cmd[0]) if cmd else str(p.pid)


def cpu_ns(pid: int) -> tuple[int, int, int]:
    """(CPU ns, context switches, minor page faults) of `pid`, summed over its threads."""
    ns = switches = 0
    with open(f"/proc/{pid}/stat") as f:
        faults = int(f.read().rsplit(")", 1)[1].split()[7])
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
            with open(f"{base}/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                        switches += int(line.split()[-1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return ns, switches, faults


def snapshot(pids: dict[str, int]) -> dict[str, tuple[int, int, int]]:
    return {name: cpu_ns(pid) for name, pid in pids.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.put_procs_cpu", description=__doc__)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--shapes", default="readme,properties")
    ap.add_argument("--settle", type=float, default=0.3)
    ap.add_argument("--json", help="also write the per-round figures here")
    ap.add_argument("--dir", help="where the store goes (default: a new temporary directory)")
    ap.add_argument(
        "--perf-record",
        help="also `perf record -g` every process of the run during the rounds, to this file",
    )
    a = ap.parse_args(argv)
    shapes = a.shapes.split(",")
    if "batch128" in shapes and a.n % 128:
        ap.error("--n must be a multiple of 128 with the batch128 shape")
    load0 = os.getloadavg()
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in shapes}
    with tempfile.TemporaryDirectory(prefix="mqs-procs-cpu-", dir=a.dir) as tmp:
        root = Path(tmp)
        client = root / "client.py"
        client.write_text(CLIENT)
        extra = {"segment_size_bytes": 1 << 30}
        with running_store(root, "store", sync=False, pool=True, extra=extra) as run:
            cp = subprocess.Popen(
                [sys.executable, str(client), str(run.store_dir), str(a.n)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert cp.stdin is not None and cp.stdout is not None
            try:
                if cp.stdout.readline().strip() != "ready":
                    raise SystemExit("producer did not start")
                sup = psutil.Process(run.proc.pid)
                pids = {proc_name(p): p.pid for p in sup.children(recursive=True)}
                pids["supervisor"] = sup.pid
                pids["producer"] = cp.pid
                time.sleep(1.0)  # the warm-up's commit and dispatch are not the rounds'
                rec = None
                if a.perf_record:
                    rec = subprocess.Popen(
                        ["perf", "record", "-q", "-o", a.perf_record,
                         "-p", ",".join(str(p) for p in pids.values())],
                    )  # fmt: skip
                    time.sleep(0.5)
                for _ in range(a.rounds):
                    for shape in shapes:
                        s0 = snapshot(pids)
                        cp.stdin.write(shape + "\n")
                        cp.stdin.flush()
                        _, wall, bad = cp.stdout.readline().split()
                        s1 = snapshot(pids)
                        time.sleep(a.settle)
                        s2 = snapshot(pids)
                        if int(bad):
                            raise SystemExit(f"{bad} puts not PUT_OK")
                        row: dict[str, float] = {"rate": a.n / float(wall)}
                        for name in pids:
                            end = s1 if name == "producer" else s2
                            row[name] = (end[name][0] - s0[name][0]) / a.n
                            row[name + ".cs"] = (end[name][1] - s0[name][1]) * 1000 / a.n
                            row[name + ".flt"] = (end[name][2] - s0[name][2]) * 1000 / a.n
                        row["total"] = sum(row[name] for name in pids)
                        rows[shape].append(row)
                if rec is not None:
                    rec.send_signal(signal.SIGINT)
                    rec.wait(timeout=120)
            finally:
                cp.stdin.close()
                cp.wait(timeout=60)
                cp.stdout.close()
    load1 = os.getloadavg()
    print(
        f"CPU ns per put by process, median of {a.rounds} rounds of {a.n:,} puts "
        f"(load {load0[0]:.1f} -> {load1[0]:.1f}); per 1,000 puts: cs = context switches, "
        "flt = minor page faults"
    )
    for shape, rs in rows.items():
        names = [k for k in rs[0] if not k.endswith((".cs", ".flt")) and k not in ("rate", "total")]
        names.sort(key=lambda k: -statistics.median(r[k] for r in rs))
        cells = [
            f"{k} {statistics.median(r[k] for r in rs):.0f} "
            f"(cs {statistics.median(r[k + '.cs'] for r in rs):.1f}, "
            f"flt {statistics.median(r[k + '.flt'] for r in rs):.1f})"
            for k in names
        ]
        tot = statistics.median(r["total"] for r in rs)
        rate = statistics.median(r["rate"] for r in rs)
        print(f"{shape}: total {tot:.0f} ns, rate {rate:,.0f}/s; " + ", ".join(cells))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
