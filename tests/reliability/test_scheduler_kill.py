"""Delayed messages across a supervisor SIGKILL (issue 25's goal): 10,000 messages with
random delay levels 1-5 (of 5-30 s here: the restart is part of the run) arrive in their
topic each exactly once and never before due; those due while the scheduler runs arrive
at most 200 ms after due (the ones due while the store was down, or in the first second
of its new run, arrive when it is back). The supervisor is SIGKILLed mid-run, its workers
gone after it, and started again: it recovers, the scheduler checks its progress against
the log and goes on. Sizes: 2,000 messages by default, 10,000 under
MQSTORE_RELIABILITY_FULL=1."""

from __future__ import annotations

import random
import time

import pytest

from mqstore import StoreClient
from mqstore.conf.settings import parse_delay_levels
from mqstore.ipc.commit import pid_alive
from tests.reliability.conftest import FIGURES, sized
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for
from tests.runtime.scheduling import (
    CONFIG,
    LATE_MS,
    LONG_LEVELS,
    Sent,
    collect,
    judge,
    percentile,
    put_delayed,
    scheduler_ready,
    scheduler_waits,
)

CATCH_UP_MS = 1000  # after the restart: the backlog of what fell due meanwhile


@pytest.mark.slow
def test_delayed_messages_survive_a_supervisor_sigkill(make_store: StoreFactory, seed: int) -> None:
    n = sized(2000, 10_000)
    rng = random.Random(seed)
    st = make_store({**CONFIG, "message_delay_level": LONG_LEVELS})
    scheduler_ready(st)
    sent = Sent()
    t0 = time.time()
    with scheduler_waits(st) as before_kill:  # the goal is a scheduler's that gets a CPU
        with StoreClient.attach(st.path) as client:
            put_delayed(client, n, rng, sent, parse_delay_levels(LONG_LEVELS))
        put_s = time.time() - t0
        time.sleep(rng.uniform(5.0, 7.0))  # some delivered, most not due yet
    assert st.proc is not None
    workers = [w["pid"] for w in st.status()["workers"]]
    killed_ms = time.time_ns() // 1_000_000
    st.proc.kill()
    st.proc.wait(60)
    st.proc = None
    st._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 60, f"workers gone (seed {seed})")
    st.start()
    scheduler_ready(st)
    back_ms = time.time_ns() // 1_000_000
    with scheduler_waits(st) as after_restart:
        got = collect(st, sent, 120)
    waits = (before_kill, after_restart)
    j = judge(sent, got, excused=(killed_ms - LATE_MS, back_ms + CATCH_UP_MS), waits=waits)
    why = f"(seed {seed})"
    assert not j.missing, f"{len(j.missing)} never arrived {why}: {j.missing[:5]}"
    assert not j.twice, f"{len(j.twice)} arrived twice {why}: {j.twice[:5]}"
    assert not j.early, f"{len(j.early)} arrived before due {why}: {j.early[:5]}"
    assert not j.late, (
        f"{len(j.late)} more than {LATE_MS} ms late, past the scheduler's waits for a CPU "
        f"{why}: {j.late[:5]}"
    )
    FIGURES["delayed messages checked across a supervisor SIGKILL"] += n
    FIGURES["delayed: p99 ms after due (scheduler running)"] = percentile(j.lateness_ms, 0.99)
    FIGURES["delayed: max ms after due (scheduler running)"] = max(j.lateness_ms, default=0)
    FIGURES["delayed: max ms after due (down or catching up)"] = j.excused_late_max_ms
    print(
        f"{n} delayed messages put in {put_s:.1f} s; down {back_ms - killed_ms} ms; "
        f"after due (running): p50 {percentile(j.lateness_ms, 0.5)} ms, p99 "
        f"{percentile(j.lateness_ms, 0.99)} ms, max {max(j.lateness_ms, default=0)} ms over "
        f"{len(j.lateness_ms)}; due while down or catching up: max {j.excused_late_max_ms} ms"
    )
