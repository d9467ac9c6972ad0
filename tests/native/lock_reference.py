"""The Python twin of the put's wait for the reservation lock (`ipc/native/mqs_append.c`:
`mqs_lock_held`) while one holder keeps it: what the waiter answers and when, from how
long that holder has held it. `test_append.py` compares it with the C against a real
held mutex; handovers between holders are `test_append.py`'s and `test_failures.py`'s."""

from __future__ import annotations

from mqstore import _native


def lock_held_reference(held_ns: int, hold_ns: int, cap_ns: int) -> tuple[int, int]:
    """(the answer, how long after the call it comes) for a waiter allowed `hold_ns` per
    holder and `cap_ns` in all, behind one holder that has held the lock for `held_ns`
    and keeps it: busy (LOCK_TIMEOUT) once that hold passes `hold_ns` and the waiter has
    waited `hold_ns` itself (the later of the two: the waiter's own, as the holder took
    the lock before the call), else LOCK_QUEUED at the cap if that comes first."""
    left = max(hold_ns - held_ns, hold_ns)
    if cap_ns < left:
        return _native.LOCK_QUEUED, cap_ns
    return _native.LOCK_TIMEOUT, left
