"""Output into a pipe or a file: tables are never cut to 80 columns, and `status
--watch` prints a line only when it changed (an idle store writes nothing more)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time

from mqstore import StoreClient
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, sigint_ignored


def _ended(p: subprocess.Popen[str]) -> tuple[str, str]:
    """What `p` printed once it exits (within 60 s; killed otherwise, and then it fails)."""
    try:
        return p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_status_and_config_tables_keep_long_values_whole_in_a_pipe(
    make_store: StoreFactory,
) -> None:
    st = make_store(name="a-store-directory-whose-name-alone-is-longer-than-eighty-columns-x")
    assert len(str(st.path)) > 80
    for args, whole in (
        (["status", str(st.path)], str(st.path)),
        (["config", "show", str(st.path)], str(st.path / "mqstore.toml")),  # a source
    ):
        p = subprocess.run(
            [sys.executable, "-m", "mqstore", *args],
            capture_output=True, text=True, cwd=str(REPO), timeout=120,
            env={**os.environ, "COLUMNS": "80"},
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert whole in p.stdout, p.stdout  # not wrapped, not cut with an ellipsis
        assert "…" not in p.stdout


def test_status_watch_into_a_pipe_prints_only_changes(make_store: StoreFactory) -> None:
    st = make_store()
    p = subprocess.Popen(  # with SIGINT ignored, as a job started with `&` has it
        sigint_ignored([sys.executable, "-m", "mqstore", "status", str(st.path), "--watch"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
    )  # fmt: skip
    try:
        assert p.stdout is not None
        first = p.stdout.readline()
        assert first.startswith("reserved 0 flushed 0 |"), first
        # An idle store for a few seconds: a screen would be redrawn 3 times, a log
        # must get nothing (this is an observation window, not a wait for a condition).
        time.sleep(3.5)
        with StoreClient.attach(st.path) as c:
            assert c.put("t", b"x").ok
        second = p.stdout.readline()  # the put changes the line
    finally:
        p.send_signal(signal.SIGINT)
        rest, err = _ended(p)
    assert p.returncode == 0, err
    lines = [first, second, *rest.splitlines(keepends=True)]
    assert all(a != b for a, b in itertools.pairwise(lines)), lines
    assert not second.startswith("reserved 0 "), lines  # the first change is the put


def test_status_watch_json_into_a_pipe_is_one_document_per_change(
    make_store: StoreFactory,
) -> None:
    st = make_store()
    p = subprocess.Popen(
        [sys.executable, "-m", "mqstore", "status", str(st.path), "--watch", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
    )  # fmt: skip
    try:
        assert p.stdout is not None
        doc = json.loads(p.stdout.readline())
        assert doc["positions"]["reserved"] == 0
        with StoreClient.attach(st.path) as c:
            assert c.put("t", b"x").ok
        doc = json.loads(p.stdout.readline())  # the next document is the changed one
        assert doc["positions"]["reserved"] > 0
    finally:
        p.send_signal(signal.SIGTERM)  # a `kill` ends it as Ctrl-C does
        _out, err = _ended(p)
    assert p.returncode == 0, err
