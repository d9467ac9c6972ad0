"""One consumer pulling through the public `pull()`, against the put rate of the same run.

    python -m bench pull [--quick] [--duration S]

Issue 13's goal "consumers keep up": one consumer reading a store through
`StoreClient.pull()` reads at least as many messages per second as one producer puts
with ASYNC_FLUSH.

For each write-pool setting (on, off) a fresh ASYNC_FLUSH store is started
(`bench.store_run.running_store`) and:

1. **put**: one producer process puts for the configured time exactly as the put
   benchmark does (`bench.bench_put._put_producer`: `StoreClient.put(topic, 1 KiB body,
   tags="TagA", keys=<unique>)`, async), which fills the store; its rate is the goal's
   basis;
2. **pull**: once every message put is pullable (the queues' max offsets add up to the
   puts acknowledged; refused puts are counted in the put row, as the put benchmark
   does), one consumer process pulls every queue of the topic from offset 0 to the end
   seen then, round robin, `max_count` messages per call
   (32 is RocketMQ's default pullBatchSize), and checks it got every message with its
   1 KiB body. The pull variants (`PULL_MODES`: batch size, copied or zero-copy bodies)
   are measured on the same store one after another; the put is not re-run between them.
3. **peer**: one process reads the same consume-queue units and decodes each record with
   the reference decoder (`engine.record.decode` through `CommitLog.read`), as pulls did
   before they went through the record scanner: the same-run yardstick for the scanner.

Messages per second = messages returned / (end of the last pull - start of the first);
the latency is per `pull()` call.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.bench_put import run_puts
from bench.options import Options
from bench.procs import BenchError, FnProducer, Producer, RunResult, run_producers
from bench.report import (
    LOAD_COLUMN,
    RATE_COLUMNS,
    RESULTS,
    Column,
    Goal,
    Report,
    latency_columns,
)
from bench.store_run import BODY_BYTES, TOPIC, client_api, running_store

# (max_count, zero_copy) of each pull run: RocketMQ's default batch, a large one, and the
# default batch with bodies as views of the mapping (`pull(..., zero_copy=True)`)
PULL_MODES = ((32, False), (256, False), (32, True))
QUEUES = 4  # the store's default_topic_queue_nums, which the producer spreads over
READY_TIMEOUT_S = 120.0


def _wait_pullable(client: Any, expected: int) -> list[int]:
    """Every queue's max offset, once they add up to `expected` (dispatch has caught up)
    and the flusher is done (so that its writeback does not run during the first pull
    measured). Raises BenchError after READY_TIMEOUT_S."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        ends = [client.max_offset(TOPIC, q) for q in range(QUEUES)]
        pos = client.positions()
        if sum(ends) >= expected and pos["flushed"] == pos["committed"]:
            return ends
        if time.monotonic() > deadline:
            raise BenchError(f"only {sum(ends)} of {expected} messages pullable: {pos}")
        time.sleep(0.05)


class _RoundRobin:
    """The queues still to read, taken in turn, each from offset 0 to its end."""

    def __init__(self, ends: list[int]) -> None:
        self.ends = ends
        self.offsets = [0] * QUEUES
        self.live = [q for q in range(QUEUES) if ends[q] > 0]
        self._turn = 0

    def next_queue(self) -> int:
        q = self.live[self._turn % len(self.live)]
        self._turn += 1
        return q

    def advance(self, q: int, offset: int) -> None:
        """Queue `q` was read up to `offset`; past its end it leaves the turn."""
        self.offsets[q] = offset
        if offset >= self.ends[q]:
            self.live.remove(q)


