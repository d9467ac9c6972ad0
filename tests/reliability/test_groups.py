"""A consumer group under load with a member SIGKILLed every 5 s and a new one joining
(issue 25; `tests/groups/loadrun.py` says what is checked): 2 producers, 4 members, 8
queues. 2 x 10,000 messages in normal runs, 2 x 500,000 (1,000,000) with
MQSTORE_RELIABILITY_FULL=1. Figures: messages, duplicates, kills, rebalance times (ms)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.groups import loadrun
from tests.reliability.conftest import FIGURES, sized

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def test_group_million_with_kills(tmp_path: Path, seed: int) -> None:
    per = sized(10_000, 500_000)
    fig = loadrun.run(
        tmp_path, per_producer=per, kill_every_s=5.0, min_kills=sized(2, 8), seed=seed
    )
    print(f"\ngroup load (seed {seed}): {fig.line()}")
    FIGURES["group messages"] += fig.messages
    FIGURES["group duplicates (un-acked at a kill)"] += fig.duplicates
    FIGURES["group kills"] += fig.kills
    FIGURES["group max rebalance after SIGKILL ms"] = max(
        FIGURES["group max rebalance after SIGKILL ms"], int(max(fig.kill_rebalance_s) * 1000)
    )
    FIGURES["group max rebalance after a join ms"] = max(
        FIGURES["group max rebalance after a join ms"], int(max(fig.join_rebalance_s) * 1000)
    )
    assert max(fig.kill_rebalance_s) < 5.0, (seed, fig.line())
