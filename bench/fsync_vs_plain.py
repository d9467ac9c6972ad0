"""The sync round's own fdatasync against a plain one on the same disk, in the same run
(issue 23's goal: within 1.1x, from the flusher's trace).

    python -m bench.fsync_vs_plain [--reps 3] [--puts 6000] [--plain 3000] [--pool on,off]
                                   [--blocks N --per-block 300] [--perf] [--save] [--dir DIR]

With `--blocks` (the design that held up beside other jobs' disk load): per pool one
store and four plain loops left running side by side, taking turns in blocks (`paired`):
zero-written record-sized, the same paced at the round's own rate, zero-written 1 KiB and
fallocated 1 KiB; the figure is the median over blocks of the round's p50 / the plain
loop's, and `--perf` adds where each loop's fdatasyncs spend their time.

Without it, per repetition, one after another and in an order that alternates (ABBA) so that a
change of the machine's load falls on both sides:

* the store in `sync1_vs_naive.py`'s shape (the shared perf checks): a fresh SYNC_FLUSH
  store, pool on or off, and one client process timing its loop of N README-shape puts
  (1 KiB body, a key, a tag); the flusher's trace (`MQSTORE_FLUSH_TRACE`) gives every
  round's fdatasync (`fsync_ns`: the syscall alone, timed in the C round), kept for the
  rounds inside the client's loop;
* plain loops of a 1 KiB `pwrite` + `fdatasync` at consecutive offsets of an 8 MiB file
  in a directory of its own block group (as the store's `commitlog/`), of two kinds:
  `fallocated` (unwritten extents: each fdatasync converts the block it covers) and
  `zeroed` (written with zeros and forced first, as the allocator makes a SYNC_FLUSH
  segment), each at the store's nice and time slice (as the flusher runs) and at the
  default ones (the issue's "tight loop"); and `append`, the checks' own peer (O_APPEND,
  1 KiB write + fdatasync, default nice).

Prints per run the p50/p90 of the fdatasync in µs and the 1-minute load, then per kind
the median of the runs' p50s and p90s, and the ratios of the round's to each plain kind.
`--save` appends the text to `bench/results/fsync_vs_plain.txt`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import profile_sync_io as sio
from bench.report import save_text
from bench.store_run import REPO, running_store
from mqstore.conf.settings import StoreSettings
from mqstore.engine import fileio

RESULT = REPO / "bench" / "results" / "fsync_vs_plain.txt"
TRACE_ENV = "MQSTORE_FLUSH_TRACE"
PLAIN_FILE_BYTES = 8 << 20

CLIENT = r"""
import json, sys, time
from mqstore import StoreClient
store_dir, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pad = b"x" * 1000
bad = 0
with StoreClient.attach(store_dir) as c:
    t0 = time.monotonic_ns()
    for i in range(n):
        body = b"w%04d-m%08d|" % (0, i) + pad
        r = c.put("perf", body, keys=["k-0-%d" % i], tags="t%d" % (i % 3))
        bad += r.status.name != "PUT_OK"
    t1 = time.monotonic_ns()
with open(out, "w") as f:
    json.dump({"t0": t0, "t1": t1, "bad": bad}, f)
"""

PLAIN = r"""
import json, os, sys, time
kind, path = sys.argv[1], sys.argv[2]
n, nice, slice_us, size, wsize = (int(x) for x in sys.argv[3:8])
if nice or slice_us:
    from mqstore.workers import priority
    priority.apply(nice)
    priority.apply_slice(slice_us)
if kind == "append":
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
else:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, size)
    if kind == "zeroed":
        zeros = bytes(1 << 20)
        for at in range(0, size, len(zeros)):
            os.pwrite(fd, zeros, at)
    os.fsync(fd)
body = os.urandom(wsize)
lat = []
t0 = time.perf_counter()
for i in range(n):
    if kind == "append":
        os.write(fd, body)
    else:
        os.pwrite(fd, body, (i * wsize) % (size - wsize))
    a = time.perf_counter_ns()
    os.fdatasync(fd)
    lat.append(time.perf_counter_ns() - a)
