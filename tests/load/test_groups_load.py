"""A consumer group under load with members SIGKILLed (issue 25; `tests/groups/loadrun.py`
says what is checked). The short version: 2 x 10,000 messages, a kill every 2 s, at least
3 kills. The full size (1,000,000 messages, a kill every 5 s) is in the reliability suite
(`tests/reliability/test_groups.py`)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.groups import loadrun

pytestmark = pytest.mark.load


def test_group_with_kills_loses_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("MQSTORE_RELIABILITY_SEED", random.randrange(1 << 30)))
    fig = loadrun.run(tmp_path, per_producer=10_000, kill_every_s=2.0, min_kills=3, seed=seed)
    print(f"\ngroup load (seed {seed}): {fig.line()}")
    # generous: correctness is the check above; the ≤ 1 s goal is reported, not timed
    assert max(fig.kill_rebalance_s) < 5.0, fig.line()
