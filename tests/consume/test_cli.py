"""`mqstore query`, `tail`, `offsets` and `topic` against a running store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from mqstore.engine import topics
from mqstore.ipc.client import StoreClient
from mqstore.ipc.reads import for_client
from tests.runtime.harness import REPO, Store, sigint_ignored, wait_for


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=timeout,
    )  # fmt: skip


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _put(st: Store, n: int, start: int = 0) -> None:
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        for i in range(start, start + n):
            assert c.put("cli", b"b%d" % i, keys=[f"k{i}"], queue_id=i % 2).ok
        want = (start + n + 1) // 2, (start + n) // 2
        wait_for(
            lambda: (reads.max_offset("cli", 0), reads.max_offset("cli", 1)) == want, 30, "dispatch"
        )


def test_query_tail_offsets(store: Store) -> None:
    d = str(store.path)
    _put(store, 10)
    q = _cli("query", d, "--topic", "cli", "--key", "k4")
    assert q.returncode == 0, q.stderr
    assert [(r["keys"], r["queue_id"]) for r in _lines(q.stdout)] == [("k4", 0)]
    assert _cli("query", d, "--topic", "cli", "--key", "nope").returncode == 1

    t = _cli("tail", d, "--topic", "cli", "--group", "g", "--from-beginning", "--limit", "6")
    assert t.returncode == 0, t.stderr
    first = _lines(t.stdout)
    assert len(first) == 6
    _put(store, 4, start=10)
    t = _cli("tail", d, "--topic", "cli", "--group", "g", "--limit", "8")
    assert t.returncode == 0, t.stderr
    second = _lines(t.stdout)
    got = sorted((r["queue_id"], r["queue_offset"]) for r in first + second)
    assert got == sorted({(i % 2, i // 2) for i in range(14)})  # each once, none missed

    # the tail was a member of g: the supervisor writes what it acked to the offsets file
    # within a second of its leaving (a later member of g starts there at once)
    def persisted() -> list[dict[str, Any]]:
        o = _cli("offsets", d, "--json")
        assert o.returncode == 0, o.stderr
        return _lines(o.stdout)

    wait_for(
        lambda: {r["committed"] for r in persisted() if r["queue_id"] < 2} == {7},
        30,  # each look runs the command (a second or more of a loaded machine's time)
        "the group's offsets in consumerOffset.json",
    )
    rows = {(r["group"], r["topic"], r["queue_id"]): r for r in persisted()}
    assert rows[("g", "cli", 0)]["committed"] == 7 and rows[("g", "cli", 0)]["lag"] == 0
    assert rows[("g", "cli", 1)]["max_offset"] == 7
    table = _cli("offsets", d)
    assert table.returncode == 0 and "lag" in table.stdout and "cli" in table.stdout


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_tail_follows_new_messages_and_exits_0_on_ctrl_c(
    store: Store, stop: signal.Signals
) -> None:
    """Started with SIGINT ignored (a job started with `&` from a script, `nohup make
    test &`), SIGINT still stops it, as SIGTERM does, after the last commit."""
    d = str(store.path)
    _put(store, 2)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        sigint_ignored([sys.executable, "-m", "mqstore", "tail", d, "--topic", "cli",
                        "--group", "follow"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=env,
    )  # fmt: skip
    try:
        with StoreClient.attach(store.path) as c, for_client(c) as reads:
            # a member of `follow` (all of cli's queues: the only one), it starts at the
            # queues' end (queue 1's is 1) and commits that as the group's start
            wait_for(lambda: reads.committed_offset("follow", "cli", 1) == 1, 60, "the start")
            assert c.put("cli", b"new", queue_id=1).ok
            assert p.stdout is not None
            line = json.loads(p.stdout.readline())
            assert (line["queue_id"], line["queue_offset"]) == (1, 1)
            wait_for(lambda: reads.committed_offset("follow", "cli", 1) == 2, 60, "the commit")
    finally:
        p.send_signal(stop)
        try:
            _out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:  # the bug itself: never leave it running
                p.kill()
                p.communicate()
    assert p.returncode == 0, err


def test_topics_created_on_first_put_and_set(store: Store) -> None:
    d = str(store.path)
    _put(store, 2)
    wait_for(lambda: "cli" in topics.load_topics(d), 30, "the topic to be registered")
    assert topics.queue_count(d, "cli") == 4
    s = _cli("topic", d, "set", "cli", "--queues", "8")
    assert s.returncode == 0, s.stderr
    assert topics.queue_count(d, "cli") == 8
    lst = _cli("topic", d, "list")
    assert lst.returncode == 0
    row = next(line.split() for line in lst.stdout.splitlines() if line.startswith("cli "))
    assert row[1:4] == ["8", "8", "6"]
    assert _cli("topic", d, "set", "cli", "--queues", "0").returncode == 2
