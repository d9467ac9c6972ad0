"""The flags word keeps every bit any process sets: each change is one atomic
read-modify-write (`Flags._change` through `_native.fetch_or` / `fetch_and_not`). Before,
`Flags` loaded the word and stored it back with its bit changed, and a bit another
process set in between was gone: FENCED (the fence's C `fetch_or`) or READ_ONLY (a
worker failing closed) lost under the supervisor's `mark_running` / `mark_stopped`, and
the store went on acknowledging writes it must refuse."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from mqstore import _native
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Flags
from tests.runtime.harness import racing_writer

# The supervisor's changes, as fast as Python goes: RUNNING on, then STOPPED on and
# RUNNING off (`mark_stopped`'s order), `argv[3]` times.
FLIPPER = textwrap.dedent(
    """
    import sys
    from mqstore.ipc import control as c
    from mqstore.ipc.control_views import Flags
    cb = c.ControlBlock.attach(sys.argv[1], sys.argv[2])
    flags = Flags(cb)
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    for _ in range(int(sys.argv[3])):
        flags.mark_running()
        flags.mark_stopped()
    del flags
    cb.close()
    """
)


def _fence(cb: c.ControlBlock) -> int:
    _native.fence(cb.buf)  # C: fetch_or(FENCED | REFUSE_WRITES)
    return c.FLAG_FENCED | c.FLAG_REFUSE_WRITES


def _fail_closed(cb: c.ControlBlock) -> int:
    Flags(cb).mark_read_only()  # a worker's `workers.service.fail_closed`
    return c.FLAG_READ_ONLY


@pytest.mark.parametrize("mark", [_fence, _fail_closed], ids=["fence", "read_only"])
def test_a_bit_set_while_another_process_changes_the_word_stays_set(
    cb: c.ControlBlock, mark: Callable[[c.ControlBlock], int]
) -> None:
    """A child process flips RUNNING and STOPPED through `Flags` in a loop; here, while it
    runs, the fence (or a worker's mark_read_only) sets its bits, and the next atomic
    clear says whether they were still there. Nobody else clears them, so each one
    missing is a lost update (on the parent commit's `Flags._change`: hundreds per run
    on this 2-core machine). At the end, every bit the last changes set is set."""
    flips = 300_000
    lost = rounds = 0
    seen = {True: 0, False: 0}  # RUNNING in the word at a clear: the two overlapped
    with racing_writer(FLIPPER, cb.ctl_name, cb.pool_name, str(flips)) as proc:
        while proc.poll() is None:
            for _ in range(200):
                bits = mark(cb)
                was = _native.fetch_and_not(cb.buf, c.OFF_FLAGS, bits)
                lost += was & bits != bits
                seen[bool(was & c.FLAG_RUNNING)] += 1
                rounds += 1
    assert lost == 0, f"{lost} of {rounds} changes lost"
    assert seen[True] > 100 and seen[False] > 100, seen
    bits = mark(cb)
    assert cb.get(c.OFF_FLAGS) == c.FLAG_STOPPED | bits, Flags(cb).names()
