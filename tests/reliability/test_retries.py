"""Retries without duplicates (issue 26): SYNC_FLUSH producers whose flusher is SIGSTOPped
past the flush timeout (their puts answer FLUSH_DISK_TIMEOUT with the record in the
log), and a supervisor SIGKILLed and restarted between a put and its retry (the
idempotence table then comes from the log). Every message is retried with the client's
helper until PUT_OK; afterwards the log holds each message exactly once, at the offset
its PUT_OK named: 0 lost, 0 duplicates. `run_retry_faults` is shared with the short
version in tests/runtime/test_retries_short.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mqstore.engine.reader import StoreReader
from tests.reliability.conftest import FIGURES, sized
from tests.reliability.workload import message, parse_body
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for

FLUSH_TIMEOUT_MS = 300
PRODUCERS = 4


def _flusher(st: Store) -> int:
    def pid() -> int:
        rows = {w["name"]: w for w in st.status()["workers"]}
        f = rows.get("flusher")
        return int(f["pid"]) if f and f["state"] == "running" and f["pid"] > 0 else 0

    got: int = wait_for(pid, 60, "a running flusher")
    return got


def _restart_after_kill(st: Store, flusher: int) -> None:
    """SIGKILL the supervisor (its flusher stopped), let the orphaned workers go, start."""
    assert st.proc is not None
    st.proc.send_signal(signal.SIGKILL)
    st.proc.wait(60)
    st.proc = None
    st._log.close()  # the harness's own log handle
    os.kill(flusher, signal.SIGCONT)
    st.start()


def run_retry_faults(
    make_store: StoreFactory, tmp_path: Path, seed: int, total: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    st = make_store({"sync_flush_timeout_ms": FLUSH_TIMEOUT_MS})
    per = total // PRODUCERS
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    outs = [tmp_path / f"p{k}.out" for k in range(PRODUCERS)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.retry_producer",
                str(st.path),
                f"p{k}",
                str(per),
                str(outs[k]),
            ],
            env=env,
            cwd=str(REPO),
        )
        for k in range(PRODUCERS)
    ]
    stops = kills = 0
    try:
        # Faults start once every producer has attached and stored its first message.
        wait_for(
            lambda: all(o.exists() and o.stat().st_size > 0 for o in outs),
            120,
            "every producer's first put",
        )
        while any(p.poll() is None for p in procs):
            if stops:  # the first two cycles at once: a stop, then a stop and a kill
                time.sleep(rng.uniform(0.2, 0.6))  # puts go on between two faults
            flusher = _flusher(st)
            os.kill(flusher, signal.SIGSTOP)
            stops += 1
            time.sleep(FLUSH_TIMEOUT_MS / 1000 + rng.uniform(0.1, 0.3))  # past the timeout
            if stops == 2 or (stops > 2 and rng.random() < 0.5):
                _restart_after_kill(st, flusher)
                kills += 1
            else:
                os.kill(flusher, signal.SIGCONT)
        codes = [p.wait(600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0] * PRODUCERS, f"seed {seed}: producers exited {codes}"
    assert st.stop() == 0, f"seed {seed}: {st.output()[-2000:]}"
    acked: dict[tuple[str, int], int] = {}
    keyof: dict[tuple[str, int], str] = {}
    first: Counter[str] = Counter()
    firsts_why: Counter[str] = Counter()
    dup_answers = 0
    for k, out in enumerate(outs):
        lines = out.read_text().splitlines()
        assert lines and lines[-1] == "DONE", f"seed {seed}: p{k} did not finish"
        for line in lines[:-1]:
            i, off, key, status, reason, why = line.split()
            keyof[(f"p{k}", int(i))] = key
            if status != "PUT_OK":
                firsts_why[f"{status} {why[:60]}"] += 1
            acked[(f"p{k}", int(i))] = int(off)
            first[status] += 1
            dup_answers += reason == "duplicate"
    stored: Counter[tuple[str, int]] = Counter()
    where: dict[tuple[str, int], int] = {}
    for r in st.read_log():
        who = parse_body(bytes(r.body))
        if who is not None:
            stored[who] += 1
            where[who] = r.physical_offset
    lost = [m for m in acked if stored[m] == 0]
    dups = [m for m, n in stored.items() if n > 1]
    moved = [m for m, off in acked.items() if stored[m] == 1 and where[m] != off]
    figures = {
        "messages": len(acked), "lost": len(lost), "duplicates": len(dups),
        "acknowledged at another offset": len(moved), "flusher stops": stops,
        "supervisor kills": kills, "first tries not PUT_OK": sum(first.values()) - first["PUT_OK"],
        "first tries FLUSH_DISK_TIMEOUT": first["FLUSH_DISK_TIMEOUT"],
        "first tries SERVICE_NOT_AVAILABLE": first["SERVICE_NOT_AVAILABLE"],
        "retries answered as duplicates": dup_answers,
    }  # fmt: skip
    print(f"retried puts (seed {seed}):", figures, dict(firsts_why))
    assert len(acked) == per * PRODUCERS
    assert not lost, f"seed {seed}: lost {lost[:10]}"
    assert not dups, f"seed {seed}: stored twice {dups[:10]}"
    assert not moved, f"seed {seed}: acknowledged elsewhere {moved[:10]}"
    # Found through the index by the UNIQ_KEY its PUT_OK named (a sample), once.
    with StoreReader.open(st.path) as rd:
        for m in rng.sample(sorted(acked), min(200, len(acked))):
            key = keyof[m]
            hits = rd.query_by_key(str(message(*m)["topic"]), key, 8)
            found = [h.physical_offset for h in hits if h.properties.get("UNIQ_KEY") == key]
            assert found == [acked[m]], f"seed {seed}: {m} {key}: {found}"
    return figures


def test_retried_puts_are_stored_exactly_once(
    make_store: StoreFactory, tmp_path: Path, seed: int
) -> None:
    figures = run_retry_faults(make_store, tmp_path, seed, sized(10_000, 40_000))
    assert figures["first tries FLUSH_DISK_TIMEOUT"] > 0, figures  # the faults did bite
    assert figures["retries answered as duplicates"] > 0, figures
    for name, value in figures.items():
        FIGURES[f"retried puts: {name}"] += value