def _pull_consumer(index: int, params: Mapping[str, Any]) -> Producer:
    """A `Producer` whose operation is one `pull()`: it returns the messages pulled."""
    StoreClient, _ = client_api()
    stack = contextlib.ExitStack()
    client = stack.enter_context(StoreClient.attach(params["store_dir"]))
    size = int(params["max_count"])
    zero_copy = bool(params["zero_copy"])
    pull = client.pull
    turns = _RoundRobin(params["ends"])
    offsets = turns.offsets

    def step() -> int:
        q = turns.next_queue()
        got = pull(TOPIC, q, offsets[q], size, zero_copy=zero_copy)
        msgs = got.messages
        if not msgs:
            raise BenchError(f"queue {q} at {offsets[q]}: {got.status.name}")
        for m in msgs:
            if len(m.body) != BODY_BYTES:
                raise BenchError(f"queue {q}: a body of {len(m.body)} bytes")
        turns.advance(q, got.next_offset)
        return len(msgs)

    def close() -> None:
        stack.close()
        if turns.live:
            raise BenchError(
                f"queues {turns.live} not read to their end: {offsets} of {turns.ends}"
            )

    return FnProducer(step, close)


def _reference_consumer(index: int, params: Mapping[str, Any]) -> Producer:
    """The peer: the same consume-queue units, each record decoded by the reference
    decoder (`CommitLog.read`: `engine.record.decode`), as pulls did before the scanner;
    no statuses, limits or filters. One operation reads `max_count` units of a queue."""
    from mqstore.engine.reader import StoreReader

    reader = StoreReader.open(params["store_dir"])
    size = int(params["max_count"])
    turns = _RoundRobin(params["ends"])
    offsets, ends = turns.offsets, turns.ends

    def step() -> int:
        q = turns.next_queue()
        cq = reader.queues.get(TOPIC, q)
        assert cq is not None
        n = 0
        for _qo, u in cq.units(offsets[q], min(size, ends[q] - offsets[q])):
            rec = reader.log.read(u.physical_offset).record
            if rec is None or not rec.crc_ok or len(rec.body) != BODY_BYTES:
                raise BenchError(f"queue {q}: no valid record at {u.physical_offset}")
            n += 1
        turns.advance(q, offsets[q] + n)
        return n

    return FnProducer(step, reader.close)


def pull_runs(root: Path, *, pool: bool, duration_s: float) -> list[RunResult]:
    """The put run, then each pull run, on one fresh store."""
    StoreClient, _ = client_api()
    name = f"async_{'pool' if pool else 'nopool'}"
    runs: list[RunResult] = []
    with running_store(root, name, sync=False, pool=pool) as store:
        work = store.store_dir.parent / "procs"
        params: dict[str, Any] = {"store_dir": str(store.store_dir)}
        # refused puts: in the table (`errors`), not pulled
        put = run_puts(store, f"put {name}", producers=1, duration_s=duration_s)
        put.extra.update({"op": "put", "pool": pool, "max_count": 1})
        runs.append(put)
        with StoreClient.attach(store.store_dir) as client:
            ends = _wait_pullable(client, put.messages)
        for size, zero_copy in PULL_MODES:
            params.update(ends=ends, max_count=size, zero_copy=zero_copy)
            label = f"pull {name} max_count={size}{' zero_copy' if zero_copy else ''}"
            r = run_producers(
                label, _pull_consumer, params, producers=1,
                duration_s=600.0, work_dir=work, body_bytes=BODY_BYTES,
                max_messages=sum(ends),
            )  # fmt: skip
            if r.messages != sum(ends):
                raise BenchError(f"{r.name}: pulled {r.messages} of {sum(ends)} messages")
            r.extra.update({"op": "pull", "pool": pool, "max_count": size, "zero_copy": zero_copy})
            runs.append(r)
        params.update(max_count=PULL_MODES[0][0])
        peer = run_producers(
            f"peer reference decode {name} max_count={PULL_MODES[0][0]}", _reference_consumer,
            params, producers=1, duration_s=600.0, work_dir=work, body_bytes=BODY_BYTES,
            max_messages=sum(ends),
        )  # fmt: skip
        peer.extra.update({"op": "peer", "pool": pool, "max_count": PULL_MODES[0][0]})
        runs.append(peer)
    return runs


COLUMNS = [
    Column("name", "run", "{}"),
    *RATE_COLUMNS,
    Column("messages", "messages"),
    Column("operations", "calls"),
    *latency_columns(" per call"),
    Column("us_per_msg_p50", "µs per message at the p50 call", "{:,.1f}"),
    Column("errors", "put errors", "{}"),
    LOAD_COLUMN,
]


