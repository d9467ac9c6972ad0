"""Reads of a running store, in the caller's process: `ClientReads`.

    reads = for_client(client)            # or ClientReads(store_dir, attached)
    r = reads.pull("orders", 0, offset, 32, tags="new || paid", wait_ms=2000)

Everything is read through one `engine.reader.StoreReader` that maps the files read-only
(nothing goes through another process). Its file sizes and limits come from the running
store itself (`AttachedStore`: the settings and geometry its supervisor sent at the last
attach), never from defaults or from the files present: with `--config` outside the store
directory, the consume-queue size is known before the first consume-queue file exists.
Two limits keep every answer durable and consistent, read from the control block at each
call:

- queue reads (`pull`, `min_offset`, `max_offset`, `query`) stop at the dispatcher's
  published position (`Positions.dispatched`): the consume queues and the index are complete
  below it, and it never passes what a crash cannot take back (the dispatcher follows
  the flushed position under SYNC_FLUSH, `Positions.readable_end` under ASYNC_FLUSH);
- physical reads (`get`, `get_by_msg_id`) stop at the flushed (SYNC_FLUSH) or committed
  (ASYNC_FLUSH) position.

New commit-log segments, consume-queue files, queues and index files are picked up by the
reader when a read runs off what it knows.

Long polling (`wait_ms`): when there is nothing to return, the pull sleeps in short steps
(`POLL_STEP_S`, growing to `POLL_MAX_STEP_S`) and retries as soon as the dispatched
position moved: a wake-up is one 8-byte read of shared memory, no core spins.

Consumer offsets go to `<store>/config/consumerOffset.json` (`engine.offsets`).

A topic or group name outside RocketMQ's rule (`engine.names`) raises ValueError with
the reason: no such queue or group can exist. An argument of the wrong type raises
TypeError naming it (`ipc.accepts.check_types`).

Thread-safe: one lock serialises the reader (a long poll does not hold it while it
sleeps). Not fork-safe: build a new one in a child.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Literal, NamedTuple, Protocol, overload

from mqstore.conf.settings import FlushDiskType, StoreSettings
from mqstore.engine.geometry import Geometry
from mqstore.engine.get_result import GetResult
from mqstore.engine.names import check_group, check_topic
from mqstore.engine.record_decode import DecodedRecord
from mqstore.ipc import control as c
from mqstore.ipc.accepts import BOOL, INT, OPT_INT, OPT_STR, STR, check_types
from mqstore.ipc.control_views import DispatchStats, Positions
from mqstore.ipc.read_results import GetMessageStatus, PullResult, PullViews
from mqstore.ipc.session import Attached

if TYPE_CHECKING:  # the reader stack is imported on a process's first read, not at attach
    from mqstore.engine.offsets import ConsumerOffsets
    from mqstore.engine.reader import StoreReader

POLL_STEP_S: Final = 0.0005
POLL_MAX_STEP_S: Final = 0.004
_EMPTY: Final = frozenset(
    (
        GetMessageStatus.OFFSET_OVERFLOW_ONE,
        GetMessageStatus.NO_MESSAGE_IN_QUEUE,
        GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
        GetMessageStatus.NO_MATCHED_MESSAGE,
    )
)


class AttachedStore(NamedTuple):
    """What reads need of a running store, as its supervisor gave it at the last attach
    (the attach reply's `settings` and `geometry`, with the control block it named)."""

    cb: c.ControlBlock
    settings: StoreSettings
    geometry: Geometry


class ClientReads:
    """The read API of one running store. See the module docstring.

    `attached()` returns the store as attached now (re-attaching after a supervisor
    restart, or raising SupervisorUnavailable); it is called at every read."""

    def __init__(
        self, store_dir: str | os.PathLike[str], attached: Callable[[], AttachedStore]
    ) -> None:
        self.store_dir = os.fspath(store_dir)
        self._attached = attached
        self._lock = threading.Lock()
        self._reader: StoreReader | None = None
        self._generation = -1
        self._deletions = 0
        self._limit = 0
        from mqstore.engine.offsets import ConsumerOffsets

        self._offsets: ConsumerOffsets = ConsumerOffsets(self.store_dir)

    # --- limits -------------------------------------------------------------------------

    def dispatched(self) -> int:
        """Where the consume queues and the index end (the dispatcher's position)."""
        return Positions(self._attached().cb).dispatched

    def durable(self) -> int:
        """Flushed under SYNC_FLUSH; under ASYNC_FLUSH what is in the files (committed
        with the pool on, published with it off): `Positions.readable_end`."""
        return _durable(self._attached())

    def _open(self, queue_reads: bool = True) -> StoreReader:
        """The reader of the store as attached now, its limit set for this read: queue
        reads stop at min(dispatched, durable), physical reads at durable. Reopened when
        the store restarted since it was opened (recovery may have cut files it maps)."""
        store = self._attached()
        durable = _durable(store)
        self._limit = min(Positions(store.cb).dispatched, durable) if queue_reads else durable
        gen = store.cb.generation
        if self._reader is not None and gen != self._generation:
            self._reader.close()
            self._reader = None
        deletions = DispatchStats(store.cb).topics_deleted  # topics deleted while running
        if self._reader is not None and deletions != self._deletions:
            self._reader.forget_deleted()
        self._deletions = deletions
        if self._reader is None:
            from mqstore.engine.reader import StoreReader

            self._reader = StoreReader(
                self.store_dir,
                store.geometry,
                max_offset_fn=lambda: self._limit,
                max_msgs_num_batch=store.settings.max_msgs_num_batch,
                limit_follows_dispatch=True,  # min(dispatched, durable)
            )
            self._generation = gen
        return self._reader

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def __enter__(self) -> ClientReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- queue reads --------------------------------------------------------------------

    def _pull_once(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tags: str | None,
        zero_copy: bool,
    ) -> PullResult | PullViews:
        with self._lock:
            reader = self._open()
            res = reader.get_messages(
                topic, queue_id, offset, max_count, tags=tags, zero_copy=zero_copy
            )
            return PullViews.of(res) if zero_copy else PullResult.of(res)

    @overload
    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
        zero_copy: Literal[False] = False,
    ) -> PullResult: ...
    @overload
    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
        zero_copy: Literal[True],
    ) -> PullViews: ...
    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
        zero_copy: bool = False,
    ) -> PullResult | PullViews:
        """Up to `max_count` messages of (topic, queue_id) from queue offset `offset`
        (RocketMQ's getMessage). `tags` ("a || b") keeps only those tags (the unit's tag
        code, then the record's TAGS). With `wait_ms` > 0, a pull that finds nothing
        (OFFSET_OVERFLOW_ONE, NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE, or only
        filtered-out messages) waits up to that long for new messages to be dispatched.
        With `zero_copy`, a `PullViews`: bodies are views of the mapped log, not copies
        (`engine.record.RecordView` says how long they live)."""
        check_types(
            "pull", topic=(topic, STR), queue_id=(queue_id, INT), offset=(offset, INT),
            max_count=(max_count, INT), tags=(tags, OPT_STR), wait_ms=(wait_ms, INT),
            zero_copy=(zero_copy, BOOL),
        )  # fmt: skip
        check_topic(topic)
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            seen = self.dispatched() if wait_ms > 0 else 0  # before the pull: no wake-up lost
            res = self._pull_once(topic, queue_id, offset, max_count, tags, zero_copy)
            if res.status not in _EMPTY or wait_ms <= 0:
                return res
            if res.status is GetMessageStatus.NO_MATCHED_MESSAGE:
                offset = res.next_offset  # filtered units are consumed: go on after them
                if offset < res.max_offset:
                    continue
            step = POLL_STEP_S
            while self.dispatched() == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return res
                time.sleep(min(step, left))
                step = min(step * 2, POLL_MAX_STEP_S)

    def pull_into(
        self, pulls: Sequence[tuple[str, int, int, int, tuple[object, object]]]
    ) -> list[GetResult]:
        """A group consumer's pulls (`ipc.consumer`, which checked its names), each
        (topic, queue id, offset, max count, into): `pull`s without the argument checks
        and the long poll, their messages lazy ones for `into` (owner, tag;
        `engine.pull`), the reader's results as they are. One lock and one look at the
        store's limits for them all (a pull's fixed cost is ~10 us, a quarter of it that
        look)."""
        with self._lock:
            reader = self._open()
            return [
                reader.get_messages(topic, queue_id, offset, max_count, into=into)
                for topic, queue_id, offset, max_count, into in pulls
            ]

    def min_offset(self, topic: str, queue_id: int) -> int:
        check_types("min_offset", topic=(topic, STR), queue_id=(queue_id, INT))
        check_topic(topic)
        with self._lock:
            return self._open().min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset after the last readable message (0 for an unknown queue)."""
        check_types("max_offset", topic=(topic, STR), queue_id=(queue_id, INT))
        check_topic(topic)
        with self._lock:
            return self._open().max_offset(topic, queue_id)

    def offset_for_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """RocketMQ's getOffsetInQueueByTime: the first queue offset stored in the
        millisecond `ts_ms`, else the closer of the last one stored before it and the first
        after it (a tie: the earlier), clamped to the queue's range."""
        check_types(
            "offset_for_time", topic=(topic, STR), queue_id=(queue_id, INT), ts_ms=(ts_ms, INT)
        )
        check_topic(topic)
        with self._lock:
            reader = self._open()
            got = reader.offset_for_time(topic, queue_id, ts_ms)
            return min(got, reader.max_offset(topic, queue_id))

    def query(
        self,
        topic: str,
        key: str,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_count: int = 32,
    ) -> list[DecodedRecord]:
        """Messages of `topic` with `key` (UNIQ_KEY or one of KEYS) stored in
        [begin_ms, end_ms] (default: now), through the index as RocketMQ's queryMessage,
        each re-checked to carry the key; physical offsets ascending."""
        check_types(
            "query", topic=(topic, STR), key=(key, STR), begin_ms=(begin_ms, INT),
            end_ms=(end_ms, OPT_INT), max_count=(max_count, INT),
        )  # fmt: skip
        check_topic(topic)
        from mqstore.engine.reader import MAX_TIMESTAMP_MS

        end = int(time.time() * 1000) if end_ms is None else min(end_ms, MAX_TIMESTAMP_MS)
        with self._lock:
            reader = self._open()
            return reader.query_by_key(topic, key, max_count, begin_ms, end)

    # --- physical reads -----------------------------------------------------------------

    def get(self, physical_offset: int) -> DecodedRecord | None:
        """The message at `physical_offset`; None when there is none (or not yet durable)."""
        check_types("get", physical_offset=(physical_offset, INT))
        with self._lock:
            return self._open(queue_reads=False).get_by_offset(physical_offset)

    def get_by_msg_id(self, msg_id: str) -> DecodedRecord | None:
        """The message with this offset message id; None when there is none. Raises
        ValueError for a malformed id."""
        check_types("get_by_msg_id", msg_id=(msg_id, STR))
        with self._lock:
            return self._open(queue_reads=False).get_by_msg_id(msg_id)

    # --- consumer offsets ---------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Persist the group's next offset in (topic, queue_id) (durable on return)."""
        check_types(
            "commit_offset", group=(group, STR), topic=(topic, STR), queue_id=(queue_id, INT),
            offset=(offset, INT),
        )  # fmt: skip
        check_group(group)
        check_topic(topic)
        self._offsets.commit(group, topic, queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset, -1 when it never committed one."""
        check_types(
            "committed_offset", group=(group, STR), topic=(topic, STR), queue_id=(queue_id, INT)
        )
        check_group(group)
        check_topic(topic)
        with self._lock:
            return self._offsets.committed(group, topic, queue_id)


def _durable(store: AttachedStore) -> int:
    sync_flush = store.settings.flush_disk_type is FlushDiskType.SYNC_FLUSH
    return Positions(store.cb).readable_end(sync_flush)


class LiveAttach(Protocol):
    """A client's session, as the reads follow it (`ipc.session.Session`, `StoreClient`)."""

    @property
    def store_dir(self) -> str: ...

    def live(self) -> Attached: ...


def for_client(client: LiveAttach) -> ClientReads:
    """Reads that follow `client`'s attach (re-attaching like a put does when the
    supervisor restarted): its control block and the settings and geometry the supervisor
    sent with it."""

    def attached() -> AttachedStore:
        a = client.live()  # raises SupervisorUnavailable
        return AttachedStore(a.cb, a.settings, a.geometry)

    return ClientReads(client.store_dir, attached)
