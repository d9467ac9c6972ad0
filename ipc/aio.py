"""`AsyncStoreClient`: the store client for asyncio programs.

    async with AsyncStoreClient.attach("/var/lib/mqstore") as store:
        r = await store.put("orders", b"...", tags="new")
        rs = await asyncio.gather(*(store.put("orders", b) for b in bodies))
        got = await store.pull("orders", r.queue_id, 0, 32)

A put runs on the event loop thread, through one blocking `StoreClient` of the client's
own: the same C call as a blocking put (reserve, copy, publish: microseconds), no thread
hop. `put` and `put_batch` return an `asyncio.Future` (await it, gather it, or
`asyncio.ensure_future` it), which costs asyncio less than a coroutine's task:

* **ASYNC_FLUSH, or `wait_store=False`**: the put is done when the call returns; its
  future is already resolved. The reservation may wait for a pool buffer or the next
  segment file, up to `os_page_cache_busy_timeout_ms`, as a blocking put's does.
* **SYNC_FLUSH with `wait_store`**: the put is reserved, copied and published on the
  loop without waiting (the blocking put's `wait_store=False`); its future resolves once
  the flush is known (`_FlushWaits`): one thread of the client's own (started at the
  first such put, with a `StoreClient` of its own) sleeps in the futex wait on the
  control block's flushed position (GIL released) and, each time the flusher moves
  it, has the loop settle every future it covers, in one batch, so any number of
  concurrent puts share each group-committed fsync. PUT_OK only once the flushed
  position of the control block the record was written into covers the record;
  FLUSH_DISK_TIMEOUT after `syncFlushTimeout`; FLUSH_DISK_FAILED once the store is
  read-only: the blocking client's statuses. The loop never blocks on a flush.
* **Pulls** run on one more thread with a reader of its own: `ipc.reads.ClientReads`
  (the blocking client's read path: consume queues up to the dispatcher's position, tag
  filter, long polling with `wait_ms`, which holds that thread).

Cancelling a put's future stops nobody but its awaiter: the record is in the log (a
blocking put interrupted mid-wait leaves it too), and its entry among the flush waits is
dropped once the flush covers it or its timeout passes.

An acknowledgement means what the blocking client's does (docs/durability.md).
Statuses, never exceptions, for expected outcomes (unless `raise_on_status`).

Only the public client API is used: `StoreClient.put` / `put_batch`, `wait_flushed`,
`live_control_block`, `settings`, `sync_timeout_s`, and the control block's views.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, Final, Generic, Literal, ParamSpec, TypeVar, cast

from mqstore.conf.settings import FlushDiskType
from mqstore.engine.record import Message
from mqstore.engine.record_decode import RecordFields
from mqstore.engine.retry import DEFAULT_MAX_RECONSUME_TIMES, send_back_message
from mqstore.ipc import channel, retry
from mqstore.ipc import control as c
from mqstore.ipc.accepts import check_send_back
from mqstore.ipc.aio_consumer import AsyncConsumer, open_consumer
from mqstore.ipc.client import StoreClient
from mqstore.ipc.control_views import Flags, Positions
from mqstore.ipc.reads import ClientReads, for_client
from mqstore.ipc.results import (
    FSYNC_FAILED,
    PutError,
    PutMessageStatus,
    PutResult,
    error_for,
    flush_timed_out,
    raise_if_failed,
)
from mqstore.ipc.session import check_attach_types

_WATCH_S: Final = 0.05  # the longest futex sleep: deadlines and closing are seen this soon
_RETRY_S: Final = 0.005  # the tick while the sleeper is on another store generation
_SYNC: Final = FlushDiskType.SYNC_FLUSH
OK: Final = PutMessageStatus.PUT_OK
TIMED_OUT: Final = PutMessageStatus.FLUSH_DISK_TIMEOUT
_RESTARTED: Final = "the store restarted before the record was known flushed"
_ENDED: Final = c.FLAG_FENCED | c.FLAG_STOPPED  # the generation ended (`ipc.fence`)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T", "AsyncStoreClient", "AsyncConsumer")
Outcome = PutResult | list[PutResult]
Settled = tuple[PutMessageStatus, str]
# (record end, deadline, control block written into, future, the put's result)
_Wait = tuple[int, float, c.ControlBlock, "asyncio.Future[Any]", Outcome]


def _answer(
    fut: asyncio.Future[Any], got: Outcome, status: PutMessageStatus, reason: str, raises: bool
) -> None:
    """Resolve `fut` with a put's results `got` under the flush `status` (`raises`: a
    status but PUT_OK as its `PutError`, the client's `raise_on_status`)."""
    if status is not OK:
        if isinstance(got, list):
            got = [r._replace(status=status, reason=reason) for r in got]
            error = error_for(got[0], tuple(got))
        else:
            got = got._replace(status=status, reason=reason)
            error = error_for(got)
        if raises:
            fut.set_exception(error)
            return
    fut.set_result(got)


