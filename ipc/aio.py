"""`AsyncStoreClient`: the store client for asyncio programs.

    async with AsyncStoreClient.attach("/var/lib/mqstore") as store:
        r = await store.put("orders", b"...", tags="new")
        got = await store.pull("orders", r.queue_id, 0, 32)

The event loop never blocks on the store:

* **Reserve and copy** (microseconds, but the reservation may wait for a pool buffer or
  the next segment file up to `os_page_cache_busy_timeout_ms`) run on a thread of the
  client's own, through a blocking `StoreClient` (one per thread) with
  `wait_store=False`.
* **The flush wait** (SYNC_FLUSH with `wait_store`) is on the loop: each put awaits a
  future; one thread of the client's own sleeps in the futex wait on the control
  block's flushed position (no GIL) for the nearest end awaited, and settles every
  future the flushed position covers, so any number of concurrent awaits share one
  group-committed fsync without a thread each. It answers FLUSH_DISK_TIMEOUT after
  `sync_flush_timeout_ms` and FLUSH_DISK_FAILED once the store is read-only, as the
  blocking client does.
* **`loop_waits=False`**: the whole blocking put, wait included, runs on one of
  `concurrency` threads (default 8), which sleep in the kernel without the GIL; up to
  `concurrency` awaits share an fsync.
* **Pulls** run on one more thread with a reader of their own: `ipc.reads.ClientReads`
  (the blocking client's read path: consume queues up to the dispatcher's position, tag
  filter, long polling with `wait_ms`, which holds that thread).

An acknowledgement means what the blocking client's does (docs/durability.md).
Statuses, never exceptions, for expected outcomes.

The loop-native wait uses the client's public flush wait (`StoreClient.wait_flushed`,
`flushed_position`, `sync_timeout_s`), nothing of its internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, Final, Generic, ParamSpec, TypeVar, cast

from mqstore.ipc import channel
from mqstore.ipc.accepts import BOOL, INT, check_types
from mqstore.ipc.client import StoreClient
from mqstore.ipc.reads import ClientReads, for_client
from mqstore.ipc.results import PutMessageStatus, PutResult, raise_if_failed
from mqstore.ipc.session import check_attach_types

DEFAULT_CONCURRENCY: Final = 8
_WATCH_S: Final = 0.05
OK: Final = PutMessageStatus.PUT_OK
P = ParamSpec("P")
R = TypeVar("R")
Settled = tuple[PutMessageStatus, str]


class _FlushWaits:
    """Flush waits on the loop, without a thread per await: one thread of its own sleeps
    in the futex wait (`Appender.wait_flushed`, no GIL) for the nearest end any await
    waits for; each time the flushed position moves it settles, on the loop, every
    future it covers. The flushed position in the control block is the only thing that
    settles a future OK."""

    def __init__(self, loop: asyncio.AbstractEventLoop, main: StoreClient) -> None:
        self._loop = loop
        self._main = main
        self._cond = threading.Condition()
        self._waiters: list[tuple[int, float, asyncio.Future[Settled]]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="mqstore-aio-flush", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        await self._loop.run_in_executor(None, self._thread.join)
        self._settle_all(PutMessageStatus.SERVICE_NOT_AVAILABLE, "the client was closed")

    def _settle_all(self, status: PutMessageStatus, reason: str) -> None:
        with self._cond:
            waiters, self._waiters = self._waiters, []
        for _end, _t, fut in waiters:
            if not fut.done():
                fut.set_result((status, reason))

    def _run(self) -> None:
        main = self._main
        while True:
            with self._cond:
                while not self._waiters and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                end = min(w[0] for w in self._waiters)
            try:
                code = main.wait_flushed(end, _WATCH_S)
                flushed = main.flushed_position()
            except (AttributeError, ValueError, TypeError):  # re-attaching: look again
                time.sleep(_WATCH_S)
                continue
            now = time.monotonic()
            timeout = main.sync_timeout_s
            with self._cond:
                done = [
                    w
                    for w in self._waiters
                    if code >= 2 or w[0] <= flushed or now - w[1] >= timeout
                ]
                self._waiters = [w for w in self._waiters if w not in done]
            if done:
                self._loop.call_soon_threadsafe(self._settle, done, flushed, code, timeout)

    @staticmethod
    def _settle(
        done: list[tuple[int, float, asyncio.Future[Settled]]], flushed: int, code: int,
        timeout: float,
    ) -> None:  # fmt: skip
        for end, _t, fut in done:
            if fut.done():
                continue
            if code == 2:
                fut.set_result(
                    (PutMessageStatus.FLUSH_DISK_FAILED, "fsync failed: the store is read-only")
                )
            elif end <= flushed:
                fut.set_result((OK, ""))
            elif code == 3:  # the generation ended without flushing it (ipc.fence)
                fut.set_result(
                    (
                        PutMessageStatus.SERVICE_NOT_AVAILABLE,
                        "the store was stopped or restarted while this put was in progress; "
                        "it was not stored: put it again",
                    )
                )
            else:
                fut.set_result(
                    (
                        PutMessageStatus.FLUSH_DISK_TIMEOUT,
                        f"not flushed within syncFlushTimeout ({timeout * 1000:.0f} ms)",
                    )
                )

    async def wait(self, end: int, client: StoreClient) -> Settled:
        """Until the log is flushed up to `end` (or why not)."""
        with contextlib.suppress(AttributeError, ValueError, TypeError):
            if client.flushed_position() >= end:
                return OK, ""
        fut: asyncio.Future[Settled] = self._loop.create_future()
        with self._cond:
            self._waiters.append((end, time.monotonic(), fut))
            self._cond.notify()
        try:
            return await fut
        except asyncio.CancelledError:
            with self._cond:
                self._waiters = [w for w in self._waiters if w[2] is not fut]
            raise


class _PerThread(threading.local):
    """Each put thread's own blocking client (None until its first put)."""

    client: StoreClient | None = None


