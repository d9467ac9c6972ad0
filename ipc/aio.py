"""`AsyncStoreClient`: the store client for asyncio programs.

    async with AsyncStoreClient.attach("/var/lib/mqstore") as store:
        r = await store.put("orders", b"...", tags="new")
        got = await store.pull("orders", r.queue_id, 0, 32)

The event loop never blocks on the store. A put runs on one of `concurrency` threads
(default 8) of the client's own, each with its own blocking `StoreClient`; the loop
awaits it. A thread that waits for the flush acknowledgement (SYNC_FLUSH with
`wait_store`) sleeps in the kernel without the GIL, so up to `concurrency` puts of one
client wait for the same group-committed fsync while the loop keeps running; more
concurrent awaits queue for a thread. Pulls run on one more thread with a reader of
their own: `engine.reader.StoreReader` (consume queues) when the store runs a
dispatcher, else `ipc.logtail.LogQueues` (an in-memory queue index built from the
log), both limited to what is durable (flushed under SYNC_FLUSH, committed under ASYNC).

An acknowledgement means exactly what the blocking client's does (docs/durability.md):
the same code runs. Statuses, never exceptions, for expected outcomes.

Why threads and not the loop itself: the flusher wakes sync waiters through a futex in
the control block (`ipc.futex`), which no event loop can poll. A loop-native wait needs
a hook in `ipc/client.py` that splits a sync put into "reserve, copy and ring the
doorbell" (returning the record's end) and "wait for flushed >= end"; one waiter thread
per client could then sleep on the flush epoch and settle every pending future with
`loop.call_soon_threadsafe`, with no thread per in-flight put.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from engine.reader import GetResult, StoreReader
from engine.record import Message
from ipc import channel
from ipc.client import StoreClient
from ipc.filler import is_filler
from ipc.logtail import LogQueues
from ipc.results import PutResult

DEFAULT_CONCURRENCY: Final = 8
# How `pull` reads: "auto" (consume queues when the store runs a dispatcher, else the
# log), "consume_queues" (engine.reader.StoreReader), "log" (ipc.logtail.LogQueues).
READ_PATHS: Final = ("auto", "consume_queues", "log")


class _Attach:
    """What `AsyncStoreClient.attach` returns: await it, or use it with `async with`."""

    def __init__(self, store_dir: str | os.PathLike[str], kwargs: dict[str, Any]) -> None:
        self._store_dir = store_dir
        self._kwargs = kwargs
        self._client: AsyncStoreClient | None = None

    async def _open(self) -> AsyncStoreClient:
        client = AsyncStoreClient(self._store_dir, **self._kwargs)
        try:
            await client._start()
        except BaseException:
            await client.close()
            raise
        return client

    def __await__(self) -> Generator[Any, None, AsyncStoreClient]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncStoreClient:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()


class AsyncStoreClient:
    """A producer and consumer of one running store for asyncio. See the module doc."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        concurrency: int = DEFAULT_CONCURRENCY,
        read_path: str = "auto",
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if read_path not in READ_PATHS:
            raise ValueError(f"read_path must be one of {READ_PATHS}")
        self._read_path = read_path
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self._topic_queue_nums = dict(topic_queue_nums or {})
        self._timeout_s = timeout_s
        self._puts = ThreadPoolExecutor(concurrency, thread_name_prefix="mqstore-aio-put")
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="mqstore-aio-read")
        self._local = threading.local()
        self._clients: list[StoreClient] = []
        self._clients_lock = threading.Lock()
        self._main: StoreClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: StoreReader | None = None
        self._log_queues: LogQueues | None = None
        self._dispatcher = False
        self._sync = True
        self._closed = False

    @classmethod
    def attach(
        cls,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        concurrency: int = DEFAULT_CONCURRENCY,
        read_path: str = "auto",
    ) -> _Attach:
        """`async with AsyncStoreClient.attach(dir) as store:` or
        `store = await AsyncStoreClient.attach(dir)` (then `await store.close()`).
        `concurrency`: puts in flight at once (threads, one StoreClient each).
        `read_path`: see READ_PATHS. Raises channel.SupervisorUnavailable when no
        supervisor runs."""
        return _Attach(
            store_dir,
            {
                "topic_queue_nums": topic_queue_nums,
                "timeout_s": timeout_s,
                "concurrency": concurrency,
                "read_path": read_path,
            },
        )

    def _new_client(self) -> StoreClient:
        client = StoreClient.attach(
            self.store_dir, topic_queue_nums=self._topic_queue_nums, timeout_s=self._timeout_s
        )
        with self._clients_lock:
            self._clients.append(client)
        return client

    def _thread_client(self) -> StoreClient:
        client: StoreClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self._new_client()
            self._local.client = client
        return client

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        doc = await loop.run_in_executor(
            self._reads, lambda: channel.request(self.store_dir, {"op": "status"})
        )
        running = any(w.get("name") == "dispatcher" for w in doc.get("workers", ()))
        self._dispatcher = (
            running if self._read_path == "auto" else self._read_path == "consume_queues"
        )
        self._sync = doc.get("settings", {}).get("flush_disk_type", "SYNC_FLUSH") == "SYNC_FLUSH"
        self._main = await loop.run_in_executor(self._reads, self._new_client)

    async def close(self) -> None:
        """Wait for the puts under way, detach every client, stop the threads."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._puts.shutdown, True)
        await loop.run_in_executor(self._reads, self._close_readers)
        self._reads.shutdown(wait=True)
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    async def __aenter__(self) -> AsyncStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- puts -----------------------------------------------------------------------------

    def _live(self) -> asyncio.AbstractEventLoop:
        if self._closed or self._loop is None:
            raise RuntimeError("the AsyncStoreClient is closed")
        return self._loop

    def _put(self, topic: str, body: bytes, kw: dict[str, Any]) -> PutResult:
        return self._thread_client().put(topic, body, **kw)

    def _put_batch(self, msgs: list[Mapping[str, Any] | Message], wait: bool) -> list[PutResult]:
        return self._thread_client().put_batch(msgs, wait_store=wait)

    async def put(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        wait_store: bool = True,
    ) -> PutResult:
        """`StoreClient.put`, awaited: under SYNC_FLUSH with `wait_store` it returns once
        the record is on disk; the loop runs meanwhile."""
        kw = {
            "tags": tags,
            "keys": keys,
            "properties": properties,
            "queue_id": queue_id,
            "wait_store": wait_store,
        }
        return await self._live().run_in_executor(self._puts, self._put, topic, body, kw)

    async def put_batch(
        self, messages: Iterable[Mapping[str, Any] | Message], *, wait_store: bool = True
    ) -> list[PutResult]:
        """`StoreClient.put_batch`, awaited (all or nothing, one segment)."""
        msgs = list(messages)
        return await self._live().run_in_executor(self._puts, self._put_batch, msgs, wait_store)

    # --- reads ----------------------------------------------------------------------------

    def _limit(self) -> int:
        assert self._main is not None
        pos = self._main.positions()
        return pos["flushed"] if self._sync else pos["committed"]

    def _pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult:
        if self._dispatcher:
            if self._reader is None:
                self._reader = StoreReader.open(
                    self.store_dir, max_offset_fn=self._limit, is_filler=is_filler
                )
            return self._reader.get_messages(topic, queue_id, offset, max_count)
        if self._log_queues is None:
            self._log_queues = LogQueues(self.store_dir)
        self._log_queues.catch_up(self._limit())
        return self._log_queues.get_messages(topic, queue_id, offset, max_count)

    def _close_readers(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._log_queues is not None:
            self._log_queues.close()
            self._log_queues = None

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int = 32) -> GetResult:
        """Up to `max_count` messages of (topic, queue id) from queue offset `offset`
        (`engine.reader.GetResult`: status, next_offset, min/max offsets, messages).
        Only what is durable is returned: flushed (SYNC_FLUSH) or committed (ASYNC)."""
        loop = self._live()
        return await loop.run_in_executor(
            self._reads, self._pull, topic, queue_id, offset, max_count
        )

    async def positions(self) -> dict[str, int]:
        """The control block's positions (reserved, published, committed, flushed)."""
        loop = self._live()
        main = self._main
        assert main is not None
        return await loop.run_in_executor(self._reads, main.positions)
