"""The consumer-group coordinator: membership, queue allocation and leases, in the
supervisor's own loop (no process of its own).

A consumer (`ipc.consumer.Consumer`) keeps one connection to the supervisor's control
socket for its membership (`ipc.channel` carries the ops):

* `group_join {group, topics, session_ms}` -> `{member, session_ms}`: the connection is
  the member. Its process (the socket's SO_PEERCRED pid) is watched through a pidfd on
  the supervisor's selector: a member killed (SIGKILL included) is known dead the moment
  its process exits, without trusting a pid number;
* `group_beat {group, member, release, rtt_ms}` every `BEAT_S` -> the member's queues:
  `grants` (topic, queue, tag, slot, start offset, lease seconds left), `revoke` (hand
  these back once what you delivered of them is acked) and `cancel` (drop these now: a
  reset); `rtt_ms` is the round trip of the beat before;
* `group_leave {group, member, release}`; `group_info {}` (the `mqstore group` views);
  `group_reset {group, offsets}` (a reset of a running group); `group_delete {group}`
  (forget a group no member runs).

**Allocation** is RocketMQ's `AllocateMessageQueueAveragely`, per topic, over the members
subscribed to it sorted by id (ids sort by join order). It is recomputed whenever a
member joins, leaves or dies, and every `RECHECK_S` (a topic's queue count may change).

**Leases: never two owners.** A grant of a queue to a member lasts `session_ms` from its
last renewal; each beat renews the member's active grants. The member computes its own
deadline from the time it *sent* the beat (before the supervisor renewed), so its lease
always ends first; it delivers nothing of a queue past its deadline. A queue goes to its
next owner only once the old grant is over: released by the member (after its delivered
messages were acked or nacked), its process dead, or its lease run out (a member stopped
with SIGSTOP, or whose beats stopped). A lease over is never renewed (a member drops a
queue whose lease ran out on its side and releases it). A member whose beat round trip
(`rtt_ms`, reported by each beat) reaches half a session is *slow*: it is left out of
the allocation until its round trips are under a quarter of a session. A new supervisor
grants nothing, after a run that did not stop cleanly, for the longest session that run
granted a member (`group_slots.LONGEST_SESSION`, written before the join that raised it
is answered; at least the default session), so every lease of the run before has ended
by then.

**Offsets.** The owner keeps each queue's consumed offset (lowest unacked) in its grant's
slot (`ipc.group_slots`); the coordinator reads the slot when the grant ends and hands the
value to the next owner as its start (a slot whose lease ran out stays fenced until its
member released it or exited: `_end`), and writes every group's offsets to
`config/consumerOffset.json` at most every `PERSIST_S` from a thread of its own (and at
stop), so a restart loses no acked offset that was persisted and redelivers the rest.

**Hostile peers.** Only the store's owner (and with `ipc_allow_group` its group) reaches
the socket at all. Every field is checked; joins are bounded (`MAX_GROUPS`,
`MAX_MEMBERS`, `MAX_TOPICS`); a member acts only on its own connection; nothing a request
holds makes the loop wait. A member that never beats loses its queues after its session.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from mqstore.engine import deleted_topics, topics
from mqstore.engine.names import group_problem, topic_problem
from mqstore.engine.offsets import NO_OFFSET, ConsumerOffsets
from mqstore.ipc import access, group_slots
from mqstore.workers.control_socket import Conn

BEAT_S: Final = 0.1  # how often members beat (told in the join reply)
RECHECK_S: Final = 1.0
PERSIST_S: Final = 1.0
SLOT_READ_S: Final = 0.25
FLUSH_WAIT_S: Final = 5.0
DELETED_CHECK_S: Final = 0.05  # how often deletedTopics.json is looked at (one stat)
MAX_GROUPS: Final = 256
MAX_MEMBERS: Final = 1024  # over all groups
MAX_TOPICS: Final = 64
MAX_RELEASE: Final = 4096
MIN_SESSION_MS: Final = 300
MAX_SESSION_MS: Final = 60_000
DEFAULT_SESSION_MS: Final = 2_000
MAX_QUEUES: Final = topics.MAX_QUEUE_NUMS
RETRY_PREFIX: Final = "%RETRY%"
State = Literal["active", "revoking", "cancelled"]
Key = tuple[str, int]


def allocate_averagely(queues: list[Key], members: list[str], me: str) -> list[Key]:
    """RocketMQ's AllocateMessageQueueAveragely.allocate: `me`'s share of `queues` (sorted
    as given) among `members` (sorted as given)."""
    if me not in members or not queues:
        return []
    index = members.index(me)
    n, m = len(queues), len(members)
    mod = n % m
    if n <= m:
        average = 1
    elif mod > 0 and index < mod:
        average = n // m + 1
    else:
        average = n // m
    start = index * average if mod > 0 and index < mod else index * average + mod
    span = min(average, n - start)
    return [queues[(start + i) % n] for i in range(span)]


@dataclass(eq=False)
class Member:
    id: str
    group: str
    topics: tuple[str, ...]
    conn: Conn | None
    pid: int
    pidfd: int
    session_s: float
    last_beat: float
    gone: bool = False  # left, closed or timed out: no longer allocated to
    slow: bool = False  # its beat replies reach it too late to use its leases
    # slots of grants whose lease ran out, by tag: the member may still store into
    # them (a thread stopped between its lease check and its store), so none is granted
    # again until the member releases the tag or its process exits (`Coordinator._end`)
    fenced: dict[int, int] = field(default_factory=dict)


@dataclass(eq=False)
class Grant:
    key: Key
    member: Member
    tag: int
    slot: int
    start: int
    expiry: float
    state: State = "active"


@dataclass(eq=False)
class Group:
    name: str
    slots: group_slots.Slots
    members: dict[str, Member] = field(default_factory=dict)
    grants: dict[Key, Grant] = field(default_factory=dict)
    offsets: dict[Key, int] = field(default_factory=dict)  # known consumed offsets
    dirty: set[Key] = field(default_factory=set)
    free: deque[int] = field(default_factory=lambda: deque(range(group_slots.SLOTS)))
    rebalance: bool = True
    rebalances: int = 0
    last_rebalance: float = 0.0


@dataclass(frozen=True)
class _Forget:
    topic: str | None  # None: nothing to forget, `done` says the writes before are done
    done: threading.Event


class _Persister:
    """Writes offsets to consumerOffset.json on a thread of its own, so an fsync never
    holds the supervisor's loop."""

    def __init__(self, store_dir: str, say: Callable[[str, str], None]) -> None:
        self._offsets = ConsumerOffsets(store_dir)
        self._say = say
        self._q: queue.Queue[tuple[str, list[tuple[str, int, int]]] | _Forget | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(target=self._run, name="mqstore-group-offsets")
        self._thread.daemon = True
        self._thread.start()

    def submit(self, group: str, entries: list[tuple[str, int, int]]) -> None:
        self._q.put((group, entries))

    def flush(self, timeout_s: float) -> bool:
        """Wait until what was submitted before is written (False: not within
        `timeout_s`)."""
        done = threading.Event()
        self._q.put(_Forget(None, done))
        return done.wait(timeout_s)

    def forget(self, topic: str, done: threading.Event) -> None:
        """Remove every group's offsets of `topic` once what was submitted before is
        written; `done` is set then (also when it failed: said)."""
        self._q.put(_Forget(topic, done))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if isinstance(item, _Forget):
                try:
                    if item.topic is not None:
                        self._offsets.delete(None, item.topic)
                except (OSError, ValueError) as e:
                    self._say(f"could not forget the offsets of topic {item.topic}: {e}", "ERROR")
                item.done.set()
                continue
            try:
                self._offsets.commit_many(*item)
            except (OSError, ValueError) as e:
                self._say(f"could not persist offsets of group {item[0]}: {e}", "ERROR")

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()


def _exited(pidfd: int) -> bool:
    """The process of `pidfd` has exited (a pidfd polls readable then). poll, not
    select: a descriptor past 1023 is fine."""
    if pidfd < 0:
        return True
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


class Coordinator:
    """The groups of one running store. Main loop only (but for `_Persister`)."""

    def __init__(
        self,
        store_dir: str,
        say: Callable[[str, str], None],
        default_queue_nums: Callable[[], int],
        file_mode: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store_dir = store_dir
        self._say = say
        self._default_nums = default_queue_nums
        self._file_mode = file_mode
        self._clock = clock
        self.groups: dict[str, Group] = {}
        self._committed = ConsumerOffsets(store_dir)
        self._persister: _Persister | None = None
        self._sel: selectors.BaseSelector | None = None
        self._by_pidfd: dict[int, Member] = {}
        self._seq = 0
        self._tag = 0
        self._started = clock()
        # A run that did not stop cleanly left slot files: a member of that run may
        # believe for up to its session that it owns queues; grant nothing until then.
        # Its longest session stays the floor of this run's (a crash within the grace
        # leaves those leases as they were).
        self._longest_ms = 0
        left = os.path.join(store_dir, group_slots.GROUPS_DIR)
        with contextlib.suppress(OSError):
            if any(n.endswith(".slots") for n in os.listdir(left)):
                self._longest_ms = group_slots.read_longest_session(store_dir)
                self._started += max(DEFAULT_SESSION_MS, self._longest_ms) / 1000
        self._grace_until = self._started
        # Topics deleted while running (`mqstore topic DIR delete T`): seen through
        # `config/deletedTopics.json` (`_check_deletions`); `_unsure` holds those whose
        # file offsets may still be the deleted topic's, until the persister forgot them.
        self._deleted_path = deleted_topics.path(store_dir)
        self._deleted_stamp = self._deletions_stamp()
        try:
            self._deleted_ends = deleted_topics.load(store_dir)
        except (OSError, ValueError):
            self._deleted_ends = {}
        self._unsure: dict[str, threading.Event] = {}
        self._last_deleted_check = 0.0
        self._last_recheck = 0.0
        self._last_persist = 0.0
        self._last_slot_read = 0.0

    # --- wiring -------------------------------------------------------------------------

    def attach_selector(self, sel: selectors.BaseSelector) -> None:
        self._sel = sel

    def on_ready(self, key: selectors.SelectorKey) -> bool:
        """A member's pidfd turned readable (its process exited); False if not ours."""
        m = self._by_pidfd.get(key.fd)
        if m is None:
            return False
        self._dead(m)
        return True

    def on_close(self, conn: Conn) -> None:
        m = conn.member
        if not isinstance(m, Member):
            return
        conn.member = None
        m.conn = None
        if _exited(m.pidfd):
            self._dead(m)
        else:
            self._gone(m, "its connection closed")

    # --- requests -----------------------------------------------------------------------

    def handle(self, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        op = req["op"]
        if op == "group_info":
            return self.info()
        why = group_problem(req.get("group"))
        if why is not None:
            return {"error": f"bad request: {why}"}
        group: str = req["group"]
        if op == "group_join":
            return self._join(group, req, conn)
        if op == "group_reset":
            return self._reset(group, req)
        if op == "group_delete":
            return self._delete(group)
        m = conn.member
        if not isinstance(m, Member) or m.group != group or m.id != req.get("member"):
            return {"error": "not a member on this connection", "rejoin": True}
        release = req.get("release", [])
        if not isinstance(release, list) or len(release) > MAX_RELEASE:
            return {"error": "bad request: release must be a list of tags"}
        self._release(m, [t for t in release if type(t) is int])
        rtt = req.get("rtt_ms")
        if type(rtt) is int and 0 <= rtt <= 10**7:
            self._note_rtt(m, rtt / 1000)
        if op == "group_leave":
            self._gone(m, "it left")
            conn.member = None
            return {"ok": True}
        if op == "group_beat":
            if m.gone:
                return {"error": "no longer a member", "rejoin": True}
            return self._beat(m)
        return {"error": f"bad request: unknown op {op!r}"}

    def _join(self, name: str, req: dict[str, Any], conn: Conn) -> dict[str, Any]:
        if isinstance(conn.member, Member):
            return {"error": "this connection is a member already"}
        tps = req.get("topics")
        if not isinstance(tps, list) or not 0 < len(tps) <= MAX_TOPICS:
            return {"error": f"bad request: topics must be a list of 1..{MAX_TOPICS} topics"}
        for t in tps:
            why = topic_problem(t)
            if why is not None:
                return {"error": f"bad request: {why}"}
        session_ms = req.get("session_ms", DEFAULT_SESSION_MS)
        if type(session_ms) is not int or not MIN_SESSION_MS <= session_ms <= MAX_SESSION_MS:
            return {"error": f"bad request: session_ms must be {MIN_SESSION_MS}..{MAX_SESSION_MS}"}
        if sum(len(g.members) for g in self.groups.values()) >= MAX_MEMBERS:
            return {"error": f"too many group members (max {MAX_MEMBERS})"}
        g = self.groups.get(name)
        if g is None:
            if len(self.groups) >= MAX_GROUPS:
                self._forget_idle_groups()
            if len(self.groups) >= MAX_GROUPS:
                return {"error": f"too many groups (max {MAX_GROUPS})"}
            try:
                slots = group_slots.Slots.create(self.store_dir, name, self._file_mode())
            except (OSError, ValueError) as e:
                return {"error": f"cannot create the group's slot file: {e}"}
            g = self.groups[name] = Group(name, slots)
        if session_ms > self._longest_ms:  # before any grant of this session's length
            try:
                group_slots.write_longest_session(self.store_dir, session_ms, self._file_mode())
            except OSError as e:
                return {"error": f"cannot record the member's session: {e}"}
            self._longest_ms = session_ms
        try:
            pid = access.peer_pid(conn.sock)
            pidfd = os.pidfd_open(pid)
        except OSError as e:
            return {"error": f"cannot watch the member's process: {e}"}
        self._forget_previous(g, req.get("previous"), pid)
        self._seq += 1
        now = self._clock()
        m = Member(
            f"{self._seq:08d}@{pid}",
            name,
            tuple(dict.fromkeys(tps)),
            conn,
            pid,
            pidfd,
            session_ms / 1000,
            now,
        )
        g.members[m.id] = m
        conn.member = m
        self._by_pidfd[pidfd] = m
        if self._sel is not None:
            self._sel.register(pidfd, selectors.EVENT_READ)
        g.rebalance = True
        self._rebalance(g)
        return {
            "member": m.id,
            "session_ms": session_ms,
            "beat_ms": int(BEAT_S * 1000),
            **self._beat(m),
        }

    def _forget_previous(self, g: Group, previous: object, pid: int) -> None:
        """A member rejoining after its connection broke names the member it was
        (`previous`): it dropped every queue of that one before connecting again, so
        what that one held (grants, fenced slots) is released now rather than at lease
        end or at its exit. Only a member of the same live process is taken at its word."""
        old = g.members.get(previous) if isinstance(previous, str) else None
        if old is None or old.conn is not None or old.pid != pid or _exited(old.pidfd):
            return
        self._release(old, [gr.tag for gr in g.grants.values() if gr.member is old])
        self._release(old, list(old.fenced))
        if not old.gone:
            self._gone(old, "it joined again")
        elif not old.fenced and not any(gr.member is old for gr in g.grants.values()):
            g.members.pop(old.id, None)
            self._unwatch(old)

    def _note_rtt(self, m: Member, rtt_s: float) -> None:
        """A member whose beat replies reach it more than half a session after it sent
        the beat keeps too little of each lease to consume (none past a whole session):
        its queues go to the others until its replies are quick again (under a quarter
        of a session). It stays a member; if every member is slow, they all share."""
        slow = rtt_s >= m.session_s / 2 or (m.slow and rtt_s >= m.session_s / 4)
        if slow != m.slow and not m.gone:
            m.slow = slow
            g = self.groups[m.group]
            g.rebalance = True
            self._say(
                f"group {m.group}: member {m.id}'s beat replies take {rtt_s * 1000:.0f} ms "
                f"(session {m.session_s:g} s): "
                + ("its queues go to the others" if slow else "it gets queues again"),
                "WARNING" if slow else "INFO",
            )

    def _beat(self, m: Member) -> dict[str, Any]:
        now = self._clock()
        m.last_beat = now
        g = self.groups[m.group]
        # a lease over is over, even if the tick has not ended it yet: the member's own
        # lease ended before ours, so it may have dropped the queue and refused acks
        for gr in [gr for gr in g.grants.values() if gr.member is m and gr.expiry <= now]:
            self._end(g, gr, lapsed=True)
        self._rebalance(g)
        grants, revoke, cancel = [], [], []
        for gr in g.grants.values():
            if gr.member is not m:
                continue
            if gr.state == "active":
                gr.expiry = now + m.session_s
                t, q = gr.key
                grants.append([t, q, gr.tag, gr.slot, gr.start, gr.expiry - now])
            elif gr.state == "revoking":
                revoke.append(gr.tag)
            else:
                cancel.append(gr.tag)
        return {"grants": grants, "revoke": revoke, "cancel": cancel}

    def _release(self, m: Member, tags: list[int]) -> None:
        if not tags:
            return
        want = set(tags)
        g = self.groups[m.group]
        for gr in [gr for gr in g.grants.values() if gr.member is m and gr.tag in want]:
            self._end(g, gr)
        for tag in want & m.fenced.keys():  # it dropped the queue: it stores there no more
            g.free.append(m.fenced.pop(tag))

    def _reset(self, name: str, req: dict[str, Any]) -> dict[str, Any]:
        entries = req.get("offsets")
        if not isinstance(entries, list) or len(entries) > MAX_QUEUES * MAX_TOPICS:
            return {"error": "bad request: offsets must be a list of [topic, queue, offset]"}
        todo: list[tuple[str, int, int]] = []
        for e in entries:
            if (
                not isinstance(e, list)
                or len(e) != 3
                or topic_problem(e[0]) is not None
                or type(e[1]) is not int
                or type(e[2]) is not int
                or not 0 <= e[1] < MAX_QUEUES
                or not 0 <= e[2] <= group_slots.OFFSET_MASK
            ):
                return {"error": "bad request: offsets must be a list of [topic, queue, offset]"}
            todo.append((e[0], e[1], e[2]))
        g = self.groups.get(name)
        if g is None:
            return {"running": False}
        live = any(not m.gone for m in g.members.values())
        running = live or bool(g.grants)
        # also an idle group's: offsets cached here would outlive the file's reset
        for t, q, off in todo:
            key = (t, q)
            gr = g.grants.get(key)
            if gr is not None:
                gr.state = "cancelled"  # its owner drops it at its next beat
            g.offsets[key] = off
            g.dirty.add(key)
        self._persist(g)
        if not running:
            return {"running": False}
        return {"running": True, "members": sorted(m.id for m in g.members.values())}

    def _delete(self, name: str) -> dict[str, Any]:
        """Forget a group nobody runs (`mqstore group delete`): its offsets here too."""
        g = self.groups.get(name)
        if g is None:
            return {"ok": True}
        if g.members or g.grants:
            return {"error": f"group {name!r} has {len(g.members)} member(s) running", "busy": True}
        # offsets of its last members still on their way to the file would land after
        # the caller's delete of them: let them land first (milliseconds; an operator's
        # command, rare)
        if self._persister is not None and not self._persister.flush(FLUSH_WAIT_S):
            return {"error": "the group's offsets are still being written; try again"}
        g.slots.close()
        with contextlib.suppress(OSError):
            os.unlink(group_slots.slots_path(self.store_dir, name))
        del self.groups[name]
        return {"ok": True}

    # --- membership changes -------------------------------------------------------------

    def _unwatch(self, m: Member) -> None:
        if m.pidfd >= 0:
            if self._sel is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(m.pidfd)
            self._by_pidfd.pop(m.pidfd, None)
            os.close(m.pidfd)
            m.pidfd = -1

    def _dead(self, m: Member) -> None:
        """The member's process exited: it holds nothing any more."""
        g = self.groups.get(m.group)
        self._unwatch(m)
        if g is None:
            return
        for gr in [gr for gr in g.grants.values() if gr.member is m]:
            self._end(g, gr)
        g.free.extend(m.fenced.values())  # a dead process stores nothing more
        m.fenced.clear()
        if not m.gone:
            self._say(f"group {m.group}: member {m.id} died", "INFO")
        self._gone(m, "its process exited")

    def _gone(self, m: Member, why: str) -> None:
        """No longer allocated to; its grants end when released, at death or expiry."""
        g = self.groups.get(m.group)
        if m.conn is not None:
            m.conn.member = None
            m.conn = None
        m.gone = True
        if g is None:
            return
        g.rebalance = True
        if not m.fenced and not any(gr.member is m for gr in g.grants.values()):
            g.members.pop(m.id, None)
            self._unwatch(m)
        self._rebalance(g)

    def _end(self, g: Group, gr: Grant, *, lapsed: bool = False) -> None:
        """The grant is over: take the offset its owner left in the slot (unless a reset
        cancelled it) and free the queue for its next owner.

        The slot is free again at once when the owner released the grant (it dropped the
        queue, under its lock, before it said so) or its process exited. A grant ended
        because its lease ran out (`lapsed`) keeps its slot *fenced* instead: its owner
        checks its lease and then stores, two steps, and a thread stopped between them
        (SIGSTOP, a long deschedule) stores after the lease is over. Were the slot
        granted again meanwhile (the free list is FIFO: 4,096 grants later), that store
        would overwrite another grant's offset, so the next owner's acks since the last
        slot read would be lost and delivered again. The fence lifts when the owner
        releases the tag (it does at its next beat once it sees its lease over) or
        exits; the queue itself goes to its next owner at once, in another slot."""
        if g.grants.get(gr.key) is not gr:
            return
        del g.grants[gr.key]
        if gr.state != "cancelled":
            tag, off = g.slots.read(gr.slot)
            if tag == gr.tag and g.offsets.get(gr.key) != off:
                g.offsets[gr.key] = off
                g.dirty.add(gr.key)
        m = gr.member
        if lapsed and not _exited(m.pidfd):
            m.fenced[gr.tag] = gr.slot
        else:
            g.free.append(gr.slot)
        g.rebalance = True
        if m.gone and not m.fenced and not any(x.member is m for x in g.grants.values()):
            g.members.pop(m.id, None)
            self._unwatch(m)

    # --- allocation ---------------------------------------------------------------------

    def _queue_count(self, topic: str) -> int:
        default = 1 if topic.startswith(RETRY_PREFIX) else self._default_nums()
        return max(0, min(topics.queue_count(self.store_dir, topic, default), MAX_QUEUES))

    def _rebalance(self, g: Group) -> None:
        if not g.rebalance:
            return
        g.rebalance = False
        now = self._clock()
        live = sorted((m for m in g.members.values() if not m.gone), key=lambda m: m.id)
        target: dict[Key, Member] = {}
        for topic in sorted({t for m in live for t in m.topics}):
            subs = [m for m in live if topic in m.topics]
            subs = [m for m in subs if not m.slow] or subs
            qs = [(topic, q) for q in range(self._queue_count(topic))]
            ids = [m.id for m in subs]
            for m in subs:
                for key in allocate_averagely(qs, ids, m.id):
                    target[key] = m
        changed = False
        for key, gr in g.grants.items():
            if gr.state == "active" and target.get(key) is not gr.member:
                gr.state = "revoking"  # not renewed from now on
                changed = True
        if now >= self._grace_until:
            for key, m in target.items():
                if key not in g.grants and g.free:
                    self._grant(g, key, m, now)
                    changed = True
        else:
            g.rebalance = True  # try again once the grace is over
        if changed:
            g.rebalances += 1
            g.last_rebalance = now
            shares = "; ".join(
                m.id + " " + ",".join(f"{t}:{q}" for (t, q), o in sorted(target.items()) if o is m)
                for m in live
            )
            moving = sum(x.state != "active" for x in g.grants.values())
            self._say(
                f"group {g.name}: rebalance {g.rebalances} (t={now:.3f}): {shares}; "
                f"{moving} queue(s) being handed over",
                "INFO",
            )

    def _grant(self, g: Group, key: Key, m: Member, now: float) -> None:
        start = g.offsets.get(key)
        if start is None and key[0] in self._unsure:
            start = NO_OFFSET  # the file may still hold the deleted topic's offset
        elif start is None:
            start = self._committed.committed(g.name, *key)
            if start != NO_OFFSET:
                g.offsets[key] = start
        self._tag = self._tag % group_slots.TAG_MASK + 1
        slot = g.free.popleft()
        if start >= 0:
            g.slots.write(slot, self._tag, start)
        else:
            g.slots.write(slot, 0, 0)
        g.grants[key] = Grant(key, m, self._tag, slot, start, now + m.session_s)

    # --- the loop's tick ----------------------------------------------------------------

    def tick(self) -> None:
        now = self._clock()
        if now - self._last_deleted_check >= DELETED_CHECK_S:
            self._last_deleted_check = now
            self._check_deletions()
        for g in list(self.groups.values()):
            for gr in [gr for gr in g.grants.values() if gr.expiry <= now]:
                self._end(g, gr, lapsed=True)
            for m in [m for m in g.members.values() if not m.gone]:
                if now - m.last_beat > m.session_s:
                    self._say(
                        f"group {g.name}: member {m.id} sent no beat for "
                        f"{now - m.last_beat:.1f} s (session {m.session_s:g} s): its queues "
                        "go to the others",
                        "WARNING",
                    )
                    self._gone(m, "its session timed out")
            if now - self._last_recheck >= RECHECK_S:
                g.rebalance = True
            self._rebalance(g)
            if now - self._last_slot_read >= SLOT_READ_S:
                for gr in g.grants.values():
                    if gr.state != "cancelled":
                        tag, off = g.slots.read(gr.slot)
                        if tag == gr.tag and g.offsets.get(gr.key) != off:
                            g.offsets[gr.key] = off
                            g.dirty.add(gr.key)
        if now - self._last_recheck >= RECHECK_S:
            self._last_recheck = now
        if now - self._last_slot_read >= SLOT_READ_S:
            self._last_slot_read = now
        if now - self._last_persist >= PERSIST_S:
            self._last_persist = now
            for g in self.groups.values():
                self._persist(g)

    # --- topics deleted while running -------------------------------------------------

    def _deletions_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._deleted_path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _check_deletions(self) -> None:
        """A topic deleted since the last look (its end offset in deletedTopics.json is
        new): `_topic_deleted`. One stat() when nothing changed."""
        for t, done in list(self._unsure.items()):
            if done.is_set():
                del self._unsure[t]
        stamp = self._deletions_stamp()
        if stamp == self._deleted_stamp:
            return
        try:
            ends = deleted_topics.load(self.store_dir)
        except (OSError, ValueError):
            return  # being replaced, or not JSON: the next look
        self._deleted_stamp = stamp
        fresh = sorted(t for t, end in ends.items() if self._deleted_ends.get(t) != end)
        self._deleted_ends = ends
        for t in fresh:
            self._topic_deleted(t)

    def _topic_deleted(self, topic: str) -> None:
        """`topic` was deleted (its queues start again at offset 0): every grant of its
        queues is cancelled as a reset's are (members drop them at their next beat; an
        ack of what they delivered before returns False, and their slots are not read),
        its offsets are forgotten here and, after whatever was submitted before, in
        consumerOffset.json; until then a new grant of its queues starts from no offset
        (`from_where`), never from the deleted topic's. So a member that kept the old
        offsets in memory never commits them again."""
        told = 0
        for g in self.groups.values():
            for key, gr in g.grants.items():
                if key[0] == topic and gr.state != "cancelled":
                    gr.state = "cancelled"
                    told += 1
            for key in [k for k in g.offsets if k[0] == topic]:
                del g.offsets[key]
                g.dirty.discard(key)
            g.rebalance = True
        done = threading.Event()
        self._unsure[topic] = done
        if self._persister is None:
            self._persister = _Persister(self.store_dir, self._say)
        self._persister.forget(topic, done)
        self._say(
            f"topic {topic} was deleted: {told} grant(s) of its queues cancelled, its "
            "group offsets forgotten",
            "INFO",
        )

    def _persist(self, g: Group) -> None:
        if not g.dirty:
            return
        entries = [(t, q, g.offsets[(t, q)]) for t, q in sorted(g.dirty)]
        g.dirty.clear()
        if self._persister is None:
            self._persister = _Persister(self.store_dir, self._say)
        self._persister.submit(g.name, entries)

    def _forget_idle_groups(self) -> None:
        for name, g in list(self.groups.items()):
            if not g.members and not g.grants:
                self._persist(g)
                g.slots.close()
                del self.groups[name]

    def close(self) -> None:
        """At stop: read every slot, persist everything, wait for the writes."""
        for g in self.groups.values():
            for gr in list(g.grants.values()):
                if gr.state != "cancelled":
                    tag, off = g.slots.read(gr.slot)
                    if tag == gr.tag:
                        g.offsets[gr.key] = off
                        g.dirty.add(gr.key)
            self._persist(g)
        if self._persister is not None:
            self._persister.close()
            self._persister = None
        for g in self.groups.values():
            for m in list(g.members.values()):
                self._unwatch(m)
            g.slots.close()
            with contextlib.suppress(OSError):  # a clean stop: no grace at the next start
                os.unlink(group_slots.slots_path(self.store_dir, g.name))
        with contextlib.suppress(OSError):
            os.unlink(group_slots.longest_session_path(self.store_dir))

    # --- views --------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        now = self._clock()
        out: dict[str, Any] = {}
        for name, g in sorted(self.groups.items()):
            queues = []
            for key in sorted(set(g.grants) | set(g.offsets)):
                gr = g.grants.get(key)
                off = g.offsets.get(key)
                if gr is not None and gr.state != "cancelled":
                    tag, o = g.slots.read(gr.slot)
                    if tag == gr.tag:
                        off = o
                queues.append(
                    {
                        "topic": key[0],
                        "queue_id": key[1],
                        "owner": None if gr is None else gr.member.id,
                        "state": None if gr is None else gr.state,
                        "offset": off,
                    }
                )
            out[name] = {
                "members": [
                    {
                        "id": m.id,
                        "pid": m.pid,
                        "topics": list(m.topics),
                        "gone": m.gone,
                        "slow": m.slow,
                        "last_beat_s": round(now - m.last_beat, 3),
                    }
                    for m in g.members.values()
                ],
                "queues": queues,
                "rebalances": g.rebalances,
            }
        return {"groups": out}
