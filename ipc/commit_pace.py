"""The committer's recent copy pace, published as a commit-backlog bound (the drain bound).

With the pool on, readers see only what the committer has copied into the files, so the
last message of a burst becomes readable after the committer has worked off the backlog
(`reserved - committed`): backlog / the committer's pace. The fixed bound
(`commit_backlog_max_bytes`) lets a burst through for `commit_backlog_grace_ms`; on a VM
whose new page-cache pages cost a host fault each (free page reporting,
docs/tuning.md), the committer's copy can slow to a third within a second late in a
run, and a grace then let 150-295 MB build up behind it (`bench/results/dispatch_lag.md`,
stop 35). So the committer times its own commit steps and publishes the bytes it
commits in `commit_backlog_drain_ms` at the pace of its last `WINDOW_NS` of copying
(`Positions.set_commit_drain`); a put waits at a backlog that large, grace or not
(C `mqs_backlog_full`). A committer that slows down throttles producers, and readers
stay about `commit_backlog_drain_ms` behind, whatever the pace.

The pace is bytes per nanosecond of copying, not of wall time: ticks that found little
to do and the waits between them do not count, and steps of under `MIN_STEP_BYTES`
(a tick's small tail, mostly fixed cost) are left out. Time the committer spends
runnable but not running inside a step does count: that is part of its pace too.
Committer only (one writer of the word); the flusher's commit on demand does not note
steps. O(1) per step.
"""

from __future__ import annotations

from typing import Final

from mqstore.ipc.control_views import Positions

WINDOW_NS: Final = 20_000_000  # copying time per published figure: ~10-20 steps of 1 MiB
MIN_STEP_BYTES: Final = 64 << 10  # smaller steps are mostly a tick's fixed cost
# Never bound the backlog below this: a few commit steps, so a committer that measured a
# slow window still gets whole steps to work on.
FLOOR_BYTES: Final = 4 << 20


class CommitPace:
    """Notes the committer's commit steps and publishes the drain bound."""

    __slots__ = ("_bytes", "_ns", "_pos", "drain_ms", "published")

    def __init__(self, pos: Positions, drain_ms: int) -> None:
        self._pos = pos
        self._bytes = self._ns = 0
        self.published = 0
        self.drain_ms = -1
        self.set_drain_ms(drain_ms)

    def set_drain_ms(self, drain_ms: int) -> None:
        """`commit_backlog_drain_ms`, re-read by the committer every tick: 0 withdraws
        the bound at once (the word goes back to 0, the fixed bound alone holds)."""
        if drain_ms == self.drain_ms:
            return
        self.drain_ms = drain_ms
        if drain_ms <= 0:
            self._publish(0)

    def note(self, nbytes: int, ns: int) -> None:
        """One commit step: `nbytes` copied in `ns` of the committer's wall time."""
        if nbytes < MIN_STEP_BYTES or self.drain_ms <= 0:
            return
        self._bytes += nbytes
        self._ns += max(ns, 1)
        if self._ns >= WINDOW_NS:
            drain = self._bytes * self.drain_ms * 1_000_000 // self._ns
            self._publish(max(drain, FLOOR_BYTES))
            self._bytes = self._ns = 0

    def _publish(self, drain: int) -> None:
        self.published = drain
        self._pos.set_commit_drain(drain)