class _Attach:
    """What `AsyncStoreClient.attach` returns: await it, or use it with `async with`.
    `make` builds the client (on the loop, when awaited)."""

    def __init__(self, make: Callable[[], AsyncStoreClient]) -> None:
        self._make = make
        self._client: AsyncStoreClient | None = None

    async def _open(self) -> AsyncStoreClient:
        client = self._make()
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


class _AttachLater(Generic[P]):
    """`AsyncStoreClient.attach(...)`: an `_Attach` that builds the client with these
    arguments when awaited; `__init__`'s signature and docstring (one home for both)."""

    def __init__(self, init: Callable[Concatenate[Any, P], None]) -> None:
        self.__doc__ = init.__doc__

    def __get__(self, obj: object, owner: type[AsyncStoreClient]) -> Callable[P, _Attach]:
        make = cast("Callable[P, AsyncStoreClient]", owner)

        def attach(*args: P.args, **kwargs: P.kwargs) -> _Attach:
            return _Attach(lambda: make(*args, **kwargs))

        attach.__doc__ = self.__doc__
        return attach


def _off_loop(
    read: Callable[Concatenate[ClientReads, P], R],
) -> Callable[Concatenate[AsyncStoreClient, P], Coroutine[Any, Any, R]]:
    """`AsyncStoreClient.<name>`: `ClientReads.<name>` (its signature, checks and
    docstring), awaited: it runs on the client's read thread, with that thread's reads.
    Reads share the thread: a long poll delays the reads behind it."""

    async def method(self: AsyncStoreClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = self._live()
        return await loop.run_in_executor(
            self._reads, lambda: read(self._thread_reads(), *args, **kwargs)
        )

    method.__name__ = read.__name__
    method.__qualname__ = f"AsyncStoreClient.{read.__name__}"
    method.__doc__ = read.__doc__
    return method


def _awaited(
    put: Callable[Concatenate[StoreClient, P], R],
) -> Callable[Concatenate[AsyncStoreClient, P], Coroutine[Any, Any, R]]:
    """`AsyncStoreClient.put` / `put_batch`: `StoreClient`'s (its signature, checks,
    statuses and docstring), awaited (`AsyncStoreClient._put_awaited`)."""

    async def method(self: AsyncStoreClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return cast("R", await self._put_awaited(put, args, dict(kwargs)))

    method.__name__ = put.__name__
    method.__qualname__ = f"AsyncStoreClient.{put.__name__}"
    method.__doc__ = put.__doc__
    return method


class AsyncStoreClient:
    """A producer and consumer of one running store for asyncio. See the module doc."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        concurrency: int = DEFAULT_CONCURRENCY,
        loop_waits: bool = True,
        raise_on_status: bool = False,
    ) -> None:
        """`async with AsyncStoreClient.attach(dir) as store:` or
        `store = await AsyncStoreClient.attach(dir)` (then `await store.close()`).
        `concurrency`: puts in flight at once (threads, one StoreClient each).
        `loop_waits=False`: sync puts wait on the threads (the fallback) even when the
        loop could wait. `raise_on_status`: as `StoreClient.attach`'s. Raises
        channel.SupervisorUnavailable when no supervisor runs."""
        check_attach_types("attach", store_dir, topic_queue_nums, timeout_s)
        check_types(
            "attach", concurrency=(concurrency, INT), loop_waits=(loop_waits, BOOL)
        )  # fmt: skip
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._loop_waits = loop_waits
        self.raise_on_status = raise_on_status
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self._topic_queue_nums = dict(topic_queue_nums or {})
        self._timeout_s = timeout_s
        self._puts = ThreadPoolExecutor(concurrency, thread_name_prefix="mqstore-aio-put")
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="mqstore-aio-read")
        self._local = _PerThread()
        self._clients: list[StoreClient] = []
        self._clients_lock = threading.Lock()
        self._main: StoreClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client_reads: ClientReads | None = None
        self._sync = True
        self._waits: _FlushWaits | None = None
        self._closed = False

    attach = _AttachLater(__init__)

    def _new_client(self) -> StoreClient:
        client = StoreClient.attach(
            self.store_dir, topic_queue_nums=self._topic_queue_nums, timeout_s=self._timeout_s
        )
        with self._clients_lock:
            self._clients.append(client)
        return client

    def _thread_client(self) -> StoreClient:
        client = self._local.client
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
        self._sync = doc.get("settings", {}).get("flush_disk_type", "SYNC_FLUSH") == "SYNC_FLUSH"
        self._main = await loop.run_in_executor(self._reads, self._new_client)
        if self._loop_waits:
            self._waits = _FlushWaits(loop, self._main)

    async def close(self) -> None:
        """Wait for the puts under way, detach every client, stop the threads."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._puts.shutdown, True)
        if self._waits is not None:
            await self._waits.close()
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

    def _put_on_thread(
        self, put: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[PutResult | list[PutResult], StoreClient]:
        client = self._thread_client()
        return put(client, *args, **kwargs), client

    async def _put_awaited(
        self, put: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> PutResult | list[PutResult]:
        """`put` (`StoreClient.put` or `put_batch`) on a put thread; under SYNC_FLUSH with
        `wait_store` the wait for the fsync on the loop (`_FlushWaits`) when it can."""
        wait_store = kwargs.get("wait_store", True)
        check_types(put.__name__, wait_store=(wait_store, BOOL))
        loop = self._live()
        on_loop = self._waits is not None and wait_store and self._sync
        if on_loop:
            kwargs["wait_store"] = False
        got, client = await loop.run_in_executor(self._puts, self._put_on_thread, put, args, kwargs)
        rs = got if isinstance(got, list) else [got]
        if on_loop and rs and rs[0].status is OK:
            assert self._waits is not None
            status, reason = await self._waits.wait(rs[-1].physical_offset + rs[-1].size, client)
            if status is not OK:
                rs = [r._replace(status=status, reason=reason) for r in rs]
        if self.raise_on_status:
            raise_if_failed(rs)
        return rs if isinstance(got, list) else rs[0]

    put = _awaited(StoreClient.put)
    put_batch = _awaited(StoreClient.put_batch)

    # --- reads ----------------------------------------------------------------------------

    def _thread_reads(self) -> ClientReads:
        """The read thread's `ClientReads` (made there on first use)."""
        if self._client_reads is None:
            assert self._main is not None
            self._client_reads = for_client(self._main)
        return self._client_reads

    def _close_readers(self) -> None:
        if self._client_reads is not None:
            self._client_reads.close()
            self._client_reads = None

    pull = _off_loop(ClientReads.pull)

    @property
    def waits_on_loop(self) -> bool:
        """True when sync puts wait for their fsync on the loop (not on a thread)."""
        return self._waits is not None

    async def positions(self) -> dict[str, int]:
        """The control block's positions (reserved, published, committed, flushed)."""
        loop = self._live()
        main = self._main
        assert main is not None
        return await loop.run_in_executor(self._reads, main.positions)
