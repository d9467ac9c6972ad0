"""Fencing under load (issue 24): producers that sleep through restarts while others put.

Three producer processes put (sync and no-wait, some batches) across the whole run and
print every acknowledged message. Each cycle, one more producer SIGSTOPs itself halfway
through a record (the crash point `copy-half`), the store is stopped and started
(`mqstore stop`) or its supervisor SIGKILLed and started, then the sleeper resumes: its put
must not be PUT_OK. At the end, after a SIGKILL and an abnormal recovery (every record's
CRC checked), every acknowledged message reads back, and no sleeper's record does.
Cycles: 2 per run, 12 with MQSTORE_RELIABILITY_FULL=1; pool on and off.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import FIGURES, sized
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for
from tests.runtime.test_fencing import _kill_supervisor, _readable, _state

PRODUCERS = 3


def _spawn(store: Store, args: list[str], out: Path, point: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if point:
        env["MQSTORE_CRASHPOINT"] = point
    with open(out, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.runtime.helpers_child", *args],
            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
        )  # fmt: skip


def _acked(outs: list[Path]) -> list[bytes]:
    got = []
    for out in outs:
        for line in out.read_bytes().splitlines():
            if line.startswith(b"ok "):
                got.append(line[3:])
    return got


@pytest.mark.parametrize("pool", [True, False], ids=["pool", "no-pool"])
def test_no_acknowledgement_is_lost_when_producers_sleep_through_restarts(
    make_store: StoreFactory, tmp_path: Path, seed: int, pool: bool
) -> None:
    rng = random.Random(seed)
    cycles = sized(2, 12)
    store = make_store({"transient_store_pool_enable": pool, "segment_size_bytes": 1 << 18})
    outs = [tmp_path / f"producer{i}.out" for i in range(PRODUCERS)]
    stop = tmp_path / "stop"  # the producers put until the cycles are over
    producers = [
        _spawn(store, ["produce-n", str(store.path), str(10**9), f"p{i}", str(stop)], out)
        for i, out in enumerate(outs)
    ]
    sleepers: list[subprocess.Popen[bytes]] = []
    try:
        for cycle in range(cycles):
            seen = len(_acked(outs))
            try:
                wait_for(lambda n=seen: len(_acked(outs)) >= n + 50, 120, "progress")
            except AssertionError:
                tails = [o.read_bytes()[-300:] for o in outs]
                raise AssertionError(f"seed {seed}: no progress; producers: {tails}") from None
            out = tmp_path / f"sleeper{cycle}.out"
            sleeper = _spawn(store, ["put-twice", str(store.path)], out, "copy-half:stop:2")
            sleepers.append(sleeper)
            wait_for(lambda s=sleeper: _state(s.pid) == "T", 60, "the sleeper to stop itself")
            if rng.random() < 0.5:
                assert store.stop() == 0, f"seed {seed}: the stop was not clean"
                FIGURES["fencing: stop and start"] += 1
            else:
                _kill_supervisor(store)
                FIGURES["fencing: supervisor SIGKILL and start"] += 1
            store.start()
            os.kill(sleeper.pid, signal.SIGCONT)
            assert sleeper.wait(120) == 0
            statuses = out.read_text().split()
            assert statuses[1] != "PUT_OK", f"seed {seed}: a fenced put answered {statuses}"
        seen = len(_acked(outs))
        wait_for(lambda: len(_acked(outs)) >= seen + 50, 120, f"seed {seed}: progress")
        stop.touch()
        for p in producers:
            assert p.wait(600) == 0, f"seed {seed}: a producer failed"
    finally:
        for p in producers + sleepers:
            if p.poll() is None:
                p.kill()
            p.wait()
    acked = _acked(outs)
    assert store.stop() == 0
    bodies = set(_readable(store))
    missing = [b for b in acked if b not in bodies]
    FIGURES["fencing: acknowledged messages"] += len(acked)
    FIGURES["fencing: acknowledged messages lost"] += len(missing)
    assert missing == [], f"seed {seed}: {len(missing)} of {len(acked)} lost: {missing[:5]}"
    assert b"crash" not in bodies
