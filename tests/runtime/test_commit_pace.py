"""The committer's drain bound (`ipc.commit_pace.CommitPace`): what it publishes from the
commit steps it is shown, into a control block's word that producers read."""

from __future__ import annotations

from mqstore.ipc import commit_pace as cp
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Positions

MS = 1_000_000


def _pace(drain_ms: int) -> tuple[cp.CommitPace, Positions]:
    pos = Positions(bytearray(c.SLOTS_OFF))
    return cp.CommitPace(pos, drain_ms), pos


def test_it_publishes_the_bytes_of_drain_ms_at_the_pace_of_a_window() -> None:
    """Nothing until a window of copying is timed; then bytes per ns x drain_ms, and a
    later window replaces it (a slowed committer lowers the bound at once)."""
    pace, pos = _pace(50)
    pace.note(10 << 20, 10 * MS)  # 1 GiB/s-ish, half a window
    assert pos.commit_drain == 0
    pace.note(10 << 20, 10 * MS)
    assert pos.commit_drain == (20 << 20) * 50 // 20 == pace.published  # 50 ms of it
    pace.note(4 << 20, 20 * MS)  # a fifth of the pace
    assert pos.commit_drain == max(cp.FLOOR_BYTES, (4 << 20) * 50 // 20)


def test_small_steps_do_not_count_and_the_floor_holds() -> None:
    pace, pos = _pace(50)
    for _ in range(100):
        pace.note(cp.MIN_STEP_BYTES - 1, 1 * MS)  # a tick's small tail: not its pace
    assert pos.commit_drain == 0
    pace.note(1 << 20, 1000 * MS)  # 1 MiB/s: the bound is the floor, not 50 KiB
    assert pos.commit_drain == cp.FLOOR_BYTES


def test_drain_ms_0_withdraws_the_bound_and_notes_nothing() -> None:
    pace, pos = _pace(50)
    pace.note(64 << 20, 30 * MS)
    assert pos.commit_drain > 0
    pace.set_drain_ms(0)  # SIGHUP with commit_backlog_drain_ms = 0
    assert pos.commit_drain == 0
    pace.note(64 << 20, 30 * MS)
    assert pos.commit_drain == 0
    pace.set_drain_ms(10)
    pace.note(64 << 20, 32 * MS)
    assert pos.commit_drain == (64 << 20) * 10 // 32
