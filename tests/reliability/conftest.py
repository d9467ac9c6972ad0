"""Reliability suites: bounded sizes by default, full sizes with MQSTORE_RELIABILITY_FULL=1.

Every suite draws its randomness from one seed (MQSTORE_RELIABILITY_SEED, else random) and
names it in each failure message. Figures (crashes survived by kind, corruptions tried,
inputs and frames fuzzed, acknowledged messages lost) are summed over the session, printed
at the end, and written as JSON to MQSTORE_RELIABILITY_REPORT when that is set.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from tests.runtime.conftest import StoreFactory, make_store, store  # noqa: F401 (fixtures)

FULL = os.environ.get("MQSTORE_RELIABILITY_FULL", "") not in ("", "0")
FIGURES: Counter[str] = Counter()


def sized(small: int, full: int) -> int:
    """`small` in normal runs (CI), `full` under MQSTORE_RELIABILITY_FULL=1."""
    return full if FULL else small


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "reliability: crash, corruption and hostile-input suites")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/reliability" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.reliability)


@pytest.fixture
def seed() -> int:
    env = os.environ.get("MQSTORE_RELIABILITY_SEED")
    return int(env) if env else random.SystemRandom().randrange(1 << 32)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Each process (xdist workers too) writes its own figures next to the report."""
    out = os.environ.get("MQSTORE_RELIABILITY_REPORT")
    if out and FIGURES:
        me = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(f"{out}.{me}").write_text(json.dumps(dict(FIGURES)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    out = os.environ.get("MQSTORE_RELIABILITY_REPORT")
    total: Counter[str] = Counter(FIGURES)
    if out:
        total = Counter()
        for part in Path(out).parent.glob(Path(out).name + ".*"):  # one per process
            total.update(json.loads(part.read_text()))
        if total:
            Path(out).write_text(json.dumps(dict(sorted(total.items())), indent=2) + "\n")
    if not total:
        return
    terminalreporter.write_sep("-", "reliability figures" + (" (full size)" if FULL else ""))
    for k in sorted(total):
        terminalreporter.write_line(f"{k}: {total[k]}")
