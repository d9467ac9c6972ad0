"""The short version of tests/reliability/test_retries.py for the normal suite: the same
faults (flusher SIGSTOPped past the flush timeout, supervisor SIGKILLed and restarted
between a put and its retry) over 2,000 messages (the first two cycles at once: a stop,
then a stop and a kill); each stored exactly once."""

from __future__ import annotations

import random
from pathlib import Path

from tests.reliability.test_retries import run_retry_faults
from tests.runtime.conftest import StoreFactory


def test_retried_puts_are_stored_once_short(make_store: StoreFactory, tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(1 << 32)
    figures = run_retry_faults(make_store, tmp_path, seed, 2000)
    assert figures["lost"] == figures["duplicates"] == 0
    assert figures["supervisor kills"] >= 1 and figures["first tries not PUT_OK"] > 0, figures
