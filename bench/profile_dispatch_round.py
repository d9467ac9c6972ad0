"""A dispatch round's price by its size: what a round costs before its first record.

    python -m bench.profile_dispatch_round [--messages 20000] [--rounds 4,8,32,4096]
                                           [--callgrind] [--python-round] [--compare]

Puts `--messages` README-shape messages (1 KiB, `keys=[...]`, tags of three values: the
sync checks' call) into a fresh ASYNC_FLUSH store, then replays its log into fresh
consume queues and index in this process (`bench.bench_dispatch.replay`) once per round
size, each round at most that many records: CPU per record and per round. Under sync
puts the dispatcher's limit is the flushed position, which moves a few records per
flusher round, so the rounds are that small unless it waits between them
(`workers.dispatcher`: 1 ms once a round reached the limit, 4 ms after a round of 8).

`--callgrind`: the same replay in a child process under `valgrind --tool=callgrind`,
once dispatching the whole log in rounds of each size and once only its first half; the
difference over the rounds of the second half is a round's instructions (the set-up,
the queue and index files' creation and the close drop out), which do not move with
the machine's load as CPU times do (PYTHONHASHSEED=0 in both).

`--python-round`: every batch through the Python path (`Dispatcher.plain_c = False`),
not the C plain round: the "before" of an A/B in one build. `--compare`: replay the log
in rounds of each size both ways, keeping the files, and print the md5 of the consume
queues and the index files each way (index files in name order: their names are the
clock's).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_dispatch import replay
from bench.store_run import REPO, client_api, running_store


def _child(
    store_dir: Path, work: Path, size: int, part: float, messages: int, plain_c: bool = True
) -> int:
    """Open a dispatcher on fresh queues over `store_dir`'s log of `messages` records and
    dispatch its first `part` in rounds of at most `size` records. Prints the rounds."""
    from mqstore.conf.settings import StoreSettings
    from mqstore.engine.dispatch import Dispatcher
    from mqstore.engine.reader import Geometry

    work.mkdir(parents=True)
    os.symlink(store_dir / "commitlog", work / "commitlog")
    disp = Dispatcher.open(work, Geometry.of(store_dir, StoreSettings()))
    disp.lag_hist = [0] * 18  # as the dispatcher process keeps it
    disp.plain_c = plain_c
    rounds = offset = 0
    try:
        limit, records, want = disp.log.max_offset(), 0, part * messages
        while offset < limit and records < want:
            res = disp.dispatch(offset, limit, max_records=size)
            if res.next_offset <= offset:
                break
            offset, rounds, records = res.next_offset, rounds + 1, records + res.records
    finally:
        disp.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"rounds {rounds} records {records}")
    return 0


def _files_md5(store_dir: Path, work: Path, size: int, plain_c: bool) -> tuple[int, str]:
    """Replay the whole log in rounds of `size` into `work`, keep the files, and return
    (how many consume-queue and index files, the md5 of their names and bytes)."""
    from mqstore.conf.settings import StoreSettings
    from mqstore.engine.dispatch import Dispatcher
    from mqstore.engine.reader import Geometry

    work.mkdir(parents=True)
    os.symlink(store_dir / "commitlog", work / "commitlog")
    disp = Dispatcher.open(work, Geometry.of(store_dir, StoreSettings()))
    disp.plain_c = plain_c
    try:
        offset, limit = 0, disp.log.max_offset()
        while offset < limit:
            res = disp.dispatch(offset, limit, max_records=size)
            if res.next_offset <= offset:
                break
            offset = res.next_offset
    finally:
        disp.close()
    h, n = hashlib.md5(), 0
    cq = sorted(p for p in (work / "consumequeue").rglob("*") if p.is_file())
    index = sorted(p for p in (work / "index").glob("*") if p.is_file())
    for k, p in enumerate(cq + index):
        name = p.relative_to(work).as_posix() if k < len(cq) else f"index/{k - len(cq)}"
        h.update(name.encode() + b"\0" + p.read_bytes())
        n += 1
    shutil.rmtree(work, ignore_errors=True)
    return n, h.hexdigest()


def _instructions(
    store_dir: Path,
    work: Path,
    size: int,
    part: float,
    messages: int,
    plain_c: bool = True,
    keep: Path | None = None,
) -> tuple[int, int, int]:
    """(instructions, rounds, records) of one child under callgrind; `keep`: its output goes there
    (for `callgrind_annotate`) instead of being deleted."""
    out = keep if keep is not None else work.with_suffix(".callgrind")
    # One BLAS thread: numpy (imported by bench.procs) otherwise starts OpenBLAS worker
    # threads whose spinning callgrind counts, about 1k instructions a record of noise.
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(REPO),
           "OPENBLAS_NUM_THREADS": "1"}  # fmt: skip
    r = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         "-m", "bench.profile_dispatch_round", "--child", str(store_dir), str(work), str(size),
         str(part), str(messages), "1" if plain_c else "0"],
        capture_output=True, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"callgrind child (rounds of {size}): {r.stderr[-2000:]}")
    got = re.search(r"rounds (\d+) records (\d+)", r.stdout)
    total = re.search(r"^totals: (\d+)", out.read_text(), re.M)
    if keep is None:
        out.unlink()
    if got is None or total is None:
        raise SystemExit(f"callgrind child (rounds of {size}) said: {r.stdout[-500:]}")
    return int(total.group(1)), int(got.group(1)), int(got.group(2))


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        return _child(Path(argv[1]), Path(argv[2]), int(argv[3]), float(argv[4]), int(argv[5]),
                      argv[6] == "1")  # fmt: skip
    ap = argparse.ArgumentParser(prog="python -m bench.profile_dispatch_round")
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--rounds", default="4,8,32,4096", help="records per round, comma-separated")
    ap.add_argument("--callgrind", action="store_true", help="instructions a round (valgrind)")
    ap.add_argument("--python-round", action="store_true", help="no C plain round (A/B)")
    ap.add_argument("--compare", action="store_true", help="md5 of the files, C and Python")
    ap.add_argument(
        "--keep",
        help="with --callgrind: keep the callgrind outputs as KEEP.<size> and KEEP.<size>.half",
    )
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.rounds.split(",")]
    if args.callgrind and shutil.which("valgrind") is None:
        ap.error("--callgrind needs valgrind")
    store_client, _ = client_api()
    with tempfile.TemporaryDirectory(prefix="mqs-dispatch-round-") as tmp:
        root = Path(tmp)
        with running_store(root, "store", sync=False, pool=True) as run:
            pad = b"x" * 1000
            with store_client.attach(str(run.store_dir)) as c:
                for i in range(args.messages):
                    body = b"w%04d-m%08d|" % (i % 16, i) + pad
                    c.put("perf", body, keys=[f"k-{i}"], tags=f"t{i % 3}")
            for n, size in enumerate(sizes):
                got = replay(run.store_dir, root / f"replay{n}", 1 << 20, max_records=size,
                             plain_c=not args.python_round)  # fmt: skip
                print(
                    f"{size:5d} records a round: {got['replay_records']} records, "
                    f"{got['replay_cpu_us_per_record']} µs CPU a record, "
                    f"{got['replay_cpu_us_per_round']} µs a round"
                )
            if args.callgrind:
                msgs = args.messages
                for n, size in enumerate(sizes):
                    c, sd = not args.python_round, run.store_dir
                    keep = Path(f"{args.keep}.{size}") if args.keep else None
                    whole, rounds, recs = _instructions(
                        sd, root / f"cg{n}", size, 1.0, msgs, c, keep
                    )
                    keep_half = keep.with_suffix(keep.suffix + ".half") if keep else None
                    half, first, first_recs = _instructions(
                        sd, root / f"cg{n}h", size, 0.5, msgs, c, keep_half
                    )
                    per = (whole - half) // max(rounds - first, 1)
                    per_record = (whole - half) // max(recs - first_recs, 1)
                    print(
                        f"{size:5d} records a round: {per:,} instructions a round, "
                        f"{per_record:,} a record (callgrind, over the {rounds - first} "
                        "rounds of the log's second half)"
                    )
            if args.compare:
                for n, size in enumerate(sizes):
                    with_c = _files_md5(run.store_dir, root / f"md5c{n}", size, True)
                    with_py = _files_md5(run.store_dir, root / f"md5p{n}", size, False)
                    same = "same" if with_c == with_py else "DIFFERENT"
                    print(
                        f"{size:5d} records a round: C round {with_c[0]} files md5 "
                        f"{with_c[1]}; Python {with_py[0]} files md5 {with_py[1]}: {same}"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
