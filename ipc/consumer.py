"""`Consumer`: a member of a consumer group, consuming the queues the group gives it.

    with client.consumer("billing", ["orders"]) as consumer:
        for msg in consumer:          # the next message acks this one
            handle(msg.body)          # an exception leaving the loop nacks it
        # or: for m in consumer.poll(32, timeout=1.0): ...; consumer.ack(m) / nack(m)

Membership (`workers.group_coord` in the supervisor says how queues are allocated and
leased): a thread of the consumer's own keeps one connection to the supervisor, joins,
and beats every `beat_ms`. Each beat renews the leases of the queues granted to this
member; the lease deadline is counted from the moment the beat was *sent*, so it ends
here before it can end in the supervisor. Nothing of a queue is delivered past its
deadline, nor after the supervisor revoked or cancelled it.

Offsets (RocketMQ's ProcessQueue): per queue, the offset to commit is the lowest one not
yet acked (a slow message holds back its own queue only). It is stored at each ack into
the grant's slot (`ipc.group_slots`), a shared mapping that outlives this process, and
from there the supervisor hands it to the queue's next owner and persists it. So what was
acked is never redelivered by the group, and what was delivered but not acked when a
member died or lost its lease is delivered again by the next owner: at least once.

A revoked queue (a rebalance) is fetched no more; what was fetched but not delivered is
dropped (the next owner starts at the committed offset); it is released once every
message delivered from it is acked or nacked, or its lease runs out.

The group's retry topic `%RETRY%<group>` is consumed too (one queue). `nack` sends a
message back (`StoreClient.send_back`, RocketMQ's consumerSendMsgBack: to the retry
topic with the next delay level, to `%DLQ%<group>` after `max_reconsume_times`). A
message from the retry topic reads as its original topic (`msg.topic`, RocketMQ's
`RETRY_TOPIC` property); `msg.record` is the record as stored.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, cast

from mqstore import _native
from mqstore.engine import compression, pull, record, record_decode
from mqstore.engine.names import check_group, check_topic
from mqstore.engine.record_decode import DecodedRecord, RecordFields
from mqstore.ipc import access, channel, group_slots
from mqstore.ipc.read_results import GetMessageStatus
from mqstore.ipc.reads import POLL_MAX_STEP_S, POLL_STEP_S, ClientReads, LiveAttach, for_client
from mqstore.ipc.results import PutMessageStatus, PutResult

RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
DEFAULT_MAX_RECONSUME_TIMES: Final = 16
PULL_BATCH: Final = 128  # a pull's fixed cost (~15 us) over 128 messages, not 32
MAX_INFLIGHT_PER_QUEUE: Final = 1000  # RocketMQ's pullThresholdForQueue
LOCAL_RETRY_S: Final = 1.0  # a nack whose send-back failed is delivered again after this
_RECONNECT_S: Final = 0.1
FromWhere = Literal["first", "last"]


class MemberClient(LiveAttach, Protocol):
    """What a member needs of its client (`StoreClient`): its attach, for reads and the
    supervisor's socket, and `send_back` for a nack."""

    def send_back(
        self,
        message: RecordFields,
        group: str,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    ) -> PutResult: ...


class LockLike(Protocol):
    def locked(self) -> bool: ...


_SERIALS: Final = itertools.count(1)  # one per Consumer: whose a delivered message is


def _ours(consumer: Consumer, msg: object) -> ConsumedMessage:
    """`msg`, when this consumer delivered it; else TypeError (not a delivered message)
    or ValueError (another consumer's): an ack must not mark another consumer's message
    done nor store its queue's offset into this group's slots."""
    if type(msg) is not ConsumedMessage:
        raise TypeError(f"expected a ConsumedMessage, not {type(msg).__name__}")
    if msg._q.owner != consumer._serial:
        raise ValueError(f"{msg!r} was not delivered by this consumer")
    return msg


class ConsumerClosed(Exception):
    """The consumer was closed."""


