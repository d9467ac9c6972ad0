"""`StoreClient`: append to a running store from any process, and read it.

    with StoreClient.attach("/var/lib/mqstore") as client:
        r = client.put("orders", b"...", tags="new", keys=["o-17"])
        assert r.status is PutMessageStatus.PUT_OK

Attaching asks the supervisor (Unix socket) for the shared-memory names and layout and
maps them; from then on a put asks nobody. The client owns three parts, each in its home:

- the session (`ipc.session.Session`): attach (one typed record, `Attached`), fork
  handling and staleness; its accessors (`live`, `live_control_block`,
  `flushed_position`, `positions`) are the client's;
- the put path (`ipc.producer.PutPath`), which rides the session: `put` and
  `put_batch`, every shape in one C call, the flush wait (`wait_flushed`) and the
  statistics row;
- the reads (`ipc.reads.ClientReads`, made per process on first use): `pull`, `get`,
  `query`, offsets.

Thread-safe: one lock per client (the session's `_native.PutLock`, which the C call takes
too) serialises puts of its threads. Fork-safe: a forked child re-attaches on its first
call. If the supervisor stops or dies, the next call re-attaches or returns
SERVICE_NOT_AVAILABLE; it never writes into a stale pool.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Final,
    Generic,
    Literal,
    ParamSpec,
    TypeVar,
    cast,
)

from mqstore.conf.settings import StoreSettings
from mqstore.engine.geometry import Geometry
from mqstore.engine.record import Message
from mqstore.engine.retry import DEFAULT_MAX_RECONSUME_TIMES, send_back_message
from mqstore.ipc import retry
from mqstore.ipc.accepts import BOOL, check_send_back, check_types
from mqstore.ipc.producer import PutPath
from mqstore.ipc.results import (
    PutError,
    PutMessageStatus,
    PutResult,
    error_for,
    raise_if_failed,
)
from mqstore.ipc.session import Session, check_attach_types

if TYPE_CHECKING:  # the read side is imported by a client's first read, not by a producer
    from mqstore.engine.record_decode import RecordFields
    from mqstore.ipc.consumer import Consumer
    from mqstore.ipc.reads import ClientReads

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
OK: Final = PutMessageStatus.PUT_OK
F = TypeVar("F", bound=Callable[..., Any])


class _Constructor(Generic[P]):
    """`StoreClient.attach(...)`: the constructor under its public name, with
    `__init__`'s signature and docstring (one home for both)."""

    def __init__(self, init: Callable[Concatenate[Any, P], None]) -> None:
        self.__doc__ = init.__doc__

    def __get__(self, obj: object, owner: type[T]) -> Callable[P, T]:
        return cast("Callable[P, T]", owner)


class _Read:
    """`StoreClient.<name>` before its first use: on the first lookup, on the class or an
    instance, it imports the read side (`ipc.reads` and its result types, ~13M
    instructions a producer's import does not pay), puts `ClientReads.<name>` on this
    process's reads (`_on`) in its place on `StoreClient` and answers as that does from
    then on."""

    def __set_name__(self, owner: type[StoreClient], name: str) -> None:
        self._name = name

    def __get__(self, obj: StoreClient | None, owner: type[StoreClient]) -> Any:
        from mqstore.ipc.reads import ClientReads

        method = _on(StoreClient._read_side, getattr(ClientReads, self._name))
        setattr(StoreClient, self._name, method)
        return method.__get__(obj, owner)


