"""A store into the control block is one store of the whole field: another process never
loads a value nobody wrote (stop 32's "the control block was overwritten (flushed
132632318, committed 0)" was `struct.pack_into`, which clears a field before it writes
it; `ipc.control.words`)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from mqstore.ipc import control as c
from tests.runtime.harness import racing_writer

WRITER = textwrap.dedent(
    """
    import sys
    from mqstore.ipc import control as c
    from mqstore.ipc.control_views import DispatchStats, Positions
    cb = c.ControlBlock.attach(sys.argv[1], sys.argv[2])
    pos, stats = Positions(cb), DispatchStats(cb)
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    for v in range(1, int(sys.argv[3]) + 1):
        pos.advance_committed(v)  # the commit step's store
        cb.beat(0)  # a worker's heartbeat (a clock in ms: moves every ms or so)
        stats.count_topic_deleted()  # a counter's +=
    cb.close()
    """
)


def test_a_reader_in_another_process_never_sees_a_field_go_back(cb: c.ControlBlock) -> None:
    """A writer process moves committed_pos and a counter up from 1 and beats, as fast
    as Python can; this process reads them as fast as it can while it runs. Every value
    read is at least the one read before it (before the fix: 0, thousands of times a
    second on this machine's 2 cores)."""
    writes = 400_000
    offs = (c.OFF_COMMITTED, c.WORKERS_OFF + 8, c.OFF_TOPICS_DELETED)
    last = [0, 0, 0]
    back: list[tuple[int, int, int]] = []
    reads = seen_moving = 0
    with racing_writer(WRITER, cb.ctl_name, cb.pool_name, str(writes)) as proc:
        while proc.poll() is None:
            for _ in range(1000):
                for i, off in enumerate(offs):
                    now = cb.get(off)
                    if now < last[i] and len(back) < 10:
                        back.append((off, last[i], now))
                    if 0 < now < writes:
                        seen_moving += i == 0
                    last[i] = now
                reads += 1
    assert back == [], f"(offset, value read, then read) in {reads} reads: {back}"
    assert last[0] == last[2] == writes and last[1] > 0
    # The reads overlapped the writes (else this test could not have failed).
    assert seen_moving > 1000, seen_moving


def _pack_into_calls(path: Path) -> list[tuple[str, int]]:
    """(function, line) of every `*.pack_into(...)` call in `path`."""
    out: list[tuple[str, int]] = []
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "pack_into"
                ):
                    out.append((fn.name, node.lineno))
    return out


def test_no_pack_into_the_block_after_it_is_created() -> None:
    """The block's writers store through `ipc.control.words` (or copy packed bytes): a
    `pack_into` only where nobody maps the block yet (`create`, before the magic) and
    into an empty queue-table row (zeros cleared to zeros)."""
    ipc = Path(c.__file__).parent
    calls = _pack_into_calls(ipc / "control.py") + _pack_into_calls(ipc / "control_views.py")
    assert {fn for fn, _line in calls} <= {"create", "find_or_add_queue"}, calls
