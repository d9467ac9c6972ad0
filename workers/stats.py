"""The status document `mqstore status` shows, built by the supervisor from the control
block (positions, flags, pool, workers, clients' counters and latency histograms).

Rates come from two samples the supervisor takes about a second apart. Latency
percentiles come from log2 buckets of microseconds (a bucket's upper bound is reported,
so p50/p99 are within a factor of two); max is exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mqstore.ipc import control as c
from mqstore.ipc.control_views import (
    DiskWord,
    DispatchStats,
    Flags,
    FlushStats,
    Positions,
    Reservation,
)
from mqstore.workers.cleaner import status_doc as cleaner_status


def _zeros(n: int) -> list[int]:
    return [0] * n


@dataclass
class Totals:
    """The client rows summed (live clients, plus those retired by the supervisor)."""

    puts: int = 0
    errors: int = 0
    bytes: int = 0
    sync_puts: int = 0
    lat_max_ns: int = 0
    hist: list[int] = field(default_factory=lambda: _zeros(c.HIST_BUCKETS))
    lat_sum_ns: int = 0
    by_status: list[int] = field(default_factory=lambda: _zeros(c.STATUS_FIELDS))
    # per phase (`control.PHASES`): PHASE_BUCKETS log2-µs buckets, then the sum in ns
    phases: list[list[int]] = field(
        default_factory=lambda: [_zeros(c.PHASE_FIELDS) for _ in c.PHASES]
    )

    def add_row(self, row: tuple[int, ...]) -> None:
        self.puts += row[c.CF_PUTS]
        self.errors += row[c.CF_ERRORS]
        self.bytes += row[c.CF_BYTES]
        self.lat_max_ns = max(self.lat_max_ns, row[c.CF_LAT_MAX_NS])
        self.sync_puts += row[c.CF_SYNC_PUTS]
        self.lat_sum_ns += row[c.CF_LAT_SUM_NS]
        for i in range(c.STATUS_FIELDS):
            self.by_status[i] += row[c.CF_STATUS + i]
        for i in range(c.HIST_BUCKETS):
            self.hist[i] += row[c.CF_HIST + i]
        for k, ph in enumerate(self.phases):
            base = c.CF_PHASES + k * c.PHASE_FIELDS
            for i in range(c.PHASE_FIELDS):
                ph[i] += row[base + i]

    def merged(self, other: Totals) -> Totals:
        def add(a: list[int], b: list[int]) -> list[int]:
            return [x + y for x, y in zip(a, b, strict=True)]

        return Totals(
            self.puts + other.puts,
            self.errors + other.errors,
            self.bytes + other.bytes,
            self.sync_puts + other.sync_puts,
            max(self.lat_max_ns, other.lat_max_ns),
            add(self.hist, other.hist),
            self.lat_sum_ns + other.lat_sum_ns,
            add(self.by_status, other.by_status),
            [add(a, b) for a, b in zip(self.phases, other.phases, strict=True)],
        )


def percentile_us(hist: list[int], q: float) -> float:
    total = sum(hist)
    if total == 0:
        return 0.0
    want = q * total
    seen = 0
    for b, n in enumerate(hist):
        seen += n
        if seen >= want:
            return float(1 << b) if b else 1.0
    return float(1 << (len(hist) - 1))


@dataclass
class Sample:
    t: float
    puts: int
    fsyncs: int
    fsync_msgs: int
    bytes: int


def live_totals(cb: c.ControlBlock, rows: dict[int, int]) -> Totals:
    t = Totals()
    for index in rows:
        t.add_row(cb.client_row(index))
    return t


def sample(cb: c.ControlBlock, totals: Totals) -> Sample:
    flush = FlushStats(cb)
    return Sample(time.monotonic(), totals.puts, flush.fsyncs, flush.fsync_slots, totals.bytes)


def worker_docs(
    cb: c.ControlBlock, workers: list[tuple[int, str, int | None]]
) -> list[dict[str, Any]]:
    """The status rows of the workers given as (index, name, last exit code)."""
    out = []
    for index, name, last_exit in workers:
        _n, pid, hb, restarts, state = cb.worker(index)
        out.append(
            {
                "name": name,
                "pid": pid,
                "restarts": restarts,
                "state": c.WORKER_STATE_NAMES.get(state, str(state)),
                "heartbeat_age_ms": max(0, c.heartbeat_clock_ms() - hb) if pid else None,
                "last_exit": last_exit,
            }
        )
    return out


def build(
    cb: c.ControlBlock,
    store_dir: str,
    totals: Totals,
    prev: Sample | None,
    workers: list[dict[str, Any]],
    clients: int,
    settings: dict[str, Any],
) -> dict[str, Any]:
    now = sample(cb, totals)
    pos, flush, resv = Positions(cb), FlushStats(cb), Reservation(cb)
    reserved = pos.reserved
    published = pos.published
    committed = pos.committed
    flushed = pos.flushed
    size = cb.segment_size
    pool = cb.pool_buffers
    in_use = (reserved // size - committed // size + 1) if pool else 0
    rates: dict[str, float] = {"puts_per_s": 0.0, "bytes_per_s": 0.0, "fsyncs_per_s": 0.0}
    if prev is not None and now.t > prev.t:
        dt = now.t - prev.t
        rates = {
            "puts_per_s": round((now.puts - prev.puts) / dt, 1),
            "bytes_per_s": round((now.bytes - prev.bytes) / dt, 1),
            "fsyncs_per_s": round((now.fsyncs - prev.fsyncs) / dt, 1),
        }
    fsyncs = flush.fsyncs
    return {
        "store_dir": store_dir,
        "generation": cb.generation,
        "supervisor_pid": cb.supervisor_pid,
        "flags": Flags(cb).names(),
        "settings": settings,
        "positions": {
            "reserved": reserved,
            "published": published,
            "committed": committed,
            "flushed": flushed,
            "allocated_upto": pos.allocated,
            "dispatched": pos.dispatched,
        },
        "commit_lag_bytes": published - committed,
        # what the committer commits in commit_backlog_drain_ms at its recent pace, the
        # backlog producers wait at (0: not measured yet, or no such bound)
        "commit_drain_bytes": pos.commit_drain,
        "flush_lag_bytes": committed - flushed,
        "dispatch_lag_bytes": max(0, committed - pos.dispatched),
        "dispatched_records": DispatchStats(cb).records,
        "dispatch_python_batches": DispatchStats(cb).python_batches,
        "pool": {
            "enabled": pool > 0,
            "buffers": pool,
            "buffer_bytes": size if pool else 0,
            "free": max(0, min(pool, pool - in_use)) if pool else 0,
        },
        "workers": workers,
        "clients": clients,
        "puts": {
            "total": totals.puts,
            "errors": totals.errors,
            "bytes": totals.bytes,
            "sync": totals.sync_puts,
            **rates,
        },
        "latency_us": {
            "p50": percentile_us(totals.hist, 0.50),
            "p99": percentile_us(totals.hist, 0.99),
            "max": round(totals.lat_max_ns / 1000, 1),
        },
        "fsync": {
            "total": fsyncs,
            "per_s": rates["fsyncs_per_s"],
            "msgs_per_fsync": round(flush.fsync_slots / fsyncs, 2) if fsyncs else 0.0,
            "mean_us": round(flush.fsync_ns / fsyncs / 1000, 1) if fsyncs else 0.0,
            "failures": flush.failures,
        },
        "fillers": resv.fillers,
        # 0 until the cleaner's first disk check
        "cleaner": cleaner_status(store_dir, DiskWord(cb).word or None),
        "findings": [str(f) for f in cb.check()],
        "reservation_holder": reservation_holder(cb),
        "busy_waits": resv.busy_waits,
        # puts refused OS_PAGECACHE_BUSY because one holder kept the reservation lock
        # longer than osPageCacheBusyTimeOutMills (the reason each such put carries)
        "lock_timeouts": resv.lock_timeouts,
        # ... and because the wait behind holders that each held it briefly reached its cap
        "lock_queued": resv.lock_queued,
        # ... and after waiting the busy timeout for the next file, a pool buffer or slots
        "room_timeouts": resv.room_timeouts,
    }


# /proc/PID/stat state letters, as `ps` names them
PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "in I/O", "T": "stopped", "t": "traced",
                  "Z": "zombie", "X": "dead"}  # fmt: skip


def process_state(pid: int) -> str:
    """What `pid` is doing (`PROCESS_STATES`), or "gone"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        letter = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode()
    except (OSError, ValueError):
        return "gone"
    return PROCESS_STATES.get(letter, letter)


def reservation_holder(cb: c.ControlBlock) -> dict[str, Any] | None:
    """The producer inside the reservation step now (its pid, from the intent record
    `cs_pid`, and its state), or None. A put holds it for microseconds; one seen twice,
    or "stopped", is what holds every other put up (they answer OS_PAGECACHE_BUSY)."""
    pid = Reservation(cb).holder_pid
    if pid <= 0:
        return None
    return {"pid": pid, "state": process_state(pid)}