dt = time.perf_counter() - t0
os.close(fd)
print(json.dumps({"lat": lat, "rate": n / dt}))
"""


STEP_CLIENT = r"""
import json, sys, time
from mqstore import StoreClient
pad = b"x" * 1000
i = 0
with StoreClient.attach(sys.argv[1]) as c:
    print("ready", flush=True)
    for line in sys.stdin:
        n, bad, t0 = int(line), 0, time.monotonic_ns()
        for _ in range(n):
            body = b"w%04d-m%08d|" % (0, i) + pad
            r = c.put("perf", body, keys=["k-0-%d" % i], tags="t%d" % (i % 3))
            bad += r.status.name != "PUT_OK"
            i += 1
        print(json.dumps({"t0": t0, "t1": time.monotonic_ns(), "bad": bad}), flush=True)
"""

STEP_PLAIN = r"""
import json, os, sys, time
kind, path = sys.argv[1], sys.argv[2]
nice, slice_us, size, wsize = (int(x) for x in sys.argv[3:7])
from mqstore.workers import priority
priority.apply(nice)
priority.apply_slice(slice_us)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
os.posix_fallocate(fd, 0, size)
if kind == "zeroed":
    zeros = bytes(1 << 20)
    for at in range(0, size, len(zeros)):
        os.pwrite(fd, zeros, at)
os.fsync(fd)
body, at = os.urandom(wsize), 0
print("ready", flush=True)
for line in sys.stdin:
    n, pace = (int(x) for x in line.split())
    lat, start = [], time.perf_counter_ns()
    for i in range(n):
        if pace:  # a write every `pace` ns, asleep between (as the flusher is)
            time.sleep(max(0, start + i * pace - time.perf_counter_ns()) / 1e9)
        os.pwrite(fd, body, at)
        at = (at + wsize) % (size - wsize)
        a = time.perf_counter_ns()
        os.fdatasync(fd)
        lat.append(time.perf_counter_ns() - a)
    print(json.dumps(lat), flush=True)
"""


def _step(proc: subprocess.Popen[str], n: int, pace_ns: int | None = None) -> Any:
    """One block of a step process: `n` puts (the client) or `n` fdatasyncs (a plain
    loop, one every `pace_ns` if not 0); its reply."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{n}\n" if pace_ns is None else f"{n} {pace_ns}\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def _started(args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"{args[:3]} did not start")
    return proc


