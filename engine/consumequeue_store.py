"""Every consume queue of a store directory, keyed by (topic, queue id) (spec §3).

`consumequeue/<topic>/<queueId>/` holds one queue (`engine.consumequeue`). The store
opens them all at `load()` (RocketMQ's load: directories that do not name a queue are
skipped), creates new ones for the dispatcher (`find_or_create`), opens those another
process created for readers (`get`), and runs recovery, flushes and checks over all.

Not thread-safe: one writer process (the dispatcher) per store.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from mqstore.engine import fileio
from mqstore.engine.consumequeue import ConsumeQueue, QueueKey
from mqstore.engine.consumequeue_files import CONSUME_QUEUE_DIR, cq_file_size, queue_dirs
from mqstore.engine.findings import Finding
from mqstore.engine.names import topic_problem
from mqstore.engine.segment import Segment
from mqstore.engine.segment_queue import SegmentQueue


class ConsumeQueueStore:
    """Every consume queue of a store directory, keyed by (topic, queue id)."""

    def __init__(
        self, store_dir: str | os.PathLike[str], file_size_bytes: int, *, read_only: bool = False
    ) -> None:
        """The store of queues under `<store_dir>/consumequeue`, files of `file_size_bytes`
        rounded up as RocketMQ does (`cq_file_size`); `load()` next."""
        self.store_dir = os.fspath(store_dir)
        self.root = os.path.join(self.store_dir, CONSUME_QUEUE_DIR)
        self.file_size_bytes = cq_file_size(file_size_bytes)
        self.read_only = read_only
        self._queues: dict[QueueKey, ConsumeQueue] = {}

    def load(self) -> ConsumeQueueStore:
        """Open every `consumequeue/<topic>/<queueId>/` whose topic is a valid name and
        whose queue id an int written as Java writes it (others are skipped, as
        RocketMQ's load) and return the store. Raises SegmentSizeError, StoreIOError."""
        for topic, name, _qdir in queue_dirs(self.store_dir):
            try:
                qid = int(name)
            except ValueError:
                continue
            if str(qid) == name and topic_problem(topic) is None:
                self._open_queue(topic, qid)
        return self

    def _open_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        qdir = os.path.join(self.root, topic, str(queue_id))
        files = SegmentQueue(qdir, self.file_size_bytes, read_only=self.read_only)
        cq = self._queues[(topic, queue_id)] = ConsumeQueue(files, topic, queue_id).load()
        return cq

    def forget(self, topic: str) -> int:
        """Close and drop every queue of `topic` (deleted while the store runs: its
        directory is gone, `get` / `find_or_create` start afresh). Returns how many."""
        keys = [k for k in self._queues if k[0] == topic]
        for k in keys:
            self._queues.pop(k).close()
        return len(keys)

    def __len__(self) -> int:
        return len(self._queues)

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def keys(self) -> list[QueueKey]:
        return sorted(self._queues)

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue, opening it if another process created it since (read-only)."""
        cq = self._queues.get((topic, queue_id))
        if cq is None and self.read_only and topic_problem(topic) is None and queue_id >= 0:
            qdir = os.path.join(self.root, topic, str(queue_id))
            if os.path.isdir(qdir):
                cq = self._open_queue(topic, queue_id)
        return cq

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue of (topic, queue id), created empty if new. Writer only.
        Raises ValueError for a name outside RocketMQ's rule (`engine.names`): no bad
        name ever becomes a directory, whoever wrote the record."""
        cq = self._queues.get((topic, queue_id))
        if cq is not None:
            return cq
        if self.read_only:
            raise PermissionError(f"{self.root}: opened read-only")
        why = topic_problem(topic)
        if why is not None or queue_id < 0:
            why = why or "a negative queue id"
            raise ValueError(f"({topic!r}, {queue_id}) cannot name a consume queue: {why}")
        fileio.makedirs(os.path.join(self.root, topic, str(queue_id)))
        return self._open_queue(topic, queue_id)

    def recover(self) -> int:
        """`recover()` every queue; the max of their `max_physical_offset` (-1: none)."""
        return max((cq.recover() for cq in self._queues.values()), default=-1)

    def max_physical_offset(self) -> int:
        return max((cq.max_physical_offset for cq in self._queues.values()), default=-1)

    def truncate_dirty(self, physical_offset: int) -> dict[QueueKey, int]:
        """`truncate_dirty` on every queue; units dropped per queue that lost any."""
        out: dict[QueueKey, int] = {}
        for key, cq in self._queues.items():
            if cq.max_physical_offset > physical_offset or cq.max_physical_offset < 0:
                n = cq.truncate_dirty(physical_offset)
                if n:
                    out[key] = n
        return out

    def correct_min_offsets(self, log_min_offset: int) -> None:
        for cq in self._queues.values():
            cq.correct_min_offset(log_min_offset)

    def queue_offset_table(self) -> dict[QueueKey, int]:
        """(topic, queue id) -> next queue offset (`max_offset()`), RocketMQ's
        recoverTopicQueueTable: what the appender continues from after recovery."""
        return {k: cq.max_offset() for k, cq in sorted(self._queues.items())}

    def flush(self, least_pages: int) -> int:
        """One `flush(least_pages)` per queue; total bytes advanced. Raises StoreIOError."""
        return sum(cq.flush(least_pages) for cq in self._queues.values())

    def flush_all(self) -> int:
        return sum(cq.flush_all() for cq in self._queues.values())

    def flush_plan(self, least_pages: int) -> list[tuple[SegmentQueue, Segment, int]]:
        """Every queue's `SegmentQueue.flush_plan(least_pages)`: what a flush in another
        thread forces (`workers.cq_flusher`), each with its queue for `note_flushed`."""
        return [
            (cq.queue, seg, pos)
            for cq in self._queues.values()
            for seg, pos in cq.queue.flush_plan(least_pages)
        ]

    def close(self) -> None:
        for cq in self._queues.values():
            cq.close()
        self._queues.clear()

    def check(self) -> list[Finding]:
        out: list[Finding] = []
        for cq in self._queues.values():
            out.extend(cq.check())
        return out