@dataclass(eq=False)
class _Queue:
    """One queue granted to this member (RocketMQ's ProcessQueue)."""

    topic: str
    queue_id: int
    tag: int
    slot: int
    start: int  # -1: the group never committed one here; resolved by `from_where`
    deadline: float  # local lease end (monotonic)
    state: Literal["active", "revoking", "dropped"] = "active"
    next_fetch: int = -1
    # fetched, not delivered: buffer[pos:] (an empty list when all were delivered)
    buffer: list[ConsumedMessage] = field(default_factory=list)
    pos: int = 0
    # delivered and not yet known acked, ascending; the acked ones at its left leave at
    # the next commit (each message's `done` says it was acked or nacked)
    inflight: deque[ConsumedMessage] = field(default_factory=deque)
    word: int = 0  # the slot word's tag bits (`group_slots.pack` of offset 0)
    owner: int = 0  # the `Consumer._serial` of the consumer it was granted to

    def __post_init__(self) -> None:
        self.word = (self.tag & group_slots.TAG_MASK) << group_slots.OFFSET_BITS

    def commit_point(self) -> int:
        """The lowest offset not yet acked (RocketMQ's ProcessQueue minimum)."""
        inflight = self.inflight
        while inflight and inflight[0].done:
            inflight.popleft()
        if inflight:
            return inflight[0].queue_offset
        if self.buffer:
            return self.buffer[self.pos].queue_offset
        return self.next_fetch

    def unbuffer(self) -> None:
        """Drop what was fetched and not delivered."""
        self.buffer = []
        self.pos = 0


_UNIT = struct.Struct(">qiq")  # a consume-queue unit (offset, size, tag code)


def _decode(raw: bytes) -> DecodedRecord:
    """The record `raw` holds, as a pull gives it (the same C builder; its body
    inflated when compressed)."""
    phys, size = _PHYS.unpack_from(raw, record.POS_PHYSICALOFFSET)[0], len(raw)
    out: list[RecordFields] = []
    unit = _UNIT.pack(phys, size, 0)
    pull.pull_units(unit, 0, raw, phys, phys + size, None, None, 1, size, 0, False, out)
    rec = out[0] if out else record_decode.decode(raw, 0)
    return cast(DecodedRecord, compression.inflate(rec))


_PHYS = struct.Struct(">q")


class ConsumedMessage:
    """A message delivered to this member: ack or nack it (`Consumer.ack` / `nack`).

    `topic` is the topic it was sent to (for a retried message: its `RETRY_TOPIC`
    property); `queue_id` and `queue_offset` say where it was consumed (of
    `record.topic`, which is `%RETRY%<group>` for a retry).

    Made in C by the pull (`engine.pull`'s lazy messages): it holds the record's bytes,
    its body and queue offset; everything else (`record`, `topic`, `properties`, …) is
    decoded the first time it is asked for, then kept."""

    __slots__ = ("_body", "_q", "_raw", "_rec", "_tag", "done", "queue_offset")
    _raw: bytes
    _body: bytes | None  # None: compressed, inflated by `record`
    queue_offset: int
    _q: _Queue
    _tag: int
    done: bool  # acked or nacked
    _rec: DecodedRecord | None

    @property
    def record(self) -> DecodedRecord:
        """The record as stored (its body inflated), decoded at the first call."""
        rec = self._rec
        if rec is None:
            rec = self._rec = _decode(self._raw)
        return rec

    @property
    def topic(self) -> str:
        rec = self.record
        return rec.properties.get("RETRY_TOPIC", rec.topic)

    @property
    def body(self) -> bytes:
        body = self._body
        return body if body is not None else self.record.body

    @property
    def queue_id(self) -> int:
        return self.record.queue_id

    @property
    def tags(self) -> str | None:
        return self.record.tags

    @property
    def keys(self) -> str | None:
        return self.record.keys

    @property
    def properties(self) -> dict[str, str]:
        return self.record.properties

    @property
    def msg_id(self) -> str:
        return self.record.msg_id

    @property
    def reconsume_times(self) -> int:
        return self.record.reconsume_times

    def __repr__(self) -> str:
        return (
            f"ConsumedMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, reconsume_times={self.reconsume_times})"
        )


