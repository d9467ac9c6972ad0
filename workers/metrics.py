"""Prometheus metrics of a running store, served by the supervisor (`metrics_port`, 0 = off).

Workers and clients record into the control block (positions, fsync counters, per-client
put counters and log2-µs latency buckets); this collector reads it at scrape time, in the
HTTP server's thread. Nothing on the hot path does I/O for metrics.

What the control block does not hold yet (so is not exported): put latency by phase (lock
wait, append, flush wait: the clients record the total only, exported as
`mqstore_put_latency_seconds`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from mqstore.engine import fileio, record
from mqstore.engine.diskguard import decode_state
from mqstore.engine.segment import segment_file_name
from mqstore.engine.storedir import list_segments
from mqstore.ipc import control as c
from mqstore.ipc.control_views import (
    DiskWord,
    DispatchStats,
    Flags,
    FlushStats,
    Histograms,
    Positions,
)
from mqstore.ipc.results import PutMessageStatus
from mqstore.workers import stats


def _store_timestamp(path: str, pos: int = 0) -> int | None:
    """The store timestamp (ms) of the record at `pos` of a commit-log file (default its
    first), or None (no message record there, no file)."""
    try:
        fd = fileio.open_file(path, create=False, read_only=True)
    except fileio.StoreIOError:
        return None
    try:
        head = fileio.pread(fd, 128, pos, path)
    except fileio.StoreIOError:
        return None
    finally:
        fileio.close(fd, path)
    return record.peek_store_timestamp(head)


def oldest_undispatched_ms(store_dir: str, cb: c.ControlBlock, sync_flush: bool) -> int | None:
    """The store time (ms) of the oldest record the dispatcher may dispatch and has not:
    the one at its position (past a segment's BLANK, the next segment's first), when the
    position is below its limit (`readable_end`: flushed under SYNC_FLUSH, else what is
    in the files). None when it has caught up; the store time of the last record it
    dispatched when the next one cannot be read (not a message: a stop at damage)."""
    pos = Positions(cb)
    dispatched, end = pos.dispatched, pos.readable_end(sync_flush)
    if dispatched >= end:
        return None
    size = cb.segment_size
    for off in (dispatched, dispatched - dispatched % size + size):
        if off >= end:
            break
        path = os.path.join(store_dir, "commitlog", segment_file_name(off - off % size))
        ts = _store_timestamp(path, off % size)
        if ts is not None:
            return ts
    return DispatchStats(cb).last_ts or None


def dispatch_behind_seconds(
    store_dir: str, cb: c.ControlBlock, sync_flush: bool, now_s: float
) -> float:
    """`mqstore_dispatch_behind_seconds`: how long the oldest record the dispatcher could
    dispatch has waited (now minus its store time), 0 when it has caught up."""
    ts = oldest_undispatched_ms(store_dir, cb, sync_flush)
    return 0.0 if ts is None else max(0.0, now_s - ts / 1000)


class StoreCollector(Collector):
    """Reads the control block (and lists the commit log) at each scrape."""

    def __init__(
        self,
        store_dir: str,
        cb: Callable[[], c.ControlBlock | None],
        totals: Callable[[], stats.Totals],
        read_only: Callable[[], dict[str, str] | None] = lambda: None,
        *,
        sync_flush: bool = False,
    ) -> None:
        """`sync_flush`: the store's flush type (where the dispatcher may go, so what
        it is behind: `oldest_undispatched_ms`)."""
        self.store_dir = store_dir
        self.sync_flush = sync_flush
        self._cb = cb
        self._totals = totals
        self._read_only = read_only
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._allocated = 0
        self._deleted = 0
        self._first_ts: tuple[str, int | None] | None = None

    def _segments(self) -> tuple[int, int, int, int | None]:
        """(bytes, files allocated since start, deleted since start, oldest store ts)."""
        segs = list_segments(self.store_dir)
        names = {s.path for s in segs}
        with self._lock:
            self._allocated += len(names - self._seen)
            self._deleted += len(self._seen - names)
            self._seen = names
            oldest: int | None = None
            if segs:
                first = segs[0].path
                cached = self._first_ts
                if cached is None or cached[0] != first or cached[1] is None:
                    cached = (first, _store_timestamp(first))
                    self._first_ts = cached
                oldest = cached[1]
            return sum(s.size_bytes for s in segs), self._allocated, self._deleted, oldest

    def collect(self) -> Iterator[Metric]:
        cb = self._cb()
        if cb is None:
            return
        pos, flush, hist = Positions(cb), FlushStats(cb), Histograms(cb)
        totals = self._totals()
        yield from _counters(cb, totals)
        yield from _latency(totals)
        yield _log2_histogram(
            "mqstore_fsync_latency_seconds",
            "duration of the flusher's fsyncs (sum: the exact total)",
            hist.fsync_us(),
            c.FSYNC_HIST_SHIFT,
            1e-6,
            flush.fsync_ns / 1e9,
        )
        yield _log2_histogram(
            "mqstore_group_commit_messages",
            "reservation slots (messages or batches) covered by each fsync",
            hist.group_commits(),
            0,
            1.0,
            float(flush.fsync_slots),
        )
        yield _log2_histogram(
            "mqstore_dispatch_lag_seconds",
            "per record, dispatch time minus store time (ms resolution)",
            hist.dispatch_lag_ms(),
            0,
            1e-3,
            hist.dispatch_lag_sum_ms / 1e3,
        )
        size, allocated, deleted, oldest_ts = self._segments()
        m = CounterMetricFamily("mqstore_segments_allocated", "commit-log files seen appear")
        m.add_metric([], allocated)
        yield m
        m = CounterMetricFamily("mqstore_segments_deleted", "commit-log files seen go away")
        m.add_metric([], deleted)
        yield m
        published, committed = pos.published, pos.committed
        flushed, dispatched = pos.flushed, pos.dispatched
        limit = pos.readable_end(self.sync_flush)
        gauges: list[tuple[str, str, float]] = [
            ("mqstore_commit_behind_bytes", "published but not committed", published - committed),
            ("mqstore_flush_behind_bytes", "committed but not flushed", committed - flushed),
            (
                "mqstore_dispatch_behind_bytes",
                "readable (flushed under SYNC_FLUSH, else in the files) but not yet in the "
                "consume queues",
                max(0, limit - dispatched),
            ),
            ("mqstore_store_size_bytes", "bytes of the commit-log files on disk", size),
        ]
        pool = cb.pool_buffers
        if pool:
            in_use = pos.reserved // cb.segment_size - committed // cb.segment_size + 1
            free = max(0, min(pool, pool - in_use))
            gauges.append(("mqstore_pool_free_buffers", "free transient pool buffers", free))
        word = DiskWord(cb).word
        if word:
            gauges.append(
                (
                    "mqstore_disk_used_ratio",
                    "disk used, as the cleaner last saw it",
                    decode_state(word)[2],
                )
            )
        if oldest_ts is not None:
            age = max(0.0, time.time() - oldest_ts / 1000)
            gauges.append(
                ("mqstore_oldest_message_age_seconds", "age of the oldest stored message", age)
            )
        dts = DispatchStats(cb).last_ts
        if dts:
            gauges.append(
                (
                    "mqstore_last_dispatched_age_seconds",
                    "now minus the store time of the last record dispatched "
                    "(grows while the store is idle: alert on dispatch_behind_seconds)",
                    max(0.0, time.time() - dts / 1000),
                )
            )
        # 0 while caught up, so an idle store never looks behind
        behind_s = dispatch_behind_seconds(self.store_dir, cb, self.sync_flush, time.time())
        gauges.append(
            (
                "mqstore_dispatch_behind_seconds",
                "0 when the dispatcher has caught up, else now minus the store time of the "
                "oldest record it could dispatch and has not (how long it has waited)",
                behind_s,
            )
        )
        for name, doc, value in gauges:
            gm = GaugeMetricFamily(name, doc)
            gm.add_metric([], value)
            yield gm
        flags = GaugeMetricFamily("mqstore_flag", "control block flags (1 = set)", labels=["flag"])
        word_flags = Flags(cb).word
        for bit, name in c.FLAG_NAMES.items():
            flags.add_metric([name], 1.0 if word_flags & bit else 0.0)
        yield flags
        yield _read_only(word_flags, self._read_only())


def _read_only(word_flags: int, reason: dict[str, str] | None) -> Metric:
    """1 while the store refuses writes after an I/O failure, labelled with the first
    failure's worker, operation and errno (empty until a worker's reason is in)."""
    m = GaugeMetricFamily(
        "mqstore_read_only",
        "1 = read-only after an I/O failure; the labels name the worker, syscall and errno",
        labels=["worker", "op", "errno"],
    )
    r = reason or {}
    value = 1.0 if word_flags & c.FLAG_READ_ONLY else 0.0
    m.add_metric([r.get("worker", ""), r.get("op", ""), r.get("errno", "")], value)
    return m


def _counters(cb: c.ControlBlock, totals: stats.Totals) -> Iterator[Metric]:
    flush = FlushStats(cb)
    puts = CounterMetricFamily(
        "mqstore_puts", "messages put, by PutMessageStatus", labels=["status"]
    )
    for st, n in zip(PutMessageStatus, totals.by_status, strict=True):
        puts.add_metric([st.value], n)
    yield puts
    m = CounterMetricFamily("mqstore_sync_puts", "puts that waited for the flush")
    m.add_metric([], totals.sync_puts)
    yield m
    m = CounterMetricFamily("mqstore_appended_bytes", "bytes appended by puts")
    m.add_metric([], totals.bytes)
    yield m
    fsyncs = flush.fsyncs
    m = CounterMetricFamily("mqstore_fsyncs", "fsyncs of the commit log")
    m.add_metric([], fsyncs)
    yield m
    m = CounterMetricFamily("mqstore_fsync_seconds", "time spent in commit-log fsyncs")
    m.add_metric([], flush.fsync_ns / 1e9)
    yield m
    m = CounterMetricFamily("mqstore_flush_failures", "failed flushes")
    m.add_metric([], flush.failures)
    yield m
    m = CounterMetricFamily("mqstore_dispatched_records", "records dispatched since boot")
    m.add_metric([], DispatchStats(cb).records)
    yield m
    m = CounterMetricFamily(
        "mqstore_dispatch_python_batches", "dispatch batches the C round left to Python"
    )
    m.add_metric([], DispatchStats(cb).python_batches)
    yield m
    restarts = CounterMetricFamily("mqstore_worker_restarts", "worker restarts", labels=["worker"])
    for i in range(c.MAX_WORKERS):
        name, _pid, _hb, n, _state = cb.worker(i)
        if name:
            restarts.add_metric([name], n)
    yield restarts


def _latency(totals: stats.Totals) -> Iterator[Metric]:
    """Put latency, whole call and by phase, from the clients' log2-µs buckets (bucket b
    holds latencies up to 2^b µs, the last one unbounded) and their exact sums."""
    yield _log2_histogram(
        "mqstore_put_latency_seconds",
        "put call latency, from the call to its result",
        totals.hist,
        0,
        1e-6,
        totals.lat_sum_ns / 1e9,
    )
    h = HistogramMetricFamily(
        "mqstore_put_phase_seconds",
        "put latency by phase: lock_wait (the reservation lock; on the slow path the whole"
        " reservation, waits for a buffer, slot or segment included), append (reserving"
        " and copying into the pool or segment), flush_wait (sync puts: until fsynced)",
        labels=["phase"],
    )
    for name, ph in zip(c.PHASES, totals.phases, strict=True):
        h.add_metric([name], _log2_buckets(ph[: c.PHASE_BUCKETS], 0, 1e-6), ph[-1] / 1e9)
    yield h


def _log2_histogram(
    name: str, doc: str, counts: list[int], shift: int, unit: float, total: float
) -> Metric:
    """A histogram from `bucket_of` buckets (bucket i up to 2^(i+shift), the last +Inf)."""
    h = HistogramMetricFamily(name, doc)
    h.add_metric([], _log2_buckets(counts, shift, unit), total)
    return h


def _log2_buckets(counts: list[int], shift: int, unit: float) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs of log2 buckets (bucket i up to 2^(i+shift) units)."""
    buckets: list[tuple[str, float]] = []
    seen = 0
    for i, n in enumerate(counts[:-1]):
        seen += n
        buckets.append((repr((1 << (i + shift)) * unit), float(seen)))
    buckets.append(("+Inf", float(seen + counts[-1])))
    return buckets


class MetricsServer:
    """The HTTP endpoint on `host`:`port` (a daemon thread of the supervisor). It has no
    authentication: any address but a loopback one exposes the store's figures to
    whoever reaches that interface."""

    def __init__(self, host: str, port: int, collector: StoreCollector) -> None:
        from prometheus_client import ProcessCollector, start_http_server

        from mqstore.workers.build_info import BuildInfoCollector

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.registry.register(BuildInfoCollector())
        ProcessCollector(registry=self.registry)  # process_* of the supervisor: cpu, rss, fds
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server: Any = server
        self._thread = thread
        self.host = host
        self.port = int(server.server_address[1])

    @property
    def url(self) -> str:
        """Where a scraper reads: `http://host:port/metrics` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
