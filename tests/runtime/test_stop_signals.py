"""The commands that wait stop on SIGINT and SIGTERM whatever disposition they inherited.

A job started with `&` from a script (`nohup make test > log &`) runs with SIGINT
ignored, and so does every process it starts: Python then installs no Ctrl-C handler,
and a command that only caught KeyboardInterrupt never stopped (`mqstore tail` hung the
test suite). Each command here is started with SIGINT ignored on purpose
(`harness.sigint_ignored`), so these tests mean the same however the suite was launched.
`tail` and `status --watch` are covered beside their other tests (`tests/consume/
test_cli.py`, `test_piped_output.py`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mqstore.ipc import channel
from mqstore.ipc.control import leftover_shm
from tests.runtime.harness import (
    DEFAULT_CONFIG,
    REPO,
    Store,
    sigint_ignored,
    wait_for,
    write_config,
)

STOPS = pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


class _Child:
    """A command run with SIGINT ignored, in a session of its own (so that what it
    starts can be killed with it), its output collected as it comes."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            sigint_ignored(argv),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
            env=_env(), start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [
            threading.Thread(target=self.lines.extend, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self.errors.extend, args=(self.proc.stderr,), daemon=True),
        ]
        for r in self._readers:
            r.start()

    def stop(self, sig: int, timeout_s: float = 90) -> tuple[int, str, str]:
        """Send `sig` (to the command only); (exit code, stdout, stderr) once it exits. A
        command that does not exit within `timeout_s` is killed and the test fails."""
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            raise AssertionError(f"{sig!r} did not stop it in {timeout_s} s") from None
        for r in self._readers:
            r.join(30)
        return code, "".join(self.lines), "".join(self.errors)

    def _kill(self) -> None:
        """SIGKILL to its whole session: the command and what it started."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for r in self._readers:
            r.join(30)

    def __enter__(self) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        """Killed if still running (the bug itself: never leave it behind); pipes closed."""
        if self.proc.poll() is None:
            self._kill()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@STOPS
def test_start_stops_on_a_signal_it_inherited_ignored(tmp_path: Path, stop: int) -> None:
    path = tmp_path / "store"
    path.mkdir()
    write_config(path, DEFAULT_CONFIG)
    with _Child([sys.executable, "-m", "mqstore", "start", str(path)]) as sup:
        wait_for(lambda: _answers(path), 60, "the supervisor to answer")
        code, _out, err = sup.stop(stop)
    assert code == 0, err
    assert leftover_shm(path) == []


def _answers(path: Path) -> bool:
    try:
        channel.request(path, {"op": "status"})
    except channel.SupervisorUnavailable:
        return False
    return True


@STOPS
def test_demo_stops_on_a_signal_it_inherited_ignored(store: Store, stop: int) -> None:
    """A demo meant to run for 10 minutes stops on the signal, with its summary."""
    with _Child(
        [sys.executable, "-m", "mqstore", "demo", str(store.path), "--producers", "1",
         "--sync-producers", "0", "--seconds", "600", "--json"]
    ) as demo:  # fmt: skip
        wait_for(lambda: store.status()["puts"]["total"] > 0, 60, "the demo's first puts")
        code, out, err = demo.stop(stop)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["good"] and doc["puts"] > 0 and doc["seconds"] < 600


@pytest.mark.slow
def test_make_run_stops_on_sigint_it_inherited_ignored(tmp_path: Path) -> None:
    """`make run` keeps its store running until Ctrl-C; started with SIGINT ignored, a
    SIGINT still stops the store cleanly and the check runs."""
    path = tmp_path / "demo"
    with _Child(
        [sys.executable, "-m", "mqstore.workers.demo_run", str(path), "--load-seconds", "1",
         "--producers", "1", "--sync-producers", "0"]
    ) as run:  # fmt: skip
        wait_for(lambda: any(ln.startswith("status: ") for ln in run.lines), 120, "the status")
        code, out, err = run.stop(signal.SIGINT, timeout_s=120)
    assert code == 0, out + err
    assert "supervisor exited with 0; shared memory left: none" in out
    assert f"$ mqstore check {path}" in out and "ok: " in out
