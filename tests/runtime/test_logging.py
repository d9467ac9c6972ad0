"""`mqstore start` logs for journald and log shippers: every line of the supervisor's and
its workers' stderr is one event led by a syslog priority and a level."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from mqstore import StoreClient
from mqstore.ipc import channel
from mqstore.workers.base import log_line
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for
from tests.runtime.other_user import ROOT_ONLY, as_user, open_to_others

LINE = re.compile(r"^<([3467])>(ERROR|WARNING|INFO|DEBUG) mqstore [a-z]+: \S")


def test_log_line_form() -> None:
    assert log_line("start", "pid 1 serving x") == "<6>INFO mqstore start: pid 1 serving x"
    assert log_line("flusher", "a\nb\n", "ERROR") == "<3>ERROR mqstore flusher: a | b"


def test_every_line_has_a_priority_and_a_level(make_store: StoreFactory) -> None:
    store = make_store()
    store.wait_workers_running()
    victim = next(w for w in store.status()["workers"] if w["name"] == "committer")
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(lambda: "committer was killed by SIGKILL" in store.output(), 60, "the restart line")
    assert store.stop() == 0
    lines = [ln for ln in store.output().splitlines() if ln.strip()]
    assert any(ln.startswith("<6>INFO mqstore start: pid ") for ln in lines), lines
    assert any(
        ln.startswith("<4>WARNING mqstore start: committer was killed by SIGKILL; restart")
        for ln in lines
    )
    bad = [ln for ln in lines if not LINE.match(ln)]
    assert bad == [], bad
    prio = {"3": "ERROR", "4": "WARNING", "6": "INFO", "7": "DEBUG"}
    for ln in lines:
        m = LINE.match(ln)
        assert m is not None and prio[m.group(1)] == m.group(2)


@ROOT_ONLY
def test_a_log_reader_that_exited_does_not_kill_the_supervisor(shared_dir: Path) -> None:
    """stderr a pipe whose reader exited, then another user connects (to a store opened
    to others, so that the supervisor's own check refuses it): logging the refusal failed
    with EPIPE and the supervisor died with its workers."""
    store = Store(shared_dir / "store")
    r, w = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqstore", "start", str(store.path)],
        stdout=w, stderr=w, env=env, cwd=str(REPO),
    )  # fmt: skip
    os.close(w)
    try:
        store.proc = proc
        wait_for(store._up, 60, "the supervisor to answer")
        store.wait_workers_running()
        os.close(r)  # the log's reader exits
        r = -1
        open_to_others(store.path)

        def status() -> str:
            return json.dumps(channel.request(store.path, {"op": "status"}))

        refused = json.loads(as_user(status))
        assert refused.get("denied") is True, refused
        assert proc.poll() is None, "the supervisor died logging the refusal"
        assert store.status()["flags"] == ["running"]
        with StoreClient.attach(store.path) as client:
            assert client.put("t", b"after", queue_id=0).ok
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if r >= 0:
            os.close(r)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        store.proc = None
    assert store.shm_leftovers() == []
