"""`mqstore check` passes after every documented operation (README, docs/runtime.md).

A user following the README step by step must never be told their store is broken:
before, put to topic B, stop, `mqstore topic DIR delete B`, start, put to B, stop made
`mqstore check DIR` fail with "('B', 0): queue offset 0 follows 4999" (the check
followed B's queue offsets across the deletion; the records below the deletion's end
are in no queue, and B starts again from 0). Each step here is run as the docs give it,
through the real command, and then the real `mqstore check` on the stopped store."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from mqstore.ipc.client import StoreClient
from mqstore.ipc.reads import for_client
from tests.consume.test_group_topic import _kill_supervisor
from tests.runtime.harness import REPO, Store, wait_for


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=300,
    )  # fmt: skip


def _put(st: Store, topic: str, n: int) -> None:
    """`n` messages to `topic`'s queue 0, with keys, dispatched before it returns."""
    with StoreClient.attach(st.path) as c, for_client(c) as reads:
        start = reads.max_offset(topic, 0)
        for i in range(n):
            assert c.put(topic, b"m%d" % i, keys=[f"{topic}-{i}"], queue_id=0).ok
        wait_for(lambda: reads.max_offset(topic, 0) == start + n, 60, f"{topic} dispatched")


def _checked(st: Store, after: str) -> None:
    """The store stopped (if it ran), then `mqstore check` on it passes, warnings too."""
    if st.proc is not None:
        assert st.stop() == 0, st.output()[-2000:]
    got = _cli("check", str(st.path), "--strict")
    assert got.returncode == 0, f"after {after}:\n{got.stdout}{got.stderr}"


def _ok(step: str, *args: str) -> Callable[[], None]:
    def run() -> None:
        got = _cli(*args)
        assert got.returncode == 0, f"{step}: {got.stdout}{got.stderr}"

    return run


@pytest.mark.slow  # five starts and stops of a real store
def test_check_passes_after_every_documented_operation(store: Store) -> None:
    d = str(store.path)
    _put(store, "A", 30)
    _put(store, "B", 50)
    _checked(store, "put, stop")

    _ok("topic set", "topic", d, "set", "A", "--queues", "8")()
    _checked(store, "topic set")

    _ok("topic delete", "topic", d, "delete", "B")()
    _checked(store, "topic delete")

    store.start()  # the name is used again: a new topic B, from queue offset 0
    _put(store, "B", 7)
    _checked(store, "topic delete, start, put to the same name, stop")

    store.start()
    with StoreClient.attach(store.path) as c:
        c.commit_offset("g", "A", 0, 10)
    _ok("group reset", "group", d, "reset", "--group", "g", "--topic", "A", "--to", "earliest")()
    _ok("group delete", "group", d, "delete", "--group", "g")()
    _checked(store, "group reset and delete")

    _ok("clean", "clean", d, "--now")()
    _checked(store, "clean --now")

    store.start()
    _put(store, "B", 3)
    _kill_supervisor(store)  # an unclean stop: `abort` stays
    _ok("recover", "recover", d)()
    _checked(store, "a crash, then recover")

    store.start()
    _put(store, "A", 2)
    _checked(store, "start after recover, put")