def group_ack_py(msg: ConsumedMessage, lock: LockLike, words: Any) -> int:
    """The reference of `_native.group_ack`, `Consumer.ack`'s fast path (the C twin runs
    it as one step under the GIL: see ipc/native/mqs_group_ack.c for why that needs no
    lock when nobody holds it). -1 when the lock is held, or `msg`'s queue is not active,
    is another grant's or its lease ran out (nothing changed: the caller acks under the
    lock); 0 when `msg` was acked or nacked before; else 1: `msg` is done, the done ones
    at the left of the queue's inflight leave, and the commit point (`_Queue.commit_point`)
    is stored in the queue's slot of `words` when it fits one."""
    if lock.locked():
        return -1
    if msg.done:
        return 0
    q = msg._q
    if q.state != "active" or q.tag != msg._tag or time.monotonic() >= q.deadline:
        return -1
    if not 0 <= q.slot < len(words):
        raise ValueError("slot is not an aligned 8-byte word of words")
    msg.done = True
    point = q.commit_point()
    if 0 <= point <= group_slots.OFFSET_MASK:
        words[q.slot] = q.word | point
    return 1


group_ack: Final = _native.group_ack  # the C twin, what `Consumer.ack` calls


pull.register_lazy(ConsumedMessage, ("_raw", "_body", "queue_offset", "_q", "_tag", "done", "_rec"))


