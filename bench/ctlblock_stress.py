"""Stress for "the control block was overwritten" (a finding of stop 32): restart one
store again and again with concurrent producers while a watcher process reads the
control block's positions as the supervisor's `ControlBlock.damage` does, as fast as
it can, and every supervisor log is searched for the message.

    python -m bench.ctlblock_stress [--minutes 20] [--segment-mib 1024] [--producers 4]
        [--seconds 6] [--root DIR]

Each cycle starts the same store directory (so every boot after the first recovers a
log end and seeds the positions with it) with one configuration of the rotation
below, runs `--producers` processes (half `StoreClient.put`, half gathered
`AsyncStoreClient.put`) for `--seconds`, then stops it: SIGTERM (a clean stop), or
every third cycle SIGKILL of the whole tree (the next boot is an abnormal recovery and
quiesces the old generation). The rotation: pool on / off x ASYNC_FLUSH / SYNC_FLUSH,
pool on twice as often; each rotation starts with a new store (disk use stays a few
GB). The store directory is removed when the run ends.

Prints one line per cycle and, at the end, what was seen: damage() answers from the
watcher, "overwritten" in a supervisor log, puts by status. Exit 1 if any was seen.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.store_run import REPO, _kill_tree, _mqstore, client_api, shm_names, write_config

ROTATION = (  # (pool, sync)
    (True, False), (True, True), (False, False), (True, False), (True, True), (False, True),
)  # fmt: skip

PRODUCER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from mqstore import AsyncStoreClient, StoreClient
    store, seconds, use_async, me = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    body = b"x" * 1000
    counts = {}
    end = time.monotonic() + seconds
    if use_async:
        async def main():
            async with AsyncStoreClient.attach(store) as c:
                while time.monotonic() < end:
                    puts = [c.put("stress", body, keys=[me]) for _ in range(64)]
                    rs = await asyncio.gather(*puts)
                    for r in rs:
                        counts[r.status.name] = counts.get(r.status.name, 0) + 1
        asyncio.run(main())
    else:
        with StoreClient.attach(store) as c:
            while time.monotonic() < end:
                r = c.put("stress", body, tags="t", keys=[me])
                counts[r.status.name] = counts.get(r.status.name, 0) + 1
    print(json.dumps(counts))
    """
)

WATCHER = textwrap.dedent(
    """
    import json, sys, time
    from mqstore.ipc import access, control as c
    store, stop_file = sys.argv[1], sys.argv[2]
    names = access.read_names(store)
    cb = c.ControlBlock.attach(names["ctl"], names["pool"])
    seen, reads = [], 0
    import os
    while not os.path.exists(stop_file):
        for _ in range(1000):
            why = cb.damage()
            reads += 1
            if why and len(seen) < 20:
                seen.append(why)
    cb.close()
    print(json.dumps({"reads": reads, "damage": seen}))
    """
)


def _start(store: Path, cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen(
            _mqstore("start", str(store), "--config", str(cfg), "--create"),
            stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
        )  # fmt: skip


def _wait_up(store: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    StoreClient, _ = client_api()
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mqstore start exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with StoreClient.attach(str(store)):
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _cycle(i: int, root: Path, store: Path, args: argparse.Namespace) -> dict[str, object]:
    pool, sync = ROTATION[i % len(ROTATION)]
    cfg = root / "stress.toml"
    extra = {"segment_size_bytes": args.segment_mib << 20}
    write_config(cfg, sync=sync, pool=pool, extra=extra)
    log = root / f"supervisor-{i}.log"
    proc = _start(store, cfg, log)
    _wait_up(store, proc, log)
    stop_file = root / f"stop-{i}"
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(store), str(stop_file)],
        stdout=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    producers = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, str(store), str(args.seconds), str(k % 2), f"p{k}"],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        for k in range(args.producers)
    ]
    counts: dict[str, int] = {}
    for p in producers:
        out, _ = p.communicate(timeout=args.seconds + 300)
        for k, v in json.loads(out or b"{}").items():
            counts[k] = counts.get(k, 0) + v
    killed = i % 3 == 2
    if killed:  # a crash: the next boot recovers abnormally and quiesces this generation
        _kill_tree(proc.pid)
        proc.wait(timeout=60)
    stop_file.touch()
    wout, _ = watcher.communicate(timeout=60)
    if not killed:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    text = log.read_text(errors="replace")
    return {
        "cycle": i, "pool": pool, "sync": sync, "killed": killed, "exit": proc.returncode,
        "puts": counts, "watcher": json.loads(wout or b"{}"),
        "overwritten": [ln for ln in text.splitlines() if "overwritten" in ln],
        "read_only": [ln for ln in text.splitlines() if "read-only" in ln],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--segment-mib", type=int, default=1024)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--root", type=Path, default=None)
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ctlblock-stress-", dir=args.root))
    store = root / "store"
    bad = 0
    end = time.monotonic() + args.minutes * 60
    i = 0
    try:
        while time.monotonic() < end:
            if i and i % len(ROTATION) == 0:  # a fresh store each rotation: disk stays low
                for n in shm_names(store):  # a killed cycle's generation, if any
                    os.unlink(os.path.join("/dev/shm", n))
                shutil.rmtree(store)
            r = _cycle(i, root, store, args)
            w = r["watcher"]
            assert isinstance(w, dict)
            seen = bool(w.get("damage") or r["overwritten"] or r["read_only"])
            bad += seen
            print(json.dumps(r) if seen else (
                f"cycle {i} pool={r['pool']} sync={r['sync']} killed={r['killed']} "
                f"exit={r['exit']} puts={r['puts']} damage() reads={w.get('reads')}: none"
            ), flush=True)  # fmt: skip
            i += 1
    finally:
        for n in shm_names(store):  # a killed last cycle's generation
            os.unlink(os.path.join("/dev/shm", n))
        shutil.rmtree(root, ignore_errors=True)
    print(f"{i} cycles, {bad} with damage, 'overwritten' or read-only", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
