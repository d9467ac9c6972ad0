"""Recovery benchmark (issue 4): `python -m bench.bench_recovery [--quick] [--dir D]`.

For stores of 0.25, 0.5 and 1 GiB (1 KiB bodies, 4 queues, 2 keys per message, 64 MiB
segments; `--quick`: 32, 64 and 128 MiB), written with the engine's CommitLog and
dispatched, it measures in one run:

* `read`: a plain sequential read of the commit-log files (8 MiB `os.read`s);
* `scan`: the record scanner alone (`CommitLog.scan_chunks`, CRC on) over the whole log:
  what validation costs without the rest of recovery;
* `validate`: abnormal recovery (abort present, all-zero checkpoint, so every record
  from the first segment is validated with its CRC) with complete consume queues and
  index: the validation rate, compared with the plain read of the same files;
* `redispatch`: abnormal recovery after the consume queues and index were deleted, so
  every record is also dispatched (goal: >= 500k records/s at 1 GiB); then after the
  index alone was deleted (the queues are complete: every unit is already built);
* `normal`: normal recovery (abort absent), which must not grow with the store's size.

All runs read warm files (the page cache holds them; the plain read is measured the same
way, so the ratio compares CPU work with a copy). Writes `bench/results/recovery.*`, and
with `--profile` the cProfile of one abnormal and one normal recovery of the largest store
(`recovery_profile.txt`): where the time goes when a goal is missed. `--sizes 256,2048`
picks other store sizes (MiB).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import RESULTS, Column, Goal, Report, write
from mqstore.conf.settings import StoreSettings
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.indexservice import IndexService
from mqstore.engine.reader import Geometry
from mqstore.engine.record import Message
from mqstore.engine.recovery import recover_store

MIB = 1 << 20
SEGMENT = 64 * MIB
GEO = Geometry(SEGMENT, 6_000_000, 500_000, 2_000_000)


def build(store: Path, size_bytes: int) -> int:
    log = CommitLog.open(store / "commitlog", SEGMENT)
    body = os.urandom(1024)
    n = 0
    while log.max_offset() < size_bytes:
        props = {"KEYS": f"k{n}", "TAGS": "a", "UNIQ_KEY": f"U{n:020d}"}
        log.append(Message("Bench", body, props, queue_id=n % 4))
        n += 1
    cqs = ConsumeQueueStore(store, GEO.cq_file_size_bytes)
    idx = IndexService(store, GEO.hash_slot_num, GEO.index_num)
    Dispatcher(log, cqs, idx).dispatch(0, log.max_offset())
    log.queue.flush_all()
    cqs.flush_all()
    idx.flush()
    for c in (log, cqs, idx):
        c.close()
    return n


def plain_read_s(store: Path) -> float:
    t = time.perf_counter()
    for name in sorted(os.listdir(store / "commitlog")):
        fd = os.open(store / "commitlog" / name, os.O_RDONLY)
        try:
            while os.read(fd, 8 * MIB):
                pass
        finally:
            os.close(fd)
    return time.perf_counter() - t


def scan_s(store: Path) -> tuple[float, int]:
    """(seconds, bytes) of one scanner walk over the whole log, CRC on."""
    log = CommitLog.open(store / "commitlog", SEGMENT)
    try:
        t = time.perf_counter()
        sc = log.scan_chunks(check_crc=True)
        for _chunk in sc:
            pass
        return time.perf_counter() - t, sc.end_offset
    finally:
        log.close()


def profile_recovery(store: Path, out: Path) -> None:
    """cProfile of one abnormal and one normal recovery, each by cumulative then
    internal time."""
    text = io.StringIO()
    for abort in (True, False):
        prof = cProfile.Profile()
        prof.enable()
        rep = recover(store, abort=abort)
        prof.disable()
        text.write(f"{rep.mode} recovery of {store.name}: {rep.summary()}\n\n")
        for key in ("cumulative", "tottime"):
            pstats.Stats(prof, stream=text).sort_stats(key).print_stats(25)
    repo = str(Path(__file__).resolve().parents[1]) + os.sep
    stdlib = os.path.dirname(os.__file__) + os.sep  # no machine paths in the results
    out.write_text(text.getvalue().replace(repo, "").replace(stdlib, "<stdlib>/"))


def recover(store: Path, *, abort: bool) -> Any:
    if abort:
        (store / "abort").write_bytes(b"")
        # an all-zero checkpoint: validation starts from the first segment every time
        (store / "checkpoint").unlink(missing_ok=True)
    rep = recover_store(store, StoreSettings(), geometry=GEO)
    if abort:
        (store / "abort").unlink()
    return rep


def run(sizes: list[int], work: Path, repeats: int, profile: Path | None = None) -> Report:
    rows: list[dict[str, Any]] = []
    for size in sizes:
        store = work / f"store-{size // MIB}"
        msgs = build(store, size)
        log_bytes = sum(
            (store / "commitlog" / n).stat().st_size for n in os.listdir(store / "commitlog")
        )
        reads, vals, normals, scans = [], [], [], []
        for _ in range(repeats):
            reads.append(plain_read_s(store))
            scans.append(scan_s(store))
            rep = recover(store, abort=True)
            assert rep.records_redispatched == 0, rep.summary()
            vals.append((rep.seconds, rep.bytes_validated))
            normals.append(recover(store, abort=False).seconds)
        if profile is not None and size == sizes[-1]:
            profile_recovery(store, profile)
        shutil.rmtree(store / "consumequeue")
        shutil.rmtree(store / "index")
        rd = recover(store, abort=True)
        assert rd.records_redispatched == rd.redispatch_records == msgs, rd.summary()
        shutil.rmtree(store / "index")  # the case: the queues are there, the index not
        ri = recover(store, abort=True)
        assert (ri.records_redispatched, ri.redispatch_records) == (0, msgs), ri.summary()
        assert len({v[1] for v in vals}) == 1, vals  # the same bytes every time
        validated = vals[0][1]
        read_s = statistics.median(reads)
        val_s = statistics.median(v[0] for v in vals)
        rows.append(
            {
                "store_mib": size // MIB,
                "messages": msgs,
                "log_files_mib": round(log_bytes / MIB),
                "read_mb_s": round(log_bytes / read_s / 1e6),
                "scan_mb_s": round(scans[0][1] / statistics.median(t for t, _b in scans) / 1e6),
                "validate_mb_s": round(validated / val_s / 1e6),
                "validate_vs_read": round((validated / val_s) / (log_bytes / read_s), 3),
                "redispatch_mb_s": round(rd.bytes_validated / rd.redispatch_seconds / 1e6),
                "redispatch_msgs_s": round(msgs / rd.redispatch_seconds),
                "index_lost_msgs_s": round(msgs / ri.redispatch_seconds),
                "lost_recovery_s": round(rd.seconds, 3),
                "lost_recovery_msgs_s": round(msgs / rd.seconds),
                "normal_ms": round(statistics.median(normals) * 1000, 1),
            }
        )
        print(rows[-1], file=sys.stderr, flush=True)
        shutil.rmtree(store)
    big = rows[-1]
    normal = [r["normal_ms"] for r in rows]
    return Report(
        name="recovery",
        title="Recovery: validation rate, re-dispatch rate, normal recovery time",
        method=[
            "Stores of 1 KiB bodies (4 queues, KEYS + UNIQ_KEY each, 64 MiB segments) "
            "written with engine.commitlog and dispatched with engine.dispatch.",
            "validate: engine.recovery.recover_store with `abort` present and an all-zero "
            "checkpoint (every record from the first segment, CRC on), queues complete.",
            "scanner: CommitLog.scan_chunks (engine.scan, C, CRC on) over the whole log.",
            "read: sequential 8 MiB os.read of the same files, warm, in the same run; "
            f"medians of {repeats} runs.",
            "redispatch: abnormal recovery after deleting consumequeue/ and index/ (every "
            "record validated, then re-dispatched into new queues and index); re-dispatch "
            "rates are of the re-dispatch step (the report's redispatch_seconds), 'whole "
            "recovery' of the recovery from start to end (load, validate with CRC, "
            "re-dispatch, cut, flush). 'index lost': the same after deleting index/ only "
            "(the queues hold every record: the re-dispatch writes index keys only).",
            "normal: recovery without `abort` (last 3 segments, queues complete).",
        ],
        columns=[
            Column("store_mib", "store MiB"),
            Column("messages", "messages"),
            Column("read_mb_s", "plain read MB/s"),
            Column("scan_mb_s", "scanner MB/s"),
            Column("validate_mb_s", "validate MB/s"),
            Column("validate_vs_read", "validate / read", "{:.3f}"),
            Column("redispatch_mb_s", "re-dispatch MB/s"),
            Column("redispatch_msgs_s", "re-dispatch msg/s"),
            Column("index_lost_msgs_s", "re-dispatch msg/s, index lost"),
            Column("lost_recovery_s", "whole recovery s (queues, index lost)", "{:.3f}"),
            Column("lost_recovery_msgs_s", "whole recovery msg/s"),
            Column("normal_ms", "normal recovery ms", "{:,.1f}"),
        ],
        rows=rows,
        goals=[
            Goal(
                "abnormal recovery validates the log",
                big["validate_mb_s"],
                1000,
                "MB/s",
                basis=f"{big['store_mib']} MiB store",
            ),
            Goal(
                "abnormal recovery re-dispatches a store whose queues and index are lost",
                big["redispatch_msgs_s"],
                500_000,
                "records/s",
                basis=f"{big['store_mib']} MiB store, {big['messages']:,} records",
            ),
            Goal(
                "the whole abnormal recovery of that store (validation included)",
                big["lost_recovery_msgs_s"],
                500_000,
                "records/s",
                basis=f"{big['store_mib']} MiB store: {big['lost_recovery_s']} s",
            ),
            Goal(
                "normal recovery does not grow with the store (largest / smallest time)",
                normal[-1] / normal[0] if normal[0] else None,
                1.5,
                "x",
                higher_is_better=False,
                basis=" / ".join(f"{r['store_mib']} MiB: {r['normal_ms']} ms" for r in rows),
            ),
        ],
        plot_key="validate_mb_s",
        plot_label="validation MB/s",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="32/64/128 MiB stores, 1 repeat")
    p.add_argument("--dir", type=Path, default=None, help="parent of the temporary stores")
    p.add_argument("--no-write", action="store_true", help="print only; keep results as is")
    p.add_argument(
        "--profile", action="store_true", help="also write recovery_profile.txt (cProfile)"
    )
    p.add_argument(
        "--sizes", default=None, help="store sizes in MiB, comma-separated (e.g. 256,1024,2048)"
    )
    args = p.parse_args(argv)
    sizes = [32 * MIB, 64 * MIB, 128 * MIB] if args.quick else [256 * MIB, 512 * MIB, 1024 * MIB]
    if args.sizes:
        sizes = [int(x) * MIB for x in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="mqstore-bench-recovery-", dir=args.dir))
    try:
        prof = RESULTS / "recovery_profile.txt" if args.profile and not args.no_write else None
        rep = run(sizes, work, 1 if args.quick else 3, prof)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for g in rep.goals:
        print(f"{g.name}: {g.measured} {g.unit} (goal {g.required}; met: {g.met})")
    if not args.no_write:
        cmd = "python -m bench.bench_recovery" + (" --quick" if args.quick else "")
        cmd += f" --sizes {args.sizes}" if args.sizes else ""
        cmd += " --profile" if args.profile else ""
        paths = write(rep, command=cmd, bench_dir=work.parent)
        print(f"wrote {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
