"""The supervisor's put figures: which clients are attached, what the gone ones put, and the
once-a-second samples that `mqstore status` turns into rates.

Each attached client counts its puts in its own control-block row (`workers.stats`); when
its connection closes, the row's counts move into `retired` so the totals never go back.
`tick` (the main loop, each pass) keeps the two latest samples at least a second apart
(and reads the rows only when a sample is due);
`scrape_totals` is what the metrics thread (`workers.metrics`) reads.

Not thread-safe except `scrape_totals`, which copies the attached rows first because the
main loop may attach or drop a client meanwhile.
"""

from __future__ import annotations

import time
from typing import Any

from mqstore.conf.settings import INFO, StoreSettings
from mqstore.ipc import control as c
from mqstore.workers import stats

SAMPLE_EVERY_S = 1.0


class PutSampling:
    """Attached client rows (row -> pid), the retired totals and the rate samples."""

    def __init__(self) -> None:
        self.clients: dict[int, int] = {}  # client row -> pid
        self.retired = stats.Totals()
        self.prev_sample: stats.Sample | None = None
        self.last_sample: stats.Sample | None = None

    def free_row(self) -> int | None:
        """The lowest client row no attach holds, or None when all are taken."""
        return next((i for i in range(c.MAX_CLIENTS) if i not in self.clients), None)

    def attach(self, cb: c.ControlBlock, row: int, pid: int) -> None:
        self.clients[row] = pid
        cb.clear_client(row)

    def retire(self, cb: c.ControlBlock, row: int) -> None:
        """A client's connection closed: keep its counts, free its row."""
        self.retired.add_row(cb.client_row(row))
        cb.clear_client(row)
        self.clients.pop(row, None)

    def totals(self, cb: c.ControlBlock) -> stats.Totals:
        return stats.live_totals(cb, self.clients).merged(self.retired)

    def scrape_totals(self, cb: c.ControlBlock | None) -> stats.Totals:
        """Put totals for a scrape (the metrics thread): rows copied first, as the main
        loop may attach or drop a client meanwhile."""
        if cb is None:
            return stats.Totals()
        rows = dict.fromkeys(list(self.clients), 0)
        return stats.live_totals(cb, rows).merged(self.retired)

    def tick(self, cb: c.ControlBlock) -> None:
        last = self.last_sample
        if last is not None and time.monotonic() - last.t < SAMPLE_EVERY_S:
            return  # not due: the sample would be dropped (every client row read for it)
        smp = stats.sample(cb, self.totals(cb))
        if self.last_sample is None or smp.t - self.last_sample.t >= SAMPLE_EVERY_S:
            self.prev_sample = self.last_sample or smp
            self.last_sample = smp

    def status_doc(
        self,
        cb: c.ControlBlock,
        store_dir: str,
        workers: list[tuple[int, str, int | None]],
        settings: StoreSettings,
    ) -> dict[str, Any]:
        """What `mqstore status` shows (`workers.stats.build`), rates from the samples;
        `workers` as (control-block index, name, last exit code)."""
        shown = {
            "flush_disk_type": settings.flush_disk_type.value,
            "transient_store_pool_enable": settings.transient_store_pool_enable,
            "segment_size_bytes": settings.segment_size_bytes,
            **{  # the reloadable ones as they are now (SIGHUP re-reads them)
                name: getattr(settings, name) for name, info in INFO.items() if info.reloadable
            },
        }
        totals = self.totals(cb)
        rows = stats.worker_docs(cb, workers)
        return stats.build(cb, store_dir, totals, self.prev_sample, rows, len(self.clients), shown)
