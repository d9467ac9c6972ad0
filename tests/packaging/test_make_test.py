"""`make test` runs the load suite even when the rest failed, and still fails overall.

Before, a failure in the main suite stopped make before `tests/load`, so one run never
told whether the load suite passed. The target's recipe is run as it is, with its
Python replaced by a script that records each pytest call and fails the ones asked to
(`make -o` takes the set-up prerequisites as done: nothing is built)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREREQUISITES = (
    ".venv/.installed",
    "mqstore/.native-built",
    "mqstore/.bytecode-built",
    "pipeline/jvm/mqstore-spark.jar",
)
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in
  *--ignore=tests/load*) exit "$MAIN_EXIT" ;;
  *) exit "$LOAD_EXIT" ;;
esac
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize(
    ("main_exit", "load_exit", "make_fails"),
    [(1, 0, True), (0, 1, True), (1, 1, True), (0, 0, False)],
)
def test_make_test_runs_both_suites_and_fails_if_either_did(
    tmp_path: Path, main_exit: int, load_exit: int, make_fails: bool
) -> None:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls"
    skip_setup = [arg for p in PREREQUISITES for arg in ("-o", p)]
    made = subprocess.run(
        ["make", "--no-print-directory", *skip_setup, "test", f"PY={fake}"],
        cwd=str(REPO), capture_output=True, text=True, timeout=60,
        env={**os.environ, "CALLS": str(calls), "MAIN_EXIT": str(main_exit),
             "LOAD_EXIT": str(load_exit)},
    )  # fmt: skip
    ran = calls.read_text().splitlines()
    assert len(ran) == 2, (ran, made.stdout, made.stderr)
    assert "--ignore=tests/load" in ran[0] and ran[1].endswith("tests/load"), ran
    assert (made.returncode != 0) == make_fails, (made.returncode, made.stderr)