class Consumer:
    """A member of consumer group `group` on `topics`. Make with `StoreClient.consumer`.

    Thread-safe: `poll`, `ack` and `nack` may be called from any thread."""

    def __init__(
        self,
        client: MemberClient,
        group: str,
        topics: str | Sequence[str],
        *,
        from_where: FromWhere = "first",
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        session_ms: int = 2000,
        pull_batch: int = PULL_BATCH,
        retry: bool = True,
    ) -> None:
        check_group(group)
        tps = [topics] if isinstance(topics, str) else list(topics)
        if not tps:
            raise ValueError("a consumer needs at least one topic")
        for t in tps:
            check_topic(t)
            if not isinstance(t, str):
                raise TypeError("topics must be str")
        if from_where not in ("first", "last"):
            raise ValueError(f"from_where must be 'first' or 'last', not {from_where!r}")
        if type(max_reconsume_times) is not int or not 0 <= max_reconsume_times <= 10_000:
            raise ValueError("max_reconsume_times must be an int in 0..10000")
        if type(session_ms) is not int or not 300 <= session_ms <= 60_000:
            raise ValueError("session_ms must be an int in 300..60000")
        if type(pull_batch) is not int or not 1 <= pull_batch <= 1024:
            raise ValueError("pull_batch must be an int in 1..1024")
        retry_topic = RETRY_PREFIX + group
        if retry and retry_topic not in tps:
            tps.append(retry_topic)
        self.group = group
        self.topics: tuple[str, ...] = tuple(dict.fromkeys(tps))
        self.from_where = from_where
        self.max_reconsume_times = max_reconsume_times
        self.session_ms = session_ms
        self.pull_batch = pull_batch
        self._client = client
        self._serial = next(_SERIALS)
        self._reads: ClientReads = for_client(client)
        self._lock = threading.Lock()
        self._changed = threading.Event()  # grants changed: a waiting poll looks again
        self._beat_now = threading.Event()  # a release is pending, or closing
        self._queues: dict[int, _Queue] = {}  # by tag
        self._release: list[int] = []
        # tags this member dropped on its own (its lease ran out here): a grant of one
        # still listed in a reply sent before the supervisor had our release is not ours
        self._lapsed: set[int] = set()
        self._rtt_ms = 0  # the last beat's round trip, told to the supervisor
        self._redo: deque[tuple[float, ConsumedMessage]] = deque()
        self._rr = 0
        self._slots: group_slots.Slots | None = None
        # the process of the supervisor whose grants this member holds (its pidfd,
        # polled): once it exited, its leases are void (`_run_ended`)
        self._run: select.poll | None = None
        self._run_fd = -1
        self._closed = False
        self._joined = threading.Event()
        self._join_error: BaseException | None = None
        self.member_id: str | None = None
        self.beat_s = 0.1
        self.rebalances = 0  # grant changes seen
        self._current: ConsumedMessage | None = None  # the iterator's message
        self._thread = threading.Thread(
            target=self._membership, name=f"mqstore-consumer-{group}", daemon=True
        )
        self._thread.start()
        if not self._joined.wait(30.0) or self._join_error is not None:
            self.close()
            if self._join_error is not None:
                raise self._join_error
            raise channel.SupervisorUnavailable("the consumer could not join its group")

    # --- membership (its own thread) ----------------------------------------------------

    def _membership(self) -> None:
        first = True
        while not self._closed:
            try:
                sock = channel.connect(self._client.store_dir)
            except channel.SupervisorRefused as e:
                self._fail_join(e)
                return
            except channel.SupervisorUnavailable as e:
                if first:
                    self._fail_join(e)
                    return
                self._drop_all()
                self._beat_now.wait(_RECONNECT_S)
                continue
            try:
                self._session(sock, first)
                first = False
            except (OSError, ValueError, KeyError, TypeError) as e:
                if first and not self._joined.is_set():
                    self._fail_join(e)
                    sock.close()
                    return
                first = False
            finally:
                sock.close()
                self._drop_all()  # a new connection is a new member: what we held is gone
                self._watch_run(None)
            if not self._closed:
                self._beat_now.wait(_RECONNECT_S)

    def _watch_run(self, sock: socket.socket | None) -> None:
        """Watch the process of the supervisor at the other end of `sock` (None: stop
        watching), which this session's grants come from. Raises OSError."""
        run, fd = None, -1
        if sock is not None:
            fd = os.pidfd_open(access.peer_pid(sock))
            run = select.poll()
            run.register(fd, select.POLLIN)
        with self._lock:  # `_run_ended` runs under it: it never polls a closed pidfd
            old_fd = self._run_fd
            self._run, self._run_fd = run, fd
        if old_fd >= 0:
            os.close(old_fd)

    def _run_ended(self) -> bool:
        """(Lock held.) The supervisor that granted this member's leases has exited (a pidfd polls
        readable then). Its leases are void however long they have left: the next run
        hands the queues out after its grace, and the slot file they write to is no
        longer read (a new run makes a new one)."""
        run = self._run
        return run is not None and bool(run.poll(0))

    def _fail_join(self, e: BaseException) -> None:
        self._join_error = e
        self._joined.set()

    def _session(self, sock: socket.socket, first: bool) -> None:
        """Join on `sock` and beat until closed or the connection breaks."""
        sock.settimeout(max(self.session_ms / 1000, 1.0))
        buf = bytearray()
        join: dict[str, Any] = {
            "op": "group_join",
            "group": self.group,
            "topics": list(self.topics),
            "session_ms": self.session_ms,
        }
        if self.member_id is not None:
            # the member this one was, whose queues `_drop_all` dropped: the supervisor
            # frees what it held now (`group_coord._forget_previous`)
            join["previous"] = self.member_id
        self._watch_run(sock)
        t_send, reply = self._exchange(sock, buf, join)
        if "error" in reply:
            if first:
                raise ValueError(f"joining group {self.group!r}: {reply['error']}")
            raise OSError(reply["error"])
        self.member_id = str(reply["member"])
        self.beat_s = int(reply.get("beat_ms", 100)) / 1000
        if self._slots is None:
            self._slots = group_slots.Slots.open(self._client.store_dir, self.group)
        self._apply(reply, t_send)
        self._joined.set()
        leaving = False
        while True:
            self._beat_now.wait(self.beat_s)
            self._beat_now.clear()
            leaving = self._closed
            with self._lock:
                now = time.monotonic()
                for q in [q for q in self._queues.values() if q.deadline <= now]:
                    self._lapse(q)
                release, self._release = self._release, []
                if leaving:
                    for q in self._queues.values():
                        self._write_slot(q)
                        release.append(q.tag)
                    self._queues.clear()
            op = "group_leave" if leaving else "group_beat"
            t_send, reply = self._exchange(
                sock,
                buf,
                {
                    "op": op,
                    "group": self.group,
                    "member": self.member_id,
                    "release": release,
                    "rtt_ms": self._rtt_ms,
                },
            )
            if leaving:
                return
            if "error" in reply:
                raise OSError(reply["error"])
            self._apply(reply, t_send)
            with self._lock:  # the supervisor has ended these: no reply lists them again
                self._lapsed.difference_update(release)

    def _exchange(
        self, sock: socket.socket, buf: bytearray, req: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        """Send `req`, wait for its reply: (the time it was sent, the reply). The one seam
        where the tests make a beat late."""
        t_send = time.monotonic()
        channel.send_json(sock, req)
        reply = channel.recv_json(sock, buf)
        self._rtt_ms = min(int((time.monotonic() - t_send) * 1000), 10_000_000)
        return t_send, reply

    def _apply(self, reply: dict[str, Any], t_send: float) -> None:
        with self._lock:
            seen: set[int] = set()
            changed = False
            now = time.monotonic()
            for t, qid, tag, slot, start, left in reply.get("grants", []):
                seen.add(tag)
                if tag in self._lapsed:  # dropped here already; released at the next beat
                    continue
                q = self._queues.get(tag)
                if t_send + left <= now:  # the reply came after the lease it renews ended
                    if q is None:
                        self._lapsed.add(tag)
                        self._release.append(tag)
                        self._beat_now.set()
                    else:
                        self._lapse(q)
                    changed = True
                elif q is None:
                    q = _Queue(t, qid, tag, slot, start, t_send + left, owner=self._serial)
                    q.next_fetch = start
                    self._queues[tag] = q
                    changed = True
                else:
                    q.deadline = t_send + left
            for tag in reply.get("revoke", []):
                seen.add(tag)
                q = self._queues.get(tag)
                if q is not None and q.state == "active":
                    self._revoke(q)
                    changed = True
                elif q is None and tag not in self._lapsed:
                    # granted and revoked between two of our beats: never taken up,
                    # so handed back now (else the next owner waits for its lease)
                    self._release.append(tag)
                    self._beat_now.set()
            for tag in reply.get("cancel", []):
                q = self._queues.pop(tag, None)
                if q is not None:
                    q.state = "dropped"  # a reset: its offsets are not ours to write
                    changed = True
                self._release.append(tag)
            for tag in [tag for tag in self._queues if tag not in seen]:
                self._queues.pop(tag).state = "dropped"
                changed = True
            if changed:
                self.rebalances += 1
        if changed:
            self._changed.set()

    def _revoke(self, q: _Queue) -> None:
        """Fetch no more of `q`; hand it back once what it delivered is settled."""
        if q.buffer:  # fetched, never delivered: the next owner fetches them again
            q.next_fetch = q.buffer[q.pos].queue_offset
        q.unbuffer()
        q.state = "revoking"
        self._write_slot(q)
        if not q.inflight:  # `_write_slot` let the acked ones go
            self._queues.pop(q.tag, None)
            q.state = "dropped"
            self._release.append(q.tag)
            self._beat_now.set()

    def _lapse(self, q: _Queue) -> None:
        """`q`'s lease ran out here (lock held): drop it for good and hand it back. Its
        slot keeps the commit point written while the lease held; what was delivered
        after it is delivered again (by whoever the supervisor grants the queue next,
        from that slot), and an ack of it returns False. A later reply that still lists
        this grant does not revive it: an ack refused here is never followed by a
        commit that passes it."""
        if self._queues.get(q.tag) is q:
            del self._queues[q.tag]
            self._release.append(q.tag)
            self._lapsed.add(q.tag)
            self._beat_now.set()
            self._changed.set()
        q.state = "dropped"
        q.unbuffer()

    def _drop_all(self) -> None:
        with self._lock:
            for q in self._queues.values():
                q.state = "dropped"
            self._queues.clear()
            self._release.clear()
            self._lapsed.clear()
        self._changed.set()

    def _write_slot(self, q: _Queue) -> None:
        """Store `q`'s commit point in its slot, while it is ours and its lease holds
        (lock held). `_resolve` calls it after reading outside the lock, when `q` may
        have been cancelled and released meanwhile."""
        point = q.commit_point()
        if (
            point >= 0
            and q.state != "dropped"  # released, or cancelled: its slot may be another's
            and self._slots is not None
            and time.monotonic() < q.deadline
        ):
            self._slots.write(q.slot, q.tag, point)

    # --- consuming ----------------------------------------------------------------------

    def _resolve(self, q: _Queue) -> None:
        """The start of a queue the group has no offset in (RocketMQ's ConsumeFromWhere;
        a retry queue always from its first message)."""
        if q.next_fetch >= 0:
            return
        first = self.from_where == "first" or q.topic.startswith(RETRY_PREFIX)
        got = (
            self._reads.min_offset(q.topic, q.queue_id)
            if first
            else self._reads.max_offset(q.topic, q.queue_id)
        )
        with self._lock:
            if q.next_fetch < 0:
                q.next_fetch = got
                self._write_slot(q)

    def _fill(self) -> bool:
        """Fetch for each active queue with nothing buffered. True when anything came."""
        with self._lock:
            now = time.monotonic()
            todo = [
                q
                for q in self._queues.values()
                if q.state == "active"
                and not q.buffer
                and len(q.inflight) < MAX_INFLIGHT_PER_QUEUE
                and q.deadline > now
            ]
        if not todo:
            return False
        for q in todo:
            self._resolve(q)
        offsets = [q.next_fetch for q in todo]
        batch = self.pull_batch
        pulls = zip(todo, offsets, strict=True)
        results = self._reads.pull_into(
            [(q.topic, q.queue_id, off, batch, (q, q.tag)) for q, off in pulls]
        )
        got_any = False
        with self._lock:
            for q, offset, res in zip(todo, offsets, results, strict=True):
                if q.state != "active" or q.next_fetch != offset:
                    continue
                if res.messages:
                    q.buffer.extend(cast(list[ConsumedMessage], res.messages))
                    q.next_fetch = res.next_offset
                    got_any = True
                elif (
                    res.status
                    in (
                        GetMessageStatus.OFFSET_TOO_SMALL,
                        GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                        GetMessageStatus.NO_MATCHED_MESSAGE,
                        GetMessageStatus.OFFSET_FOUND_NULL,
                    )
                    and res.next_offset != offset
                ):
                    q.next_fetch = res.next_offset  # RocketMQ's corrected offset
                    self._write_slot(q)
                    got_any = True
        return got_any

    def _take(self, max_count: int) -> list[ConsumedMessage]:
        """Hand over up to `max_count` messages of queues whose lease covers the hand-over.

        The lease is checked twice on the monotonic clock, under the lock: per queue as
        its messages are taken, and once more for the whole batch as the last step
        before it is returned, so that a stop (SIGSTOP, a long deschedule) inside this
        method cannot hand over messages of a lease that ended meanwhile: those are
        dropped (not delivered, not acked; the queue's next owner delivers them). That
        last step also drops the batch when the supervisor that granted the leases has
        exited (`_run_ended`): a new run may have granted the queues again. What
        remains is the return itself: a stop between the last check and the caller's
        use of the batch hands it over late (docs/consumers.md, "At least once")."""
        out: list[ConsumedMessage] = []
        with self._lock:
            now = time.monotonic()
            earliest = float("inf")  # the first lease end among the queues taken from
            while self._redo and self._redo[0][0] <= now and len(out) < max_count:
                _due, m = self._redo.popleft()
                q = m._q
                if q.state != "dropped" and q.tag == m._tag and q.deadline > now:
                    out.append(m)
                    earliest = min(earliest, q.deadline)
            qs = [q for q in self._queues.values() if q.state == "active" and q.buffer]
            if len(qs) > 1:  # round robin: start at the next queue each time
                self._rr = (self._rr + 1) % len(qs)
                qs = qs[self._rr :] + qs[: self._rr]
            for q in qs:  # a run of each queue's buffer in turn
                left = max_count - len(out)
                if left <= 0:
                    break
                if q.deadline <= now:  # lease over: deliver no more, hand it back
                    self._lapse(q)
                    continue
                buf, pos = q.buffer, q.pos
                end = min(pos + left, len(buf))
                got = buf[pos:end]
                if end == len(buf):
                    q.unbuffer()
                else:
                    q.pos = end
                q.inflight.extend(got)
                out.extend(got)
                earliest = min(earliest, q.deadline)
            if out and time.monotonic() >= earliest:  # a lease ended while taking
                out = self._drop_lapsed(out)
            if out and self._run_ended():  # the supervisor died: every lease is void
                for m in out:
                    self._lapse(m._q)
                out = []
        return out

    def _drop_lapsed(self, out: list[ConsumedMessage]) -> list[ConsumedMessage]:
        """`out` without the messages of queues whose lease ended by now, those queues
        dropped for good (`_lapse`; lock held)."""
        now = time.monotonic()
        keep: list[ConsumedMessage] = []
        for m in out:
            q = m._q
            if q.deadline > now:
                keep.append(m)
            elif q.state != "dropped":
                self._lapse(q)
        return keep

    def poll(self, max_count: int = 32, timeout: float = 1.0) -> list[ConsumedMessage]:
        """Up to `max_count` messages of the queues this member owns, waiting up to
        `timeout` seconds for one. Ack or nack each."""
        if self._closed:
            raise ConsumerClosed("the consumer is closed")
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        deadline = time.monotonic() + timeout
        while True:
            out = self._take(max_count)
            if out:
                return out
            seen = self._reads.dispatched()
            self._changed.clear()
            if self._fill():
                continue
            step = POLL_STEP_S
            while self._reads.dispatched() == seen and not self._changed.is_set():
                now = time.monotonic()
                left = deadline - now
                if left <= 0 or self._closed or (self._redo and self._redo[0][0] <= now):
                    return self._take(max_count)
                time.sleep(min(step, left))
                step = min(step * 2, POLL_MAX_STEP_S)

    def ack(self, msg: ConsumedMessage) -> bool:
        """Done with `msg`: its queue's committed offset may pass it (stored in the
        group's slot before this returns). False when the queue is no longer this
        member's (the next owner delivers it again). TypeError when `msg` is not a
        message, ValueError when another consumer delivered it: nothing changes."""
        if type(msg) is not ConsumedMessage or msg._q.owner != self._serial:
            _ours(self, msg)  # raises (inline above: this is the hot path)
        slots = self._slots
        if slots is not None:  # in one C call while the lock is free (`group_ack_py`)
            got = group_ack(msg, self._lock, slots.words)
            if got >= 0:
                return got == 1
        with self._lock:
            if msg.done:
                return False
            msg.done = True
            q = msg._q
            if q.state == "dropped" or q.tag != msg._tag:
                return False
            if time.monotonic() >= q.deadline:  # the lease ran out: not ours to commit
                self._lapse(q)
                return False
            self._commit(q)
            return True

    def ack_many(self, msgs: Sequence[ConsumedMessage]) -> int:
        """`ack` each of `msgs`, under one lock and with one slot store per queue: how
        many were accepted (the others' queues are no longer this member's). TypeError or
        ValueError (as `ack`) when one of `msgs` is not this consumer's: nothing changes."""
        msgs = [_ours(self, m) for m in msgs]
        done = 0
        with self._lock:
            now = time.monotonic()
            last: _Queue | None = None
            touched: list[_Queue] = []
            for msg in msgs:
                if msg.done:
                    continue
                msg.done = True
                q = msg._q
                if q is not last:  # a poll's messages come in runs of one queue
                    if q.state == "dropped" or q.tag != msg._tag:
                        continue
                    if now >= q.deadline:  # the lease ran out: not ours to commit
                        self._lapse(q)
                        continue
                    last = q
                    touched.append(q)
                done += 1
            for q in dict.fromkeys(touched):
                self._commit(q)
        return done

    def _commit(self, q: _Queue) -> None:
        """Store `q`'s commit point; hand a revoked queue back once settled (lock held;
        the caller checked the lease an instant ago)."""
        inflight = q.inflight
        while inflight and inflight[0].done:  # acked (or nacked): passed
            inflight.popleft()
        if inflight:
            point = inflight[0].queue_offset
        elif q.buffer:
            point = q.buffer[q.pos].queue_offset
        else:
            point = q.next_fetch
        slots = self._slots
        if 0 <= point <= group_slots.OFFSET_MASK and slots is not None:
            slots.words[q.slot] = q.word | point
        if q.state == "revoking" and not inflight:
            self._queues.pop(q.tag, None)
            q.state = "dropped"
            self._release.append(q.tag)
            self._beat_now.set()

    def nack(self, msg: ConsumedMessage, delay_level: int = 0) -> PutResult:
        """Processing `msg` failed: send it back (`StoreClient.send_back`: to
        `%RETRY%<group>` with the next delay level, or `%DLQ%<group>` after
        `max_reconsume_times`), then ack it here. When the send-back fails, the message
        is delivered again by this member after `LOCAL_RETRY_S` (RocketMQ's client does
        the same) and the failed result is returned. TypeError or ValueError (as `ack`)
        when `msg` is not this consumer's: nothing is sent back."""
        _ours(self, msg)
        res = self._client.send_back(
            msg.record,
            self.group,
            delay_level=delay_level,
            max_reconsume_times=self.max_reconsume_times,
        )
        if res.status is PutMessageStatus.PUT_OK:
            self.ack(msg)
        else:
            with self._lock:
                if not msg.done:
                    self._redo.append((time.monotonic() + LOCAL_RETRY_S, msg))
        return res

    # --- the iterator form --------------------------------------------------------------

    def __iter__(self) -> Iterator[ConsumedMessage]:
        """Messages one at a time, until the consumer is closed: asking for the next
        acks the one before; an exception that leaves the loop inside `with consumer`
        nacks it (`__exit__`)."""
        while not self._closed:
            cur = self._current
            if cur is not None and not cur.done:
                self.ack(cur)
            self._current = None
            try:
                batch = self.poll(self.pull_batch, 0.5)
            except ConsumerClosed:
                return
            ack = self.ack
            for m in batch:
                self._current = m
                yield m
                if self._closed:  # `__exit__` settles the message in hand
                    return
                if not m.done:
                    ack(m)
            self._current = None

    def run(
        self,
        handler: Callable[[ConsumedMessage], object],
        *,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Call `handler` for each message until the consumer is closed or `until()`
        is true: it returning acks the message, it raising nacks it."""
        while not self._closed and (until is None or not until()):
            for m in self.poll(self.pull_batch, 0.2):
                try:
                    handler(m)
                except Exception:
                    self.nack(m)
                else:
                    self.ack(m)

    # --- views and closing --------------------------------------------------------------

    def assignment(self) -> list[tuple[str, int]]:
        """The queues this member consumes now (topic, queue id), sorted."""
        with self._lock:
            now = time.monotonic()
            return sorted(
                (q.topic, q.queue_id)
                for q in self._queues.values()
                if q.state == "active" and q.deadline > now
            )

    def close(self) -> None:
        """Leave the group: every queue is handed back at its committed offset (what was
        delivered and not acked is delivered again by the next owner)."""
        if self._closed:
            return
        self._closed = True
        self._beat_now.set()
        self._changed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        with self._lock:
            self._queues.clear()
        if self._slots is not None:
            self._slots.close()
            self._slots = None
        self._reads.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        cur = self._current
        if cur is not None and not cur.done:
            with contextlib.suppress(Exception):
                if exc is not None:
                    self.nack(cur)
                else:
                    self.ack(cur)
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self.close()