def _stopped(proc: subprocess.Popen[str]) -> None:
    """End a step process (EOF on its stdin) and close its pipes; killed (by its pid) if
    it does not end within a minute or is still running after an error."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    finally:
        proc.stdout.close()
    if code:
        raise SystemExit(f"a step process exited with {code}")


# (label, file, writes of a round's bytes instead of 1 KiB, paced at the round's rate)
PAIRED_KINDS = (
    ("zeroed, record-sized", "zeroed", True, False),
    ("zeroed, record-sized, round's pace", "zeroed", True, True),
    ("zeroed, 1 KiB", "zeroed", False, False),
    ("fallocated, 1 KiB", "fallocated", False, False),
)


def paired(
    root: Path, pool: bool, blocks: int, per_block: int, record: int, perf: bool = False
) -> list[str]:
    """One store (sync1's shape, pool on or off) and, beside it, plain loops at the
    flusher's nice and slice, all left running; blocks of `per_block` sync puts and of
    `per_block` plain fdatasyncs of each kind take turns (the order rotating), so the
    round and the plain loops see the same minutes of the machine's load within a
    second or two. Per block the ratio of the round's fdatasync p50 to each plain
    kind's; the median of those ratios is the figure. The paced kind writes at the rate
    of the round block before it (one fdatasync per put's time, asleep between): a
    sync-1 round is such a loop, not a tight one. With `perf`, over all blocks,
    profile_sync_io's breakdown of the flusher's and each plain loop's fdatasyncs."""
    trace = root / "flush.trace"
    client = root / "step_client.py"
    client.write_text(STEP_CLIENT)
    d = root / "plain"
    d.mkdir(exist_ok=True)
    fileio.spread_subdirectories(d)
    s = StoreSettings()
    lat: dict[str, list[list[float]]] = {k[0]: [] for k in PAIRED_KINDS}
    windows: list[tuple[int, int]] = []
    loads = [_load()]
    os.environ[TRACE_ENV] = str(trace)
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        with running_store(root, "store", sync=True, pool=pool) as run:
            for i, (label, kind, sized, _) in enumerate(PAIRED_KINDS):
                wsize = record if sized else 1024
                # Each file in a directory of its own block group, as the store's
                # `commitlog/`: no other file's time stamps in its inode-table block.
                (d / str(i)).mkdir()
                size = (((blocks * per_block + 1) * wsize >> 20) + 2) << 20
                procs[label] = _started(
                    [sys.executable, "-c", STEP_PLAIN, kind, str(d / str(i) / "plain.dat"),
                     str(s.store_nice), str(s.store_slice_us), str(size), str(wsize)]
                )  # fmt: skip
            cl = procs["round"] = _started([sys.executable, str(client), str(run.store_dir)])
            got = _step(cl, 200)  # warm: the client's first puts, the dispatcher's first round
            pace = (got["t1"] - got["t0"]) // 200  # the last round block's ns per put
            paced = {k[0] for k in PAIRED_KINDS if k[3]}
            flusher = sio._pid_of(run.store_dir, "flusher")
            rec = _recorded(root, perf)
            turn = ["round", *lat]
            for b in range(blocks):
                for who in turn[b % len(turn) :] + turn[: b % len(turn)]:
                    if who == "round":
                        got = _step(cl, per_block)
                        if got["bad"]:
                            raise SystemExit(f"{got['bad']} sync puts not PUT_OK")
                        windows.append((got["t0"], got["t1"]))
                        pace = (got["t1"] - got["t0"]) // per_block
                    else:
                        step = _step(procs[who], per_block, pace if who in paced else 0)
                        lat[who].append([x / 1e3 for x in step])
                loads.append(_load())
            why: dict[str, str] = {}
            if rec is not None:
                rec.send_signal(signal.SIGINT)
                rec.wait()
                script = sio._perf_script(root / "perf.data")
                why["round"] = _why(script, flusher)
                for label in lat:
                    why[label] = _why(script, procs[label].pid)
            for proc in procs.values():
                _stopped(proc)  # inside the block: the client detaches before the store stops
            procs.clear()
    finally:
        for proc in procs.values():  # after an error: killed by pid, pipes closed
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        os.environ.pop(TRACE_ENV)
        shutil.rmtree(d, ignore_errors=True)
        client.unlink(missing_ok=True)
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    trace.unlink()
    rounds: list[list[float]] = [[] for _ in windows]
    for r in rows:
        for i, (t0, t1) in enumerate(windows):
            if t0 <= r["served"] <= t1 and r["fsync_ns"]:
                rounds[i].append(r["fsync_ns"] / 1e3)
    allr = [x for xs in rounds for x in xs]
    name = f"round, pool {'on' if pool else 'off'}"
    out = [
        f"{time.strftime('%H:%M:%S', time.gmtime())} paired, {blocks} blocks of {per_block}, "
        f"load {min(loads):.1f}-{max(loads):.1f}, record {record} B; "
        f"{name}: {len(allr)} rounds ({blocks * per_block / max(len(allr), 1):.2f} puts each) "
        f"p50 {statistics.median(allr):.1f} p90 {_q(allr, 0.9):.1f} µs"
    ]
    for label, blocks_lat in lat.items():
        allp = [x for xs in blocks_lat for x in xs]
        pairs = [(r, p) for r, p in zip(rounds, blocks_lat, strict=True) if r]
        ratios = [statistics.median(r) / statistics.median(p) for r, p in pairs]
        ratios90 = [_q(r, 0.9) / _q(p, 0.9) for r, p in pairs]
        out.append(
            f"  plain {label:36s} p50 {statistics.median(allp):7.1f} p90 {_q(allp, 0.9):7.1f} µs;"
            f" round / plain per block: p50 median {statistics.median(ratios):.2f}x "
            f"(quartiles {_q(ratios, 0.25):.2f}-{_q(ratios, 0.75):.2f}), "
            f"p90 median {statistics.median(ratios90):.2f}x"
        )
    out += [f"  breakdown, {k}: {v}" for k, v in why.items()]
    print("\n".join(out), flush=True)
    return out


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def _load() -> float:
    return os.getloadavg()[0]


def _recorded(root: Path, perf: bool) -> subprocess.Popen[bytes] | None:
    """`perf record -a` of the fdatasync syscalls and the block requests (`--perf`)."""
    if not perf:
        return None
    args = ["-a", "-m", "1024", "-eblock:block_rq_issue", *sio.LATENCY_EVENTS]
    return sio._perf_record(root, root / "perf.data", args)


def _why(script: str, pid: int) -> str:
    """profile_sync_io's breakdown of `pid`'s fdatasyncs, and the block requests it
    issued per fdatasync: data, and inode-table (metadata, `M`) writes."""
    syncs = data = meta = 0
    for line in script.splitlines():
        f = line.split()
        if len(f) < 5 or f[0] != str(pid):
            continue
        if f[3].startswith("raw_syscalls:sys_enter"):
            syncs += 1
        elif f[3].startswith("block:block_rq_issue") and len(f) > 5 and f[5].startswith("W"):
            meta += "M" in f[5]
            data += "M" not in f[5]
    per = f"; per fdatasync {data / max(syncs, 1):.2f} data and {meta / max(syncs, 1):.3f} "
    return sio._breakdown(script, pid).strip() + per + "inode-table writes"


def _breakdown(root: Path, rec: subprocess.Popen[bytes] | None, pid: int) -> str:
    if rec is None:
        return ""
    rec.send_signal(signal.SIGINT)
    rec.wait()
    return sio._breakdown(sio._perf_script(root / "perf.data"), pid).strip()


def store_run(root: Path, pool: bool, puts: int, perf: bool = False) -> dict[str, Any]:
    """One sync1-shaped run; the round's fdatasync p50/p90 (µs) over the client's loop."""
    trace = root / "flush.trace"
    client = root / "client.py"
    client.write_text(CLIENT)
    out = root / "client.json"
    os.environ[TRACE_ENV] = str(trace)
    try:
        with running_store(root, "store", sync=True, pool=pool) as run:
            flusher = sio._pid_of(run.store_dir, "flusher")
            rec = _recorded(root, perf)
            subprocess.run(
                [sys.executable, str(client), str(run.store_dir), str(puts), str(out)],
                check=True, cwd=REPO,
            )  # fmt: skip
            why = _breakdown(root, rec, flusher)
    finally:
        os.environ.pop(TRACE_ENV)
    got = json.loads(out.read_text())
    out.unlink()
    if got["bad"]:
        raise SystemExit(f"{got['bad']} sync puts not PUT_OK")
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    trace.unlink()
    fs = [r["fsync_ns"] / 1e3 for r in rows if got["t0"] <= r["served"] <= got["t1"]]
    fs = [f for f in fs if f > 0]
    bs = [r["bytes"] for r in rows if got["t0"] <= r["served"] <= got["t1"] and r["msgs"]]
    rounds = len(fs)
    return {
        "bytes": statistics.fmean(bs) if bs else 0.0,
        "p50": statistics.median(fs),
        "p90": _q(fs, 0.9),
        "rate": puts / ((got["t1"] - got["t0"]) / 1e9),
        "per_round": puts / max(rounds, 1),
        "n": rounds,
        "why": why,
    }


def plain_run(
    root: Path, kind: str, n: int, flusher_prio: bool, wsize: int = 1024, perf: bool = False
) -> dict[str, Any]:
    d = root / "plain"
    d.mkdir(exist_ok=True)
    path = d / f"{kind}.dat"
    s = StoreSettings()
    nice, slice_us = (s.store_nice, s.store_slice_us) if flusher_prio else (0, 0)
    rec = _recorded(root, perf)
    proc = subprocess.Popen(
        [sys.executable, "-c", PLAIN, kind, str(path), str(n), str(nice), str(slice_us),
         str(PLAIN_FILE_BYTES), str(wsize)],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"plain loop {kind} exited with {proc.returncode}")
    why = _breakdown(root, rec, proc.pid)
    path.unlink()
    got = json.loads(out)
    lat = [x / 1e3 for x in got["lat"]]
    return {
        "p50": statistics.median(lat),
        "p90": _q(lat, 0.9),
        "rate": got["rate"],
        "n": n,
        "why": why,
    }


# (label, file, at the flusher's nice and slice, writes of a round's bytes instead of 1 KiB)
PLAIN_KINDS = (
    ("fallocated, flusher's nice", "fallocated", True, False),
    ("zeroed, flusher's nice", "zeroed", True, False),
    ("zeroed, record-sized, flusher's nice", "zeroed", True, True),
    ("fallocated, nice 0", "fallocated", False, False),
    ("zeroed, nice 0", "zeroed", False, False),
    ("append (the checks' peer)", "append", False, False),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fsync_vs_plain", description=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--puts", type=int, default=6000, help="sync puts per store run")
    ap.add_argument("--plain", type=int, default=3000, help="fdatasyncs per plain loop")
    ap.add_argument("--pool", default="on,off")
    ap.add_argument(
        "--perf", action="store_true",
        help="then one more round per pool and plain record-sized loop under perf record "
        "(with --blocks: the whole paired run): where each fdatasync's time goes "
        "(profile_sync_io's breakdown)",
    )  # fmt: skip
    ap.add_argument(
        "--blocks", type=int, default=0,
        help="instead: per pool one store and plain loops side by side, this many blocks "
        "taking turns (paired ratios)",
    )  # fmt: skip
    ap.add_argument("--per-block", type=int, default=300)
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="perf-fsyncplain-", dir=a.dir))
    fileio.spread_subdirectories(root)  # the plain files' and the store's own block groups
    pools = [p == "on" for p in a.pool.split(",") if p]
    runs: dict[str, list[dict[str, Any]]] = {}
    record = [1024]  # a round's bytes (the last store run's mean): the record-sized loops' writes
    lines: list[str] = []

    def note(name: str, r: dict[str, Any], keep: bool = True) -> None:
        if keep:
            runs.setdefault(name, []).append(r)
        extra = ""
        if "per_round" in r:
            extra = f", {r['per_round']:.2f} puts/round, {r['bytes']:,.0f} bytes/round"
            record[0] = round(r["bytes"]) or record[0]
        elif r.get("wsize", 1024) != 1024:
            extra = f", {r['wsize']} B writes"
        line = (
            f"{time.strftime('%H:%M:%S', time.gmtime())} load {_load():5.1f}  {name:34s} "
            f"p50 {r['p50']:7.1f}  p90 {r['p90']:7.1f} µs  {r['rate']:7,.0f}/s  "
            f"n {r['n']:.0f}{extra}"
        )
        print(line, flush=True)
        lines.append(line)
        if r["why"]:
            print(r["why"], flush=True)
            lines.append("  " + r["why"])

    def plain(label: str, kind: str, prio: bool, sized: bool, perf: bool = False) -> None:
        wsize = record[0] if sized else 1024
        got = plain_run(root, kind, a.plain, prio, wsize, perf)
        got["wsize"] = wsize
        note(label, got, keep=not perf)

    if a.blocks:
        try:
            warm = store_run(root, True, 500)
            lines.append(f"a round's bytes: {warm['bytes']:,.0f} (500 puts, pool on)")
            for pool in pools:
                rec_bytes = round(warm["bytes"])
                lines += paired(root, pool, a.blocks, a.per_block, rec_bytes, a.perf)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        if a.save:
            save_text(RESULT, "bench.fsync_vs_plain", argv, "\n".join(lines))
        return 0
    try:
        note("round, pool on (warm-up, a round's bytes)", store_run(root, True, 500), False)
        for rep in range(a.reps):
            kinds = PLAIN_KINDS if rep % 2 == 0 else PLAIN_KINDS[::-1]
            for pool in pools if rep % 2 == 0 else pools[::-1]:
                for kind in kinds:
                    plain(*kind)
                note(f"round, pool {'on' if pool else 'off'}", store_run(root, pool, a.puts))
                kinds = kinds[::-1]
        if a.perf:
            lines.append("under perf record (not in the medians):")
            for pool in pools:
                plain(*PLAIN_KINDS[2], perf=True)
                got = store_run(root, pool, a.puts, perf=True)
                note(f"round, pool {'on' if pool else 'off'}", got, keep=False)
            plain(*PLAIN_KINDS[2], perf=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = len(lines)
    lines.append("")
    lines.append("median over runs of each run's p50 / p90 (µs); ratio = round / plain:")
    med = {k: (statistics.median(r["p50"] for r in v), statistics.median(r["p90"] for r in v))
           for k, v in runs.items()}  # fmt: skip
    for k, (p50, p90) in med.items():
        lines.append(f"  {k:42s} p50 {p50:7.1f}  p90 {p90:7.1f}  ({len(runs[k])} runs)")
    for rk in [k for k in med if k.startswith("round")]:
        for pk in [k for k in med if not k.startswith("round")]:
            lines.append(
                f"  {rk} / {pk}: p50 {med[rk][0] / med[pk][0]:.2f}x, "
                f"p90 {med[rk][1] / med[pk][1]:.2f}x"
            )
    print("\n".join(lines[summary:]))
    if a.save:
        save_text(RESULT, "bench.fsync_vs_plain", argv, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