def _committed_put_rate(pool: bool) -> tuple[float, str] | None:
    """The async 1-producer put rate in the committed put results (bench/results/
    put.json), with where it comes from; None when it is not there."""
    path = RESULTS / "put.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    name = f"async_{'pool' if pool else 'nopool'}"
    for row in doc["rows"]:
        if row.get("name") == name and row.get("producers") == 1:
            return float(row["msgs_per_s"]), f"put.json of {doc['git_commit']}, {doc['when_utc']}"
    return None


def goals(runs: Sequence[RunResult]) -> list[Goal]:
    """Per pool setting, each pull >= the put rate measured on its store in this run,
    and >= the committed put benchmark's rate (its basis when puts here were refused or
    slowed by a loaded machine)."""
    out = []
    for put in (r for r in runs if r.extra["op"] == "put"):
        pool = put.extra["pool"]
        on = "on" if pool else "off"
        committed = _committed_put_rate(pool)
        for r in runs:
            if r.extra["op"] != "pull" or r.extra["pool"] != pool:
                continue
            out.append(
                Goal(
                    f"{r.name} >= async 1-producer put (pool {on})",
                    r.msgs_per_s,
                    put.msgs_per_s,
                    "msgs/s",
                    basis=f"{put.name} = {put.msgs_per_s:,.0f} msgs/s, same store, same run",
                )
            )
            if committed is not None:
                out.append(
                    Goal(
                        f"{r.name} >= committed async 1-producer put (pool {on})",
                        r.msgs_per_s,
                        committed[0],
                        "msgs/s",
                        basis=committed[1],
                    )
                )
    return out


def _row(r: RunResult) -> dict[str, Any]:
    per_call = r.messages / r.operations if r.operations else 0.0
    return {
        **r.to_dict(),
        "label": r.name,
        "load_1m": r.extra.get("load_1m"),
        "errors": r.extra.get("errors"),
        "us_per_msg_p50": r.lat_p50_us / per_call if per_call else None,
    }


def benchmark(opts: Options) -> Report:
    """See the module doc."""
    duration = opts.duration_s if opts.duration_s is not None else (0.5 if opts.quick else 5.0)
    root = opts.work_root / "pull"
    root.mkdir(parents=True, exist_ok=True)
    runs: list[RunResult] = []
    for pool in (True, False):
        for r in pull_runs(root, pool=pool, duration_s=duration):
            opts.log(f"  {r.name:32} {r.msgs_per_s:12,.0f} msgs/s  p99 {r.lat_p99_us:9.1f} µs")
            runs.append(r)
    return Report(
        name="pull",
        title="One consumer pulling through pull(), against the async put rate (1 KiB bodies)",
        method=[
            f"Per pool setting a fresh ASYNC_FLUSH store; one producer process puts for "
            f"{duration:g} s (StoreClient.put, 1 KiB body, tag, a key unique to each message),"
            " which is the put rate; then one consumer process (StoreClient.pull) reads "
            "every message back, round robin over the topic's 4 queues.",
            "The pulls start once every message put is pullable (dispatch caught up), "
            "then read from queue offset 0 to each queue's end; the consumer checks every "
            "message was returned with its 1 KiB body.",
            "msgs/s = messages returned / (end of the last pull - start of the first); "
            "latency per pull() call; µs per message at the p50 call = p50 latency / "
            "messages per call, the figure least disturbed by other work on the machine.",
            "peer reference decode: one process reads the same consume-queue units and "
            "decodes each record with engine.record.decode (CommitLog.read), as pulls did "
            "before the record scanner; 32 units per operation.",
            "Goals: each pull against the put of its own store in this run, and against "
            "the committed put benchmark (bench/results/put.json).",
        ],
        columns=COLUMNS,
        rows=[_row(r) for r in runs],
        goals=goals(runs),
        extra={"duration_s": duration, "pull_modes": [list(m) for m in PULL_MODES]},
    )
