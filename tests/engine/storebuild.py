"""Small stores written with the engine's CommitLog, for dispatch, reader and recovery
tests: a clock that moves 10 ms per message, several topics and queues, tags and keys."""

from __future__ import annotations

from pathlib import Path

from mqstore.engine.commitlog import AppendResult, CommitLog
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.indexservice import IndexService
from mqstore.engine.record import Message
from mqstore.engine.segment import ClockMs

SEGMENT = 4096
CQ_FILE = 200  # 10 units per file
SLOTS, ENTRIES = 16, 64
T0 = 1_700_000_000_000


class StepClock:
    def __init__(self, start: int = T0, step: int = 10) -> None:
        self.ms = start - step
        self.step = step

    def __call__(self) -> int:
        self.ms += self.step
        return self.ms


def message(i: int, topic: str = "T", queue_id: int = 0, **kw: object) -> Message:
    props = {"TAGS": f"tag{i % 3}", "KEYS": f"key{i} common", "UNIQ_KEY": f"U{i:08d}"}
    return Message(
        topic,
        f"body-{i}".encode() * 5,
        props,
        queue_id=queue_id,
        born_timestamp=T0 - 5,
        born_host="10.0.0.1:5000",
        store_host="10.0.0.2:10911",
        **kw,  # type: ignore[arg-type]
    )


def open_log(store: Path, clock: ClockMs | None = None, size: int = SEGMENT) -> CommitLog:
    return CommitLog.open(store / "commitlog", size, clock_ms=clock or StepClock())


def write_messages(
    log: CommitLog, n: int, *, queues: int = 2, start: int = 0
) -> list[AppendResult]:
    out = []
    for i in range(start, start + n):
        res = log.append(message(i, queue_id=i % queues))
        assert res.ok, res
        out.append(res)
    return out


def build_store(store: Path, n: int, *, queues: int = 2) -> tuple[list[AppendResult], int]:
    """Write `n` messages, dispatch them all, flush and close everything. Returns the
    append results and the log's end."""
    log = open_log(store)
    results = write_messages(log, n, queues=queues)
    end = log.max_offset()
    cqs = ConsumeQueueStore(store, CQ_FILE)
    idx = IndexService(store, SLOTS, ENTRIES)
    res = Dispatcher(log, cqs, idx).dispatch(0, end)
    assert res.next_offset == end and res.units_written == n
    log.queue.flush_all()
    cqs.flush_all()
    idx.flush()
    log.close()
    cqs.close()
    idx.close()
    return results, end
