"""The test session's shared-memory clean-up (tests/conftest.py) removes only what its own
tests' stores left: a session run beside another (another worktree's, another xdist
worker's) never unlinks that one's segments, mapped or not, and still leaves none of its
own behind after a supervisor it SIGKILLed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mqstore.ipc.control import shm_names, store_hash
from tests.conftest import REPO, SHM, ours

INNER_CONFTEST = """
from tests.conftest import (  # noqa: F401 (the hooks under test)
    pytest_runtest_teardown,
    pytest_sessionfinish,
    pytest_sessionstart,
)
"""

INNER_TEST = """
import os
import signal
from pathlib import Path

from tests.conftest import _mapped_anywhere
from tests.runtime.harness import Store, wait_for


def test_a_crashed_supervisor(tmp_path: Path) -> None:
    s = Store(tmp_path / "store", None)
    s.start()
    left = set(s.shm_leftovers())
    assert left
    assert s.proc is not None
    workers = [w["pid"] for w in s.status()["workers"] if w["pid"] > 0]
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    s._log.close()

    def gone(pid: int) -> bool:  # exited (a zombie nobody reaped has no mappings)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")

    # every worker gone, not only its mappings: an orphaned worker still draining maps
    # the segments again (or its maps read empty mid-exit) after a first look saw none
    wait_for(lambda: all(gone(p) for p in workers), 30, "the workers to exit")
    wait_for(lambda: not _mapped_anywhere(left), 30, "the segments to be mapped nowhere")
    Path(os.environ["LEFT_FILE"]).write_text("\\n".join(sorted(left)))
"""


def test_a_session_removes_its_own_stores_segments_and_no_one_elses(tmp_path: Path) -> None:
    # another session's store, crashed too: its segment is mapped nowhere
    foreign_dir = tmp_path / "another-session" / "store"
    foreign_dir.mkdir(parents=True)
    foreign = shm_names(foreign_dir, 1, os.urandom(4).hex())[0]
    (SHM / foreign).write_bytes(b"x")
    try:
        inner = tmp_path / "inner"
        inner.mkdir()
        (inner / "conftest.py").write_text(INNER_CONFTEST)
        (inner / "test_crash.py").write_text(INNER_TEST)
        left_file = tmp_path / "left.txt"
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "LEFT_FILE": str(left_file),
        }
        env.pop("PYTEST_XDIST_WORKER", None)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", str(inner), "-q", "-p", "no:cacheprovider",
             "-p", "no:xdist", f"--basetemp={tmp_path / 'inner-tmp'}", f"--rootdir={inner}"],
            env=env, cwd=str(inner), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        left = set(left_file.read_text().split())
        assert left and all(f"removed a store's shared memory left behind by a test: {n}"
                            in run.stdout for n in left), run.stdout  # fmt: skip
        assert not left & {n for n in os.listdir(SHM)}
        assert (SHM / foreign).exists(), run.stdout  # not this inner session's: kept
        assert foreign not in run.stdout
    finally:
        (SHM / foreign).unlink(missing_ok=True)


def test_ours_reads_the_stem_of_a_segments_name(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    names = {*shm_names(a, 3, "ab12"), *shm_names(b, 1), "mqs-", "mqs-x", "other"}
    assert ours(names, {store_hash(a)}) == set(shm_names(a, 3, "ab12"))
