"""`AsyncStoreClient`: the store client for asyncio programs.

    async with AsyncStoreClient.attach("/var/lib/mqstore") as store:
        r = await store.put("orders", b"...", tags="new")
        got = await store.pull("orders", r.queue_id, 0, 32)

The event loop never blocks on the store:

* **Reserve and copy** (microseconds, but the reservation may wait for a pool buffer or
  the next segment file up to `os_page_cache_busy_timeout_ms`) run on one thread of the
  client's own, through a blocking `StoreClient` with `wait_store=False`. Puts of one
  client are serialised there, as a `StoreClient`'s threads are.
* **The flush wait** (SYNC_FLUSH with `wait_store`) is on the loop: the client owns a
  datagram socket registered with `loop.add_reader`; each put sends the flusher one
  request ("answer when flushed up to my end") and awaits a future. Every reply carries
  the flushed offset and settles every pending put it covers, so hundreds of concurrent
  awaits share one group-committed fsync. A watchdog on the loop re-sends requests a
  restarted flusher lost, settles puts the control block shows flushed, and answers
  FLUSH_DISK_TIMEOUT after `sync_flush_timeout_ms` and FLUSH_DISK_FAILED once the store
  is read-only, as the blocking client does.
* **Pulls** run on a second thread with a reader of their own: `engine.reader.StoreReader`
  (consume queues) when the store runs a dispatcher, else `ipc.logtail.LogQueues` (an
  in-memory queue index built from the log), both limited to what is durable.

The acknowledgement means what the blocking client's does (docs/durability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from engine.reader import GetResult, StoreReader
from engine.record import Message
from ipc import channel
from ipc import control as c
from ipc.client import StoreClient
from ipc.filler import is_filler
from ipc.logtail import LogQueues
from ipc.results import PutMessageStatus, PutResult

_WATCH_S: Final = 0.05
_RESEND_S: Final = 0.5

OK: Final = PutMessageStatus.PUT_OK


class _Waiter:
    __slots__ = ("end", "fut", "sent_at", "started")

    def __init__(self, end: int, fut: asyncio.Future[tuple[PutMessageStatus, str]]) -> None:
        self.end = end
        self.fut = fut
        self.started = time.monotonic()
        self.sent_at = 0.0


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
    ) -> None:
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self._topic_queue_nums = dict(topic_queue_nums or {})
        self._timeout_s = timeout_s
        self._puts = ThreadPoolExecutor(1, thread_name_prefix="mqstore-aio-put")
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="mqstore-aio-read")
        self._client: StoreClient | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[int, _Waiter] = {}
        self._rid = 0
        self._watchdog: asyncio.Task[None] | None = None
        self._reader: StoreReader | None = None
        self._log_queues: LogQueues | None = None
        self._dispatcher = False
        self._closed = False

    @classmethod
    def attach(
        cls,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
    ) -> _Attach:
        """`async with AsyncStoreClient.attach(dir) as store:` or
        `store = await AsyncStoreClient.attach(dir)` (then `await store.close()`).
        Raises channel.SupervisorUnavailable when no supervisor runs."""
        return _Attach(store_dir, {"topic_queue_nums": topic_queue_nums, "timeout_s": timeout_s})

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._client = await loop.run_in_executor(
            self._puts,
            lambda: StoreClient.attach(
                self.store_dir, topic_queue_nums=self._topic_queue_nums, timeout_s=self._timeout_s
            ),
        )
        doc = await loop.run_in_executor(
            self._reads, lambda: channel.request(self.store_dir, {"op": "status"})
        )
        self._dispatcher = any(w.get("name") == "dispatcher" for w in doc.get("workers", ()))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.bind("")  # autobind: an abstract address of our own
        sock.setblocking(False)
        self._sock = sock
        loop.add_reader(sock.fileno(), self._on_replies)
        self._watchdog = loop.create_task(self._watch(), name="mqstore-aio-watchdog")

    async def close(self) -> None:
        """Settle pending waits (SERVICE_NOT_AVAILABLE), detach, stop the threads."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        for w in self._waiters.values():
            if not w.fut.done():
                w.fut.set_result((PutMessageStatus.SERVICE_NOT_AVAILABLE, "the client was closed"))
        self._waiters.clear()
        loop = asyncio.get_running_loop()
        if self._client is not None:
            await loop.run_in_executor(self._puts, self._client.close)
        await loop.run_in_executor(self._reads, self._close_readers)
        self._puts.shutdown(wait=True)
        self._reads.shutdown(wait=True)

    async def __aenter__(self) -> AsyncStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- flush waits on the loop ----------------------------------------------------------

    def _settle(self, flushed: int, status: PutMessageStatus, reason: str) -> None:
        done = [rid for rid, w in self._waiters.items() if status is not OK or w.end <= flushed]
        for rid in done:
            w = self._waiters.pop(rid)
            if not w.fut.done():
                w.fut.set_result((status, reason))

    def _on_replies(self) -> None:
        sock = self._sock
        assert sock is not None
        best = -1
        failed = False
        while True:
            try:
                data = sock.recv(64)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            _rid, flushed, status = channel.FLUSH_REP.unpack_from(data)
            if status == channel.REPLY_OK:
                best = max(best, flushed)
            else:
                failed = True
        if failed:
            self._settle(
                0, PutMessageStatus.FLUSH_DISK_FAILED, "fsync failed: the store is read-only"
            )
        elif best >= 0:
            self._settle(best, OK, "")

    def _send(self, rid: int, w: _Waiter) -> None:
        assert self._sock is not None and self._client is not None
        try:
            self._sock.sendto(
                channel.FLUSH_REQ.pack(rid, w.end),
                self._client._flusher_addr,  # the current generation's flusher
            )
            w.sent_at = time.monotonic()
        except OSError:  # the flusher restarts, or its queue is full: the watchdog resends
            w.sent_at = 0.0

    async def _watch(self) -> None:
        client = self._client
        assert client is not None
        while True:
            await asyncio.sleep(_WATCH_S)
            if not self._waiters:
                continue
            now = time.monotonic()
            with contextlib.suppress(AttributeError, ValueError, TypeError):  # re-attaching
                cb = client._cb
                if cb.flags & c.FLAG_READ_ONLY:
                    self._settle(
                        0, PutMessageStatus.FLUSH_DISK_FAILED, "fsync failed: store is read-only"
                    )
                    continue
                self._settle(cb.get(c.OFF_FLUSHED), OK, "")
            timeout = client._sync_timeout_s
            for rid, w in list(self._waiters.items()):
                if now - w.started >= timeout:
                    del self._waiters[rid]
                    if not w.fut.done():
                        w.fut.set_result(
                            (
                                PutMessageStatus.FLUSH_DISK_TIMEOUT,
                                f"not flushed within syncFlushTimeout ({timeout * 1000:.0f} ms)",
                            )
                        )
                elif now - w.sent_at >= _RESEND_S:
                    self._send(rid, w)

    async def _flushed(self, end: int) -> tuple[PutMessageStatus, str]:
        client = self._client
        assert client is not None and self._loop is not None
        if client.positions()["flushed"] >= end:
            return OK, ""
        self._rid += 1
        rid = self._rid
        fut: asyncio.Future[tuple[PutMessageStatus, str]] = self._loop.create_future()
        w = _Waiter(end, fut)
        self._waiters[rid] = w
        self._send(rid, w)
        try:
            return await fut
        except asyncio.CancelledError:
            self._waiters.pop(rid, None)
            raise

    # --- puts -----------------------------------------------------------------------------

    def _live(self) -> StoreClient:
        if self._closed or self._client is None or self._loop is None:
            raise RuntimeError("the AsyncStoreClient is closed")
        return self._client

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
        client = self._live()
        assert self._loop is not None
        r = await self._loop.run_in_executor(
            self._puts,
            lambda: client.put(
                topic, body, tags=tags, keys=keys, properties=properties,
                queue_id=queue_id, wait_store=False,
            ),
        )  # fmt: skip
        if r.status is not OK or not (wait_store and client._sync):
            return r
        status, reason = await self._flushed(r.physical_offset + r.size)
        return r if status is OK else r._replace(status=status, reason=reason)

    async def put_batch(
        self, messages: Iterable[Mapping[str, Any] | Message], *, wait_store: bool = True
    ) -> list[PutResult]:
        """`StoreClient.put_batch`, awaited (all or nothing, one segment)."""
        client = self._live()
        assert self._loop is not None
        msgs = list(messages)
        rs = await self._loop.run_in_executor(
            self._puts, lambda: client.put_batch(msgs, wait_store=False)
        )
        if not rs or rs[0].status is not OK or not (wait_store and client._sync):
            return rs
        status, reason = await self._flushed(rs[-1].physical_offset + rs[-1].size)
        if status is OK:
            return rs
        return [r._replace(status=status, reason=reason) for r in rs]

    # --- reads ----------------------------------------------------------------------------

    def _limit(self) -> int:
        client = self._client
        assert client is not None
        pos = client.positions()
        return pos["flushed"] if client._sync else pos["committed"]

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
        self._live()
        assert self._loop is not None
        return await self._loop.run_in_executor(
            self._reads, self._pull, topic, queue_id, offset, max_count
        )

    async def positions(self) -> dict[str, int]:
        """The control block's positions (reserved, published, committed, flushed)."""
        return self._live().positions()
