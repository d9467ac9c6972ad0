"""Delayed-message runs against a real store, shared by the runtime suite (short) and the
reliability suite (10,000 messages, the supervisor SIGKILLed): put messages with random
delay levels, read their real topic until each has arrived, and judge the arrivals."""

from __future__ import annotations

import bisect
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from mqstore import PutMessageStatus, StoreClient
from mqstore.conf.settings import parse_delay_levels
from mqstore.engine.record import DecodedRecord
from tests.runtime.harness import Store, wait_for

LEVELS = "1s 2s 3s 4s 5s"
DELAYS_MS = parse_delay_levels(LEVELS)
TOPIC = "Delayed"
QUEUES = 4
LATE_MS = 200  # the goal (issue 25's): delivered at most this long after due, by a
# scheduler that gets the CPU: the time it waited for one is added (`SchedulerWaits`)
CONFIG = {"message_delay_level": LEVELS, "default_topic_queue_nums": QUEUES}
# Longer levels for a run with a restart in it: a supervisor's boot under load takes
# seconds, and most messages should fall due after it is back.
LONG_LEVELS = "5s 10s 15s 20s 30s"


@dataclass
class Sent:
    """What was put: body -> (due ms, level, schedule record's store time)."""

    due: dict[bytes, tuple[int, int, int]] = field(default_factory=dict)


def put_delayed(
    client: StoreClient, n: int, rng: random.Random, sent: Sent, delays: tuple[int, ...] = DELAYS_MS
) -> None:
    """`n` messages to TOPIC, random levels 1-5, in batches of 50 (each message its own
    level and queue); only PUT_OK batches count as sent."""
    start = len(sent.due)
    for i in range(start, start + n, 50):
        batch: list[dict[str, object]] = [
            {
                "topic": TOPIC, "body": f"m{j}".encode(), "queue_id": j % QUEUES,
                "delay_level": rng.randint(1, len(delays)), "tags": "d",
            }
            for j in range(i, min(i + 50, start + n))
        ]  # fmt: skip
        results = client.put_batch(batch)
        if results[0].status is not PutMessageStatus.PUT_OK:
            raise AssertionError(f"put refused: {results[0]}")
        for m, r in zip(batch, results, strict=True):
            level = m["delay_level"]
            body = m["body"]
            assert isinstance(level, int) and isinstance(body, bytes)
            sent.due[body] = (r.store_timestamp + delays[level - 1], level, r.store_timestamp)


def collect(store: Store, sent: Sent, timeout_s: float) -> dict[bytes, list[DecodedRecord]]:
    """Read TOPIC's queues until every sent message arrived, then one second more (to see
    a duplicate come late)."""
    got: dict[bytes, list[DecodedRecord]] = defaultdict(list)
    offsets = [0] * QUEUES

    def read() -> bool:
        with StoreClient.attach(store.path) as client:
            for q in range(QUEUES):
                while True:
                    res = client.pull(TOPIC, q, offsets[q], 256)
                    if not res.messages:
                        break
                    for m in res.messages:
                        got[bytes(m.body)].append(m)
                    offsets[q] = res.next_offset
        return len(got) >= len(sent.due)

    wait_for(read, timeout_s, f"{len(sent.due)} delayed messages to arrive")
    time.sleep(1.0)  # a duplicate would come within a round or two
    read()
    return got


@dataclass
class Judged:
    missing: list[bytes]
    twice: list[bytes]
    early: list[tuple[bytes, int]]
    late: list[tuple[bytes, int]]  # due outside `excused`, later than LATE_MS
    lateness_ms: list[int]  # every message's, outside `excused`
    excused_late_max_ms: int


def _run_queue_wait_ns(pid: int) -> int:
    """The run-queue wait of all of `pid`'s threads (schedstat's second field), ns."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return total


class SchedulerWaits:
    """The scheduler process's run-queue wait over time, sampled every few ms by a thread:
    a delivery later than LATE_MS is the scheduler's only past the time it spent waiting
    for a CPU between the due time and the re-put (at load 30 one came 213 ms late).
    The kernel adds a wait when it ends, so a wait that held a re-put up is counted by
    the re-put's time; the window is widened to the samples around it (a sampler starved
    itself widens it, never narrows it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.at_ms: list[int] = []
        self.wait_ms: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.at_ms.append(time.time_ns() // 1_000_000)
        self.wait_ms.append(_run_queue_wait_ns(self.pid) // 1_000_000)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def between(self, start_ms: int, end_ms: int) -> int:
        """Run-queue wait (ms) of the scheduler from before `start_ms` to after `end_ms`."""
        if not self.at_ms:
            return 0
        i = max(0, bisect.bisect_right(self.at_ms, start_ms) - 1)
        j = min(len(self.at_ms) - 1, bisect.bisect_left(self.at_ms, end_ms))
        return max(0, self.wait_ms[j] - self.wait_ms[i])


@contextmanager
def scheduler_waits(store: Store) -> Iterator[SchedulerWaits]:
    """Sample the store's scheduler's run-queue wait while the block runs."""
    pid = next(w["pid"] for w in store.status()["workers"] if w["name"] == "scheduler")
    waits = SchedulerWaits(pid)
    waits.start()
    try:
        yield waits
    finally:
        waits.stop()


def judge(
    sent: Sent,
    got: dict[bytes, list[DecodedRecord]],
    excused: tuple[int, int] = (0, 0),
    waits: SchedulerWaits | Sequence[SchedulerWaits] = (),
) -> Judged:
    """Each message once, in its queue, never before due, at most LATE_MS after (plus
    the run-queue wait in between of the scheduler in `waits`: each one sampled, across
    a restart) unless due within `excused` (ms: the supervisor was down, or catching
    up)."""
    if isinstance(waits, SchedulerWaits):
        waits = (waits,)
    missing = [b for b in sent.due if b not in got]
    twice = [b for b, ms in got.items() if len(ms) > 1]
    early: list[tuple[bytes, int]] = []
    late: list[tuple[bytes, int]] = []
    lateness: list[int] = []
    excused_max = 0
    for body, (due, level, _stored) in sent.due.items():
        for m in got.get(body, []):
            lag = m.store_timestamp - due
            assert m.properties["DELAY"] == str(level) and m.properties["REAL_TOPIC"] == TOPIC
            assert m.queue_id == int(m.properties["REAL_QID"]) and m.tags == "d"
            if lag < 0:
                early.append((body, lag))
            elif excused[0] <= due <= excused[1]:
                excused_max = max(excused_max, lag)
            else:
                lateness.append(lag)
                starved = sum(w.between(due, m.store_timestamp) for w in waits)
                if lag > LATE_MS + starved:
                    late.append((body, lag))
    return Judged(missing, twice, early, late, lateness, excused_max)


def percentile(xs: list[int], p: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] if s else 0


def scheduler_ready(store: Store) -> None:
    """Until the store's scheduler delivers (booted, attached, its progress checked): one
    level-1 message to a topic of its own, awaited. The 200 ms goal is a running
    scheduler's; a start's first second is the supervisor's boot."""
    store.wait_workers_running()
    with StoreClient.attach(store.path) as client:
        r = client.put("DelayProbe", b"probe", delay_level=1, queue_id=0)
        assert r.status is PutMessageStatus.PUT_OK, r
        wait_for(lambda: client.max_offset("DelayProbe", 0) > 0, 60, "the scheduler")
