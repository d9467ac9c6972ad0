"""`mqstore start` logs for journald and log shippers: every line of the supervisor's and
its workers' stderr is one event led by a syslog priority and a level."""

from __future__ import annotations

import os
import re
import signal

from mqstore.workers.base import log_line
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for

LINE = re.compile(r"^<([3467])>(ERROR|WARNING|INFO|DEBUG) mqstore [a-z]+: \S")


def test_log_line_form() -> None:
    assert log_line("start", "pid 1 serving x") == "<6>INFO mqstore start: pid 1 serving x"
    assert log_line("flusher", "a\nb\n", "ERROR") == "<3>ERROR mqstore flusher: a | b"


def test_every_line_has_a_priority_and_a_level(make_store: StoreFactory) -> None:
    store = make_store()
    store.wait_workers_running()
    victim = next(w for w in store.status()["workers"] if w["name"] == "committer")
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(lambda: "committer exited with" in store.output(), 60, "the restart line")
    assert store.stop() == 0
    lines = [ln for ln in store.output().splitlines() if ln.strip()]
    assert any(ln.startswith("<6>INFO mqstore start: pid ") for ln in lines), lines
    assert any(ln.startswith("<4>WARNING mqstore start: committer exited with") for ln in lines)
    bad = [ln for ln in lines if not LINE.match(ln)]
    assert bad == [], bad
    prio = {"3": "ERROR", "4": "WARNING", "6": "INFO", "7": "DEBUG"}
    for ln in lines:
        m = LINE.match(ln)
        assert m is not None and prio[m.group(1)] == m.group(2)