def _on(
    part: Callable[[StoreClient], T], call: Callable[Concatenate[T, P], R]
) -> Callable[Concatenate[StoreClient, P], R]:
    """`StoreClient.<name>`: `call` (its signature and docstring) on the client's `part`."""

    def method(self: StoreClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return call(part(self), *args, **kwargs)

    return _named(method, call)


def _named(method: F, like: Callable[..., Any]) -> F:
    method.__name__ = like.__name__
    method.__qualname__ = f"StoreClient.{like.__name__}"
    method.__doc__ = like.__doc__
    return method


def _puts(client: StoreClient) -> PutPath:
    return client._puts


def _session(client: StoreClient) -> Session:
    return client._puts.session


class StoreClient:
    """A producer attached to one running store. Create with `StoreClient.attach`."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        topic_queue_nums: Mapping[str, int] | None = None,
        timeout_s: float = 10.0,
        raise_on_status: bool = False,
        idempotence: bool = True,
    ) -> None:
        """Attach to the supervisor of `store_dir`. Raises channel.SupervisorUnavailable
        when none runs. The supervisor answers once the workers a put waits on
        (allocator, committer, and the flusher under SYNC_FLUSH) run, waiting up to
        `timeout_s`; still down then (booting, crash-looping), channel.WorkersNotUp
        names them and why. `topic_queue_nums`
        overrides the queue count per topic used to spread puts with `queue_id=None`
        (default: `default_topic_queue_nums`).
        `raise_on_status`: puts raise `ipc.results.PutError` (its status family's
        subclass) for any status but PUT_OK, instead of returning it.

        Every put without a UNIQ_KEY property gets one (RocketMQ's client message id,
        `PutResult.uniq_key`). `idempotence` (default on): a put whose UNIQ_KEY the store
        holds already (a retry: `put_until_ok`, or `properties={"UNIQ_KEY": r.uniq_key}`)
        answers the first put's result and stores nothing (docs/durability.md)."""
        check_attach_types("attach", store_dir, topic_queue_nums, timeout_s, idempotence)
        self._reads_of_pid: tuple[int, ClientReads] | None = None  # made on first read
        self._puts = PutPath(store_dir, timeout_s, topic_queue_nums, raise_on_status, idempotence)
        self._puts.session.attach()

    attach = _Constructor(__init__)

    @property
    def store_dir(self) -> str:
        return self._puts.session.store_dir

    @property
    def settings(self) -> StoreSettings:
        """The running store's settings, as the supervisor sent them at the last attach."""
        return self._puts.session.current().settings

    @property
    def geometry(self) -> Geometry:
        """The store's file sizes, as the supervisor sent them at the last attach."""
        return self._puts.session.current().geometry

    @property
    def sync_timeout_s(self) -> float:
        """How long a SYNC_FLUSH put waits for the flusher (the last attach's)."""
        return self._puts.session.current().settings.sync_flush_timeout_ms / 1000

    @property
    def raise_on_status(self) -> bool:
        return self._puts.raise_on_status

    # --- puts: one C call (ipc.producer.PutPath.app), this side only for what it leaves --

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
    ) -> PutResult:
        """Append one message. Returns PUT_OK with where it went, or why not.

        `delay_level` N > 0 delays it (RocketMQ's delay levels, `message_delay_level`): the
        record goes to SCHEDULE_TOPIC_XXXX queue N-1 with DELAY, REAL_TOPIC and REAL_QID,
        and the store's scheduler re-puts it to `topic` when due (docs/delays.md); a level
        above the highest is the highest; a negative one is MESSAGE_ILLEGAL.

        `keys`: one str is the KEYS property as given (RocketMQ's form: keys separated by
        spaces); a sequence of str is joined with spaces, and a key in it that is empty
        or holds whitespace is refused (it would be indexed as other keys). `keys` or
        `tags` together with the same property in `properties` is refused.

        Under SYNC_FLUSH with `wait_store` it returns once the record is on disk
        (group commit); with `wait_store=False` or ASYNC_FLUSH it returns once the record
        is in the pool or page cache. Never raises for expected outcomes, unless attached
        with `raise_on_status` (then any status but PUT_OK raises its `PutError`); raises
        TypeError for an argument of the wrong type, naming it (`ipc.accepts`).
        """
        puts = self._puts
        got: PutResult | None = puts.app.put_message(
            topic, body, tags, keys, properties, queue_id, wait_store, False, delay_level
        )
        if got is None:
            got = puts.put_held(
                topic, body, tags, keys, properties, queue_id, wait_store, delay_level
            )
        if got[0] is not OK and puts.raise_on_status:
            raise error_for(got)
        return got

    def put_batch(
        self,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        wait_store: bool = True,
        redelivered: bool = False,
    ) -> list[PutResult]:
        """Append messages all or nothing, in one segment, under one reservation.

        Each item is a dict of `put`'s keyword arguments (plus `topic` and `body`) or an
        `engine.record.Message` (its topic, body, properties, queue id, flag, sys flag,
        born host and time, reconsume times, prepared offset, delay level). Unlike
        RocketMQ's batch (which refuses delay levels), each message may carry its own
        delay level: it is rewritten to the schedule topic as `put` does. A bad message fails the
        whole batch with its status; nothing is written. A message or field of the
        wrong type raises TypeError naming it (`ipc.accepts`).

        `redelivered=True`: the messages are stored ones put again with their properties
        (`send_back` and the scheduler pass it): a UNIQ_KEY of this client's own is kept
        but not taken for a retry, so the idempotence table neither answers nor notes
        them (else a client's send-back of a message it produced would answer the first
        put's result and store nothing).
        """
        puts = self._puts
        check_types("put_batch", redelivered=(redelivered, BOOL))
        results: list[PutResult] | None = puts.app.put_batch_messages(
            messages, wait_store, False, redelivered
        )
        if results is None:
            results = puts.put_batch_held(messages, wait_store, redelivered)
        return raise_if_failed(results) if puts.raise_on_status else results

    def new_uniq_key(self) -> str:
        """A new UNIQ_KEY of this client (RocketMQ's MessageClientIDSetter format: 32 hex
        digits), as a put without one gets: give it in `properties` to put a message
        that may be retried (`put_until_ok` does)."""
        return str(self._puts.ids.next())

    @property
    def producer_id(self) -> str:
        """The first 20 hex digits of this client's UNIQ_KEYs (IPv4, pid, a random hash):
        the producer the store remembers recent puts of."""
        return str(self._puts.ids.producer_id)

    def put_until_ok(
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
        """`put`, retried with the same UNIQ_KEY while the answer is one a retry can
        change (FLUSH_DISK_TIMEOUT, SERVICE_NOT_AVAILABLE, OS_PAGECACHE_BUSY,
        CREATE_MAPPED_FILE_FAILED; re-attaching to a restarted supervisor), until PUT_OK
        or `timeout_s` (None: no limit). With idempotence on, the message is stored once
        (`ipc.retry`; a delayed one once in SCHEDULE_TOPIC_XXXX). Returns the last result;
        raises as `put` does."""
        props = retry.with_key(properties, self.new_uniq_key)

        def attempt() -> tuple[PutResult]:
            try:
                return (
                    self.put(
                        topic, body, tags=tags, keys=keys, properties=props,
                        queue_id=queue_id, wait_store=wait_store, delay_level=delay_level,
                    ),
                )  # fmt: skip
            except PutError as e:  # raise_on_status: the status decides, as without
                return (e.result,)

        last = retry.retry(attempt, timeout_s)[0]
        if last[0] is not OK and self._puts.raise_on_status:
            raise error_for(last)
        return last

    def put_batch_until_ok(
        self,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        wait_store: bool = True,
        timeout_s: float | None = 60.0,
    ) -> list[PutResult]:
        """`put_batch`, retried as `put_until_ok` retries a put (each message keeps its
        UNIQ_KEY across tries; a batch is recognised as stored only whole). ValueError
        for more than `_native.IDEM_WINDOW` messages: a retry of more stores them again."""
        batch = retry.keyed_batch(messages, self.new_uniq_key)

        def attempt() -> list[PutResult]:
            try:
                return self.put_batch(batch, wait_store=wait_store)
            except PutError as e:
                return list(e.results)

        last = list(retry.retry(attempt, timeout_s))
        return raise_if_failed(last) if self._puts.raise_on_status else last

    def send_back(
        self,
        message: RecordFields,
        group: str,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    ) -> PutResult:
        """Give `message` (as `pull` returned it) back to consumer group `group`, as
        RocketMQ's broker does for a consumer's `sendMessageBack` (`engine.retry`): its
        reconsume count + 1; to `%RETRY%<group>` after delay level `delay_level` (0: the
        broker's choice, 3 + its reconsume count), or to `%DLQ%<group>` once its count
        had reached `max_reconsume_times` or with a negative `delay_level`. The properties
        are RocketMQ's (RETRY_TOPIC, ORIGIN_MESSAGE_ID, RECONSUME_TIME,
        MAX_RECONSUME_TIMES, WAIT, DELAY, REAL_TOPIC, REAL_QID; TAGS, KEYS and the rest
        kept). Returns the put's `PutResult` (a retry's is the schedule topic's queue and
        offset); waits for the disk under SYNC_FLUSH. docs/delays.md."""
        check_send_back(message, group, delay_level, max_reconsume_times)
        back = send_back_message(
            message, group, delay_level=delay_level, max_reconsume_times=max_reconsume_times
        )
        return self.put_batch([back.message], redelivered=True)[0]

    wait_flushed = _on(_puts, PutPath.wait_flushed)
    live = _on(_session, Session.live)
    live_control_block = _on(_session, Session.live_control_block)
    flushed_position = _on(_session, Session.flushed_position)
    positions = _on(_session, Session.positions)

    def close(self) -> None:
        """Detach: nothing of this client stays in the supervisor or in /dev/shm."""
        reads = self._reads_of_pid
        if reads is not None and reads[0] == os.getpid():
            reads[1].close()
        self._puts.session.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # getattr: __del__ runs after an __init__ that raised (a TypeError before the
        # session existed, a failed attach) too.
        puts = getattr(self, "_puts", None)
        if puts is not None and not puts.session.closed and puts.session.attached is not None:
            with contextlib.suppress(Exception):
                self.close()

    # --- reads (ipc.reads.ClientReads, in this process) and consumer offsets -------------

    def _read_side(self) -> ClientReads:
        """This process's `ClientReads` (made on first use, again after a fork)."""
        got = self._reads_of_pid
        if got is None or got[0] != os.getpid():
            from mqstore.ipc.reads import for_client

            got = (os.getpid(), for_client(self))
            self._reads_of_pid = got
        return got[1]

    if TYPE_CHECKING:
        pull = _on(_read_side, ClientReads.pull)
        get = _on(_read_side, ClientReads.get)
        get_by_msg_id = _on(_read_side, ClientReads.get_by_msg_id)
        query = _on(_read_side, ClientReads.query)
        offset_for_time = _on(_read_side, ClientReads.offset_for_time)
        min_offset = _on(_read_side, ClientReads.min_offset)
        max_offset = _on(_read_side, ClientReads.max_offset)
        commit_offset = _on(_read_side, ClientReads.commit_offset)
        committed_offset = _on(_read_side, ClientReads.committed_offset)
    else:  # the same, made on first use (`_Read`)
        pull = _Read()
        get = _Read()
        get_by_msg_id = _Read()
        query = _Read()
        offset_for_time = _Read()
        min_offset = _Read()
        max_offset = _Read()
        commit_offset = _Read()
        committed_offset = _Read()

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
    ) -> Consumer:
        """Join consumer group `group` on `topics` (and its `%RETRY%<group>` topic,
        unless `retry=False`): the group's queues are shared among its members
        (`ipc.consumer.Consumer`; close it, or use `with`, to leave). A queue the group
        has no offset in starts at its first message (`from_where="first"`) or its end
        (`"last"`). A nacked message goes to `%DLQ%<group>` after
        `max_reconsume_times`. A member whose beats stop for `session_ms` loses its
        queues. Raises SupervisorUnavailable, ValueError."""
        from mqstore.ipc.consumer import Consumer

        return Consumer(
            self,
            group,
            topics,
            from_where=from_where,
            max_reconsume_times=max_reconsume_times,
            session_ms=session_ms,
            pull_batch=pull_batch,
            retry=retry,
        )