class _FlushWaits:
    """The flush waits of one client's sync puts, answered as the module doc says. Puts
    on the loop append in reservation order, so the ends (and deadlines) of `_pending`
    ascend: the thread waits for the first end, asking the flusher for the furthest. It
    sleeps through a `StoreClient` of its own (`sleeper`, attached there by
    `make_sleeper`), so that no wait is ever under way in the putting client's appender
    when a put re-attaches it. A block the putting client has since detached from (the
    supervisor restarted) can no longer say: FLUSH_DISK_TIMEOUT."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: StoreClient,
        make_sleeper: Callable[[], StoreClient],
    ) -> None:
        self._loop = loop
        self._client = client
        self._make_sleeper = make_sleeper
        self._sleeper: StoreClient | None = None
        self._raise = client.raise_on_status
        self._pending: deque[_Wait] = deque()  # appended on the loop, taken by the thread
        self._want: tuple[int, c.ControlBlock | None] = (0, None)  # the furthest end awaited
        self._idle = True  # the thread may sleep on _work: wake it on an append
        self._work = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, cb: c.ControlBlock, got: Outcome, end: int) -> asyncio.Future[Any]:
        """A future of `got` (a put's results, written into `cb` up to `end`), resolved
        with their flush status."""
        fut = self._loop.create_future()
        self._pending.append((end, time.monotonic() + self._client.sync_timeout_s, cb, fut, got))
        self._want = (end, cb)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mqstore-aio-flush")
            self._thread.daemon = True
            self._thread.start()
        elif self._idle:
            self._work.set()
        return fut

    def _run(self) -> None:
        while True:
            self._idle = True
            if not self._pending and not self._closed:
                self._work.wait()
            self._work.clear()
            self._idle = False
            if self._closed:
                return
            try:
                end, deadline, cb, _fut, _got = self._pending[0]
            except IndexError:
                continue
            self._sleep(end, deadline, cb)
            answers = self._take(cb)
            if answers:
                try:
                    self._loop.call_soon_threadsafe(self._answer_all, answers)
                except RuntimeError:  # the loop is closed
                    return

    def _sleep(self, end: int, deadline: float, cb: c.ControlBlock) -> None:
        """Until the flushed position of `cb` may cover `end`, at most `_WATCH_S` or
        the deadline: the futex wait of the sleeper's client, when it is attached to
        `cb`'s store generation (it re-attaches at its staleness checks), else a tick."""
        want, want_cb = self._want
        try:
            if self._sleeper is None:
                self._sleeper = self._make_sleeper()
            sleeper = self._sleeper
            if sleeper.live_control_block().ctl_name == cb.ctl_name:
                if want > end and want_cb is cb:  # the flusher's request: the furthest end
                    sleeper.wait_flushed(want, 0)
                sleeper.wait_flushed(end, max(min(_WATCH_S, deadline - time.monotonic()), 0.0))
                return
        except (OSError, AttributeError, ValueError, TypeError):
            pass  # not attached to a running store just now (SupervisorUnavailable...)
        time.sleep(_RETRY_S)

    def _take(self, cb: c.ControlBlock) -> list[tuple[asyncio.Future[Any], Outcome, Settled]]:
        """Take, in order, the waits on `cb` its flushed position covers, or that can no
        longer be covered or waited for, each with its status and reason."""
        try:
            flushed = Positions(cb).flushed
            word = Flags(cb).word
            failed = bool(word & c.FLAG_READ_ONLY)
            ended = word & _ENDED == _ENDED  # fenced and stopped: never flushed (ipc.fence)
            gone = False
        except ValueError:  # detached: the supervisor restarted
            flushed, failed, ended, gone = -1, False, False, True
        now = time.monotonic()
        pending = self._pending
        taken = []
        while pending:
            end, deadline, at, fut, got = pending[0]
            if at is not cb:
                break
            if end <= flushed:
                settled: Settled = (OK, "")
            elif gone:
                settled = (TIMED_OUT, _RESTARTED)
            elif failed:
                settled = (PutMessageStatus.FLUSH_DISK_FAILED, FSYNC_FAILED)
            elif ended:  # as the blocking put's fenced wait (outcome 3)
                settled = (
                    TIMED_OUT,
                    f"the store was stopped or restarted (generation {cb.generation} is over) "
                    "before the record was known flushed",
                )
            elif now >= deadline:
                settled = (TIMED_OUT, flush_timed_out(self._client.sync_timeout_s))
            else:
                break
            pending.popleft()
            taken.append((fut, got, settled))
        return taken

    def _answer_all(self, answers: list[tuple[asyncio.Future[Any], Outcome, Settled]]) -> None:
        for fut, got, (status, reason) in answers:
            if not fut.done():  # else cancelled
                _answer(fut, got, status, reason, self._raise)

    async def close(self) -> None:
        """Once every put under way has its answer: stop the thread, detach its client."""
        waiting = [w[3] for w in tuple(self._pending) if not w[3].done()]
        if waiting:
            await asyncio.wait(waiting)
        self._closed = True
        self._work.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self._sleeper is not None:
            self._sleeper.close()


class _Opening(Generic[T]):
    """What `AsyncStoreClient.attach` and `AsyncStoreClient.consumer` return: await it,
    or use it with `async with`. `start` makes the client or member when awaited."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._begin: Callable[[], Coroutine[Any, Any, T]] = start
        self._it: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._begin().__await__()

    async def __aenter__(self) -> T:
        self._it = await self._begin()
        return self._it

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._it is not None:
            await self._it.__aexit__(exc_type, exc, tb)


async def _started(make: Callable[[], AsyncStoreClient]) -> AsyncStoreClient:
    client = make()
    try:
        await client._start()
    except BaseException:
        await client.close()
        raise
    return client


class _AttachLater(Generic[P]):
    """`AsyncStoreClient.attach(...)`: an `_Opening` that builds the client with these
    arguments when awaited; `__init__`'s signature and docstring (one home for both)."""

    def __init__(self, init: Callable[Concatenate[Any, P], None]) -> None:
        self.__doc__ = init.__doc__

    def __get__(
        self, obj: object, owner: type[AsyncStoreClient]
    ) -> Callable[P, _Opening[AsyncStoreClient]]:
        make = cast("Callable[P, AsyncStoreClient]", owner)

        def attach(*args: P.args, **kwargs: P.kwargs) -> _Opening[AsyncStoreClient]:
            return _Opening(lambda: _started(lambda: make(*args, **kwargs)))

        attach.__doc__ = self.__doc__
        return attach


def _off_loop(
    read: Callable[Concatenate[ClientReads, P], R],
) -> Callable[Concatenate[AsyncStoreClient, P], Coroutine[Any, Any, R]]:
    """`AsyncStoreClient.<name>`: `ClientReads.<name>` (its signature, checks and
    docstring), awaited: it runs on the client's read thread, with that thread's reads.
    Reads share the thread: a long poll delays the reads behind it."""

    async def method(self: AsyncStoreClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        self._loop_client()
        return await asyncio.get_running_loop().run_in_executor(
            self._reads, lambda: read(self._thread_reads(), *args, **kwargs)
        )

    method.__name__ = read.__name__
    method.__qualname__ = f"AsyncStoreClient.{read.__name__}"
    method.__doc__ = read.__doc__
    return method


class AsyncStoreClient:
    """A producer and consumer of one running store for asyncio. See the module doc."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        raise_on_status: bool = False,
        idempotence: bool = True,
    ) -> None:
        """`async with AsyncStoreClient.attach(dir) as store:` or
        `store = await AsyncStoreClient.attach(dir)` (then `await store.close()`).
        The arguments are `StoreClient.attach`'s; `raise_on_status`: a status but PUT_OK
        raises its `PutError`, at the call, or at the await for a flush status;
        `idempotence` (default on): a put whose UNIQ_KEY is one of this client's and
        stored already answers the first put's result (`put_until_ok`). Raises
        channel.SupervisorUnavailable when no supervisor runs."""
        check_attach_types("attach", store_dir, topic_queue_nums, timeout_s, idempotence)
        self._idempotence = idempotence
        self.raise_on_status = raise_on_status
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self._topic_queue_nums = dict(topic_queue_nums or {})
        self._timeout_s = timeout_s
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="mqstore-aio-read")
        self._client: StoreClient | None = None  # the loop's: puts, positions
        self._reader: StoreClient | None = None  # the read thread's, made at its first read
        self._client_reads: ClientReads | None = None
        self._waits: _FlushWaits | None = None
        self._closed = False

    attach = _AttachLater(__init__)

    def _new_client(self) -> StoreClient:
        return StoreClient.attach(
            self.store_dir,
            topic_queue_nums=self._topic_queue_nums,
            timeout_s=self._timeout_s,
            raise_on_status=self.raise_on_status,
            idempotence=self._idempotence,
        )

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._client = await loop.run_in_executor(self._reads, self._new_client)
        self._waits = _FlushWaits(loop, self._client, self._new_client)
        self._new_future = loop.create_future

    async def close(self) -> None:
        """Wait for the puts under way to get their answers, detach, stop the threads."""
        if self._closed:
            return
        self._closed = True
        if self._waits is not None:
            await self._waits.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._reads, self._close_reader)
        self._reads.shutdown(wait=True)
        if self._client is not None:
            self._client.close()

    async def __aenter__(self) -> AsyncStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- puts -----------------------------------------------------------------------------

    def _loop_client(self) -> StoreClient:
        client = self._client
        if self._closed or client is None:
            raise RuntimeError("the AsyncStoreClient is closed")
        return client

    def _on_loop(self, wait_store: object) -> StoreClient | None:
        """The loop's client when this put does not wait for its fsync (ASYNC_FLUSH, or
        not `wait_store`: it is done when the C call returns), else None."""
        client = self._loop_client()
        if wait_store is not True or client.settings.flush_disk_type is not _SYNC:
            return client
        return None

    def _resolved(self, got: Outcome) -> asyncio.Future[Any]:
        fut = self._new_future()
        fut.set_result(got)
        return fut

    def _waited(self, put: Callable[[StoreClient], Outcome]) -> asyncio.Future[Any]:
        """`put` (with `wait_store=False`) then its flush wait on the control block it
        went into: the block as checked live just before the put (re-checked only after
        10 ms, so the put writes into it; were it detached in between, the wait answers
        FLUSH_DISK_TIMEOUT, never a PUT_OK from another block)."""
        client, waits = self._client, self._waits
        assert client is not None and waits is not None
        try:
            cb: c.ControlBlock | None = client.live_control_block()
        except channel.SupervisorUnavailable:
            cb = None  # the put says so, in its shape (or the store is back: see below)
        got = put(client)
        rs = got if isinstance(got, list) else [got]
        if not rs or rs[0].status is not OK:
            return self._resolved(got)
        if cb is None:
            fut = self._new_future()
            _answer(fut, got, TIMED_OUT, _RESTARTED, self.raise_on_status)
            return fut
        return waits.add(cb, got, rs[-1].physical_offset + rs[-1].size)

    def put(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        wait_store: bool = True,
        delay_level: int = 0,
    ) -> asyncio.Future[PutResult]:
        """`StoreClient.put` on the loop: the same arguments, checks, statuses and
        meaning. Returns a future of its `PutResult`, resolved at once unless it waits
        for its fsync (SYNC_FLUSH with `wait_store`). TypeError for an argument of the
        wrong type (and, with `raise_on_status`, the `PutError` of a status known at
        once) at the call."""
        client = self._on_loop(wait_store)
        if client is not None:
            return self._resolved(
                client.put(
                    topic, body, tags=tags, keys=keys, properties=properties,
                    queue_id=queue_id, wait_store=wait_store, delay_level=delay_level,
                )
            )  # fmt: skip
        return self._waited(
            lambda cl: cl.put(
                topic, body, tags=tags, keys=keys, properties=properties, queue_id=queue_id,
                wait_store=False, delay_level=delay_level,
            ),
        )  # fmt: skip

    def put_batch(
        self,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        wait_store: bool = True,
        redelivered: bool = False,
    ) -> asyncio.Future[list[PutResult]]:
        """`StoreClient.put_batch` on the loop (all or nothing, one reservation), as
        `put`: a future of its results."""
        client = self._on_loop(wait_store)
        if client is not None:
            return self._resolved(
                client.put_batch(messages, wait_store=wait_store, redelivered=redelivered)
            )
        return self._waited(
            lambda cl: cl.put_batch(messages, wait_store=False, redelivered=redelivered)
        )

    async def put_until_ok(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        wait_store: bool = True,
        timeout_s: float | None = 60.0,
        delay_level: int = 0,
    ) -> PutResult:
        """`StoreClient.put_until_ok` on the loop: `put` with one UNIQ_KEY (the caller's,
        else this client's next), awaited and put again while the answer is one a retry
        can change (`ipc.retry.RETRIABLE`), until PUT_OK or `timeout_s` (None: no
        limit); the pauses between tries are `asyncio.sleep`s. With idempotence on, the
        message is stored once. Returns the last result; raises as `put` does."""
        props = retry.with_key(properties, self._loop_client().new_uniq_key)

        async def attempt() -> list[PutResult]:
            try:
                return [
                    await self.put(
                        topic, body, tags=tags, keys=keys, properties=props,
                        queue_id=queue_id, wait_store=wait_store, delay_level=delay_level,
                    )
                ]  # fmt: skip
            except PutError as e:  # raise_on_status: the status decides, as without
                return [e.result]

        last = (await retry.retry_async(attempt, timeout_s))[0]
        if last.status is not OK and self.raise_on_status:
            raise error_for(last)
        return last

    async def put_batch_until_ok(
        self,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        wait_store: bool = True,
        timeout_s: float | None = 60.0,
    ) -> list[PutResult]:
        """`StoreClient.put_batch_until_ok` on the loop, as `put_until_ok` (each message
        keeps its UNIQ_KEY across tries; a batch is recognised as stored only whole).
        ValueError for more than `_native.IDEM_WINDOW` messages (as the blocking one)."""
        batch = retry.keyed_batch(messages, self._loop_client().new_uniq_key)

        async def attempt() -> list[PutResult]:
            try:
                got: list[PutResult] = await self.put_batch(batch, wait_store=wait_store)
                return got
            except PutError as e:
                return list(e.results)

        last = list(await retry.retry_async(attempt, timeout_s))
        return raise_if_failed(last) if self.raise_on_status else last

    def consumer(
        self,
        group: str,
        topics: str | Sequence[str],
        *,
        from_where: Literal["first", "last"] = "first",
        max_reconsume_times: int = 16,
        session_ms: int = 2000,
        pull_batch: int = 128,
        retry: bool = True,
    ) -> _Opening[AsyncConsumer]:
        """`StoreClient.consumer` for asyncio: `async with store.consumer(g, topics) as c`
        or `c = await store.consumer(...)` (then `await c.close()`). The member
        (`ipc.aio_consumer.AsyncConsumer`) has a `StoreClient` of its own."""
        return _Opening(
            lambda: asyncio.to_thread(
                open_consumer, self.store_dir, self._timeout_s, group, topics,
                from_where=from_where, max_reconsume_times=max_reconsume_times,
                session_ms=session_ms, pull_batch=pull_batch, retry=retry,
            )
        )  # fmt: skip

    def send_back(
        self,
        message: RecordFields,
        group: str,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    ) -> asyncio.Future[PutResult]:
        """`StoreClient.send_back` on the loop: a future of its `PutResult`."""
        check_send_back(message, group, delay_level, max_reconsume_times)
        back = send_back_message(
            message, group, delay_level=delay_level, max_reconsume_times=max_reconsume_times
        )
        client = self._on_loop(True)
        if client is not None:
            return self._resolved(client.put_batch([back.message], redelivered=True)[0])
        return self._waited(
            lambda cl: cl.put_batch([back.message], wait_store=False, redelivered=True)[0]
        )

    # --- reads ----------------------------------------------------------------------------

    def _thread_reads(self) -> ClientReads:
        """The read thread's `ClientReads`, on a client of its own (made there on first
        use: a read never takes the loop's client's lock)."""
        if self._client_reads is None:
            self._reader = self._new_client()
            self._client_reads = for_client(self._reader)
        return self._client_reads

    def _close_reader(self) -> None:
        if self._client_reads is not None:
            self._client_reads.close()
            self._client_reads = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    pull = _off_loop(ClientReads.pull)

    async def positions(self) -> dict[str, int]:
        """The control block's positions (reserved, published, committed, flushed)."""
        return self._loop_client().positions()
