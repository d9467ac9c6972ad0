"""`StoreClient`: append to a running store from any process, and read it.

    with StoreClient.attach("/var/lib/mqstore") as client:
        r = client.put("orders", b"...", tags="new", keys=["o-17"])
        assert r.status is PutMessageStatus.PUT_OK

Attaching asks the supervisor (Unix socket) for the shared-memory names and layout and
maps them; from then on a put asks nobody. The client is three parts, each in its home:

- the session (`ipc.session.Session`): attach, fork handling and staleness; the public
  accessors the read side and asyncio use (`live_control_block`, `settings`,
  `geometry`, `flushed_position`, `positions`);
- the producer (`ipc.producer.Producer`, on `ipc.general_path` and `ipc.prepare`): `put`
  and `put_batch`, one C call in the common case, the general path in Python otherwise,
  the flush wait (`wait_flushed`) and the statistics row;
- the reads (`ipc.reads.ClientReads`, made per process on first use): `pull`, `get`,
  `query`, offsets.

Thread-safe: one lock per client (`_native.PutLock`, which the C call takes too)
serialises puts of its threads. Fork-safe: a forked child re-attaches on its first call.
If the supervisor stops or dies, the next call re-attaches or returns
SERVICE_NOT_AVAILABLE; it never writes into a stale pool.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Literal, overload

from mqstore.engine.record import DecodedRecord
from mqstore.ipc.producer import Producer
from mqstore.ipc.read_results import PullResult, PullViews
from mqstore.ipc.reads import ClientReads, for_client
from mqstore.ipc.session import check_attach_types


class StoreClient(Producer):
    """A producer attached to one running store. Create with `StoreClient.attach`."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        raise_on_status: bool = False,
    ) -> None:
        check_attach_types("attach", store_dir, topic_queue_nums, timeout_s)
        super().__init__(store_dir, timeout_s, topic_queue_nums, raise_on_status)
        self._reads_of_pid: tuple[int, ClientReads] | None = None  # made on first read
        self._attach()

    @classmethod
    def attach(
        cls,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        raise_on_status: bool = False,
    ) -> StoreClient:
        """Attach to the supervisor of `store_dir`. Raises channel.SupervisorUnavailable
        when none runs. `topic_queue_nums` overrides the queue count per topic used to
        spread puts with `queue_id=None` (default: `default_topic_queue_nums`).
        `raise_on_status`: puts raise `ipc.results.PutError` (its status family's
        subclass) for any status but PUT_OK, instead of returning it."""
        return cls(
            store_dir,
            topic_queue_nums=topic_queue_nums,
            timeout_s=timeout_s,
            raise_on_status=raise_on_status,
        )

    def _closing(self) -> None:
        reads = self._reads_of_pid
        if reads is not None and reads[0] == os.getpid():
            reads[1].close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # getattr: __del__ runs after an __init__ that raised (a TypeError before the
        # session existed, a failed attach) too.
        if not getattr(self, "_closed", True) and getattr(self, "_attached", False):
            with contextlib.suppress(Exception):
                self.close()

    # --- reads (ipc.reads.ClientReads, in this process) and consumer offsets -------------

    def _read_side(self) -> ClientReads:
        """This process's `ClientReads` (made on first use, again after a fork)."""
        got = self._reads_of_pid
        if got is None or got[0] != os.getpid():
            got = (os.getpid(), for_client(self))
            self._reads_of_pid = got
        return got[1]

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
        """Up to `max_count` messages of (topic, queue_id) from queue offset `offset`; see
        `ipc.reads.ClientReads.pull` (statuses, `tags="a || b"`, long polling, and
        `zero_copy`: bodies as views of the mapped log)."""
        reads = self._read_side()
        if zero_copy:
            return reads.pull(
                topic, queue_id, offset, max_count, tags=tags, wait_ms=wait_ms, zero_copy=True
            )
        return reads.pull(topic, queue_id, offset, max_count, tags=tags, wait_ms=wait_ms)

    def get(self, physical_offset: int) -> DecodedRecord | None:
        """The message at `physical_offset` (None when there is none, or not durable)."""
        return self._read_side().get(physical_offset)

    def get_by_msg_id(self, msg_id: str) -> DecodedRecord | None:
        """The message with this offset message id (None when there is none)."""
        return self._read_side().get_by_msg_id(msg_id)

    def query(
        self,
        topic: str,
        key: str,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_count: int = 32,
    ) -> list[DecodedRecord]:
        """Messages of `topic` carrying `key`, through the index (`ClientReads.query`)."""
        return self._read_side().query(topic, key, begin_ms, end_ms, max_count)

    def offset_for_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset stored at or after `ts_ms`."""
        return self._read_side().offset_for_time(topic, queue_id, ts_ms)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._read_side().min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._read_side().max_offset(topic, queue_id)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Persist the group's next offset (config/consumerOffset.json, durable on return)."""
        self._read_side().commit_offset(group, topic, queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset, -1 when it never committed one."""
        return self._read_side().committed_offset(group, topic, queue_id)
