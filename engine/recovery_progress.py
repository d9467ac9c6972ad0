"""Recovery's progress: where it is, said at a bounded rate, and the stop a signal asks for.

Recovery (`engine.recovery`) calls its `Progress` after every chunk of records it
validates or re-dispatches (a few milliseconds of work each) with a `Step`: the phase,
bytes done of the phase's total, records done. The callback may raise
`RecoveryInterrupted`: recovery then stops where it is, having written nothing that a
later recovery does not redo (`abort` stays, so the next start recovers again).

`ProgressReporter` is the callback the supervisor and `mqstore recover` use: at the
first step and then at most once per `interval_s` it replaces the progress file
(`recovery.progress` in the store, JSON), which `mqstore status` reads while no
supervisor answers (`read_progress`), and (from the second) logs a line: done of
total, rate, ETA. `close()` removes the file. It raises `RecoveryInterrupted` as soon
as `stop_requested()` says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

PROGRESS_FILE: Final = "recovery.progress"
VALIDATING: Final = "validating"
REDISPATCHING: Final = "re-dispatching"


@dataclass(frozen=True, slots=True)
class Step:
    """How far a recovery phase is: `done_bytes` of `total_bytes` of log, `records`."""

    phase: str  # VALIDATING or REDISPATCHING
    done_bytes: int
    total_bytes: int
    records: int


Progress = Callable[[Step], None]


class RecoveryInterrupted(Exception):
    """A stop was asked for while recovering: recovery stopped part way, and the store
    is left for the next recovery (which redoes what this one did not finish)."""


class ProgressReporter:
    """A `Progress` for a store: logs through `say` and keeps the progress file (none
    for `store_dir` None) at most every `interval_s`; raises `RecoveryInterrupted` once
    `stop_requested()` is true."""

    def __init__(
        self,
        store_dir: str | None,
        say: Callable[[str], None],
        stop_requested: Callable[[], bool] = lambda: False,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = None if store_dir is None else os.path.join(store_dir, PROGRESS_FILE)
        self._say = say
        self._stop_requested = stop_requested
        self._interval_s = interval_s
        self._clock = clock
        self._phase = ""
        self._phase_t0 = self._last = clock()
        self._phase_from = Step("", 0, 0, 0)

    def __call__(self, step: Step) -> None:
        if self._stop_requested():
            raise RecoveryInterrupted(
                f"stopped while {step.phase} ({step.done_bytes:,} of {step.total_bytes:,} "
                "bytes): the next start recovers again"
            )
        now = self._clock()
        first = not self._phase
        if step.phase != self._phase:  # rates are the phase's own, from its first step
            self._phase, self._phase_t0, self._phase_from = step.phase, now, step
        if not first and now - self._last < self._interval_s:
            return
        self._last = now
        elapsed = max(now - self._phase_t0, 1e-9)
        bytes_per_s = (step.done_bytes - self._phase_from.done_bytes) / elapsed
        doc = {
            **asdict(step),
            "pid": os.getpid(),
            "bytes_per_s": round(bytes_per_s),
            "records_per_s": round((step.records - self._phase_from.records) / elapsed),
            "eta_s": _eta(step, bytes_per_s),
            "at_ms": time.time_ns() // 1_000_000,
        }
        if not first:  # the file says at once that recovery runs; the log, once a while
            self._say(f"recovery: {describe(doc)}")
        if self._path is not None:
            with contextlib.suppress(OSError):  # a full disk: the log line has said it
                _replace(self._path, json.dumps(doc).encode())

    def close(self) -> None:
        """Remove the progress file (recovery is over)."""
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)


def _eta(step: Step, bytes_per_s: float) -> float | None:
    if bytes_per_s <= 0:
        return None
    return round(max(step.total_bytes - step.done_bytes, 0) / bytes_per_s, 1)


def describe(doc: dict[str, Any]) -> str:
    """One line of a progress document: 'validating 512 of 1,024 MiB (50%), ...'."""
    done, total = int(doc["done_bytes"]), int(doc["total_bytes"])
    pct = f" ({100 * done / total:.0f}%)" if total > 0 else ""
    eta = doc.get("eta_s")
    return (
        f"{doc['phase']} {done / 2**20:,.0f} of {total / 2**20:,.0f} MiB{pct}, "
        f"{int(doc['records']):,} records, {int(doc['records_per_s']):,} records/s "
        f"{int(doc['bytes_per_s']) / 1e6:,.0f} MB/s"
        + (f", ETA {float(eta):,.0f} s" if eta is not None else "")
    )


def read_progress(store_dir: str) -> dict[str, Any] | None:
    """The last progress document a recovery of the store wrote, or None (none kept, or
    unreadable). Whether that recovery still runs is the caller's to check (`pid`)."""
    try:
        with open(os.path.join(store_dir, PROGRESS_FILE), "rb") as f:
            doc = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    need = ("phase", "done_bytes", "total_bytes", "records", "pid", "records_per_s", "bytes_per_s")
    if not isinstance(doc, dict) or not all(k in doc for k in need):
        return None
    try:
        describe(doc)
    except (TypeError, ValueError):
        return None
    return doc


def _replace(path: str, data: bytes) -> None:
    """Write `path` by a rename (a reader sees the old or the new document, never a
    mix). Not forced: it says where a running recovery is, nothing to keep."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
