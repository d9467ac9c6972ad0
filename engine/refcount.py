"""RocketMQ's ReferenceResource (spec §8.1): a count of holders with a forced shutdown.

The resource starts with one reference. `hold()` takes one more while it is available;
`release()` drops one and, at zero, calls `_cleanup` (the subclass unmaps, closes).
`shutdown(interval_forcibly_ms)` makes it unavailable and drops the initial reference;
called again after `interval_forcibly_ms` it forces the count to `-1000 - count` and
cleans up despite holders. Subclasses: `engine.segment.Segment`.

Thread safety: the count is under a lock; `available` is written only by `shutdown`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class ReferenceCounted:
    """The count, the availability and the forced shutdown, with an injectable clock."""

    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self._ref_count = 1
        self.available = True  # False from the first shutdown on
        self._cleanup_over = False
        self._first_shutdown_ms = 0
        self._ref_lock = threading.Lock()
        self._clock_ms = clock_ms

    @property
    def ref_count(self) -> int:
        return self._ref_count

    def hold(self) -> bool:
        """Take a reference; False once the resource is shutting down. O(1)."""
        with self._ref_lock:
            if self.available and self._ref_count > 0:
                self._ref_count += 1
                return True
            return False

    def release(self) -> None:
        """Drop a reference; at zero (or below, after a forced shutdown) clean up."""
        with self._ref_lock:
            self._ref_count -= 1
            if self._ref_count > 0:
                return
            self._cleanup_over = self._cleanup(self._ref_count)

    def shutdown(self, interval_forcibly_ms: int) -> None:
        """First call: unavailable, drop the initial reference. Later calls: force cleanup
        once `interval_forcibly_ms` has passed since the first call and holders remain."""
        if self.available:
            self.available = False
            self._first_shutdown_ms = self._clock_ms()
            self.release()
        elif (
            self._ref_count > 0
            and self._clock_ms() - self._first_shutdown_ms >= interval_forcibly_ms
        ):
            with self._ref_lock:
                self._ref_count = -1000 - self._ref_count
            self.release()

    def is_cleanup_over(self) -> bool:
        return self._ref_count <= 0 and self._cleanup_over

    def _cleanup(self, current_ref: int) -> bool:
        """Free the resource; True when done. Called under the count's lock."""
        raise NotImplementedError
