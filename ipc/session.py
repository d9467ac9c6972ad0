"""`Session`: one process's attachment to a running store, kept live.

Attaching asks the supervisor (Unix socket) for the shared-memory names, the store's
settings and file sizes, and this client's statistics row; the control block is mapped
only once the store's owner-only names file vouches for it (`_attach_checked`). The
session holds this process's liveness byte (`ipc.reservation.LiveLock`) while attached.

Staleness: at most every 10 ms (`_STALE_CHECK_S`) a caller's `ensure_live` looks whether
the supervisor stopped (the control block's STOPPED flag) or went away (its end of the
socket closed); then it detaches and attaches again, or says why it cannot. It never
hands out a stale control block.

Fork-safe: a forked child closes its inherited liveness locks at once
(`_after_fork_in_child`) and re-attaches with its own handles on its first call.

What rides on the session overrides its hooks (`_on_attach`, `_on_detach`,
`_forget_parent`, `_before_check`, `_after_check`, `_closing`): the producer
(`ipc.producer`) sets up its C appender on each attach, the client (`ipc.client`) closes
its reads. The read side (`ipc.reads.for_client`) and asyncio (`ipc.aio`) use the public
accessors only: `live_control_block`, `settings`, `geometry`, `sync_timeout_s`,
`flushed_position`, `positions`.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
import weakref
from collections.abc import Mapping
from typing import Any, Final

from mqstore import _native
from mqstore.conf.settings import StoreSettings, settings_from_doc
from mqstore.engine.reader import Geometry
from mqstore.engine.topics import QueueCounts
from mqstore.ipc import access, channel
from mqstore.ipc import control as c
from mqstore.ipc.accepts import NUMBER, PATH, check_types
from mqstore.ipc.control_views import Flags, Positions
from mqstore.ipc.reservation import LiveLock

_STALE_CHECK_S: Final = 0.01
_STALE_CHECK_NS: Final = 10_000_000

# Bumped in every forked child, so a put notices a fork without a getpid() call.
_FORKS = [0]


# The liveness locks of this process's clients: a forked child closes its copies at
# once (the lock is the open file description's, shared with the parent: a copy kept in
# a child would make a dead parent look alive, and its reservations never filled).
_LIVE_LOCKS: weakref.WeakSet[LiveLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    _FORKS[0] += 1
    for lock in list(_LIVE_LOCKS):
        with contextlib.suppress(OSError):
            lock.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _attach_checked(store_dir: str, ctl: str, pool: str) -> c.ControlBlock:
    """Map the segments the supervisor named, after checking that the store created
    them: the names and nonce its owner-only names file records, segments owned by the
    store's owner and closed to others. Raises access.StoreAccessDenied."""
    names = access.read_names(store_dir)
    if names.get("ctl") != ctl or names.get("pool", "") != pool:
        raise access.StoreAccessDenied(
            f"the supervisor named {ctl!r}, the store's names file {names.get('ctl')!r}"
        )
    for name in (ctl, pool):
        if name:
            access.check_segment(name.lstrip("/"), store_dir)
    cb = c.ControlBlock.attach(ctl, pool)
    if cb.nonce != names.get("nonce"):
        cb.close()
        raise access.StoreAccessDenied(
            f"shared memory {ctl} does not carry the store's nonce: the store did not create it"
        )
    return cb


def check_attach_types(
    method: str, store_dir: object, topic_queue_nums: object, timeout_s: object
) -> None:
    """TypeError for `attach`'s arguments of the wrong type (shared with AsyncStoreClient)."""
    check_types(method, store_dir=(store_dir, PATH), timeout_s=(timeout_s, NUMBER))
    if topic_queue_nums is not None:
        if not isinstance(topic_queue_nums, Mapping):
            raise TypeError(
                f"{method}() argument 'topic_queue_nums' must be a mapping of str to int, "
                f"not {type(topic_queue_nums).__name__}"
            )
        for topic, n in topic_queue_nums.items():
            if not isinstance(topic, str) or type(n) is not int:
                raise TypeError(
                    f"{method}() argument 'topic_queue_nums' must map str to int, not "
                    f"{type(topic).__name__} to {type(n).__name__}"
                )


class Session:
    """This process's attachment to the store at `store_dir`: the supervisor's socket,
    the mapped control block, the liveness byte and what the supervisor said at attach.
    The caller attaches (`_attach`) once its own state is set up."""

    # What the supervisor sent at the last attach, for the read side and asyncio:
    settings: StoreSettings  # the running store's settings
    geometry: Geometry  # its file sizes
    sync_timeout_s: float  # how long a SYNC_FLUSH put waits for the flusher

    def __init__(self, store_dir: str | os.PathLike[str], timeout_s: float) -> None:
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self._timeout_s = timeout_s
        self._tlock = _native.PutLock()  # threading.Lock's API; the C put takes it too
        self._closed = False
        self._attached = False

    # --- attach / detach --------------------------------------------------------------

    def _attach(self) -> None:
        sock = channel.connect(self.store_dir, self._timeout_s)
        try:
            channel.send_json(sock, {"op": "attach", "pid": os.getpid()})
            info = channel.recv_json(sock)
            if info.get("denied"):
                raise access.StoreAccessDenied(str(info["error"]))
            if "error" in info:
                raise channel.SupervisorUnavailable(str(info["error"]))
            cb = _attach_checked(self.store_dir, info["ctl"], info["pool"])
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._cb = cb
        self._buf = cb.buf
        self._pid = os.getpid()
        self._fork_gen = _FORKS[0]
        self._client_index = int(info["client_index"])
        self._generation = cb.generation
        self._seg_size = cb.segment_size
        self._pool_n = cb.pool_buffers
        self._slot_count = cb.slot_count
        self._qtable_off = cb.qtable_off
        self._sync = info["flush_disk_type"] == "SYNC_FLUSH"
        self.sync_timeout_s = int(info["sync_flush_timeout_ms"]) / 1000
        self._busy_timeout_s = int(info["os_page_cache_busy_timeout_ms"]) / 1000
        self._fast_fail = bool(info["fast_fail_if_no_buffer_in_store_pool"])
        self._max_body = int(info["max_message_size_bytes"])
        self._default_queues = int(info["default_topic_queue_nums"])
        # Per-topic queue counts (`mqstore topic DIR set T --queues N`), re-read at most
        # every 100 ms from config/topics.json.
        self._qcounts = QueueCounts(self.store_dir)
        self._store_host = str(info["store_host"])
        # The store's settings and file sizes, for the read side (`ipc.reads.for_client`).
        self.settings = settings_from_doc(info["settings"])
        self.geometry = Geometry(**info["geometry"])
        try:
            self._live = LiveLock(self.store_dir)
        except OSError:
            cb.close()
            sock.close()
            raise
        _LIVE_LOCKS.add(self._live)
        self._last_stale_check = time.monotonic()
        self._on_attach(info)
        self._attached = True

    def _detach(self) -> None:
        if not self._attached:
            return
        self._attached = False
        self._on_detach()
        del self._buf
        self._cb.close()
        self._live.close()
        self._sock.close()

    def close(self) -> None:
        """Detach: nothing of this client stays in the supervisor or in /dev/shm."""
        with self._tlock:
            if self._closed:
                return
            self._closed = True
            self._closing()
            if self._pid == os.getpid():
                self._detach()

    # --- hooks for what rides on the session ------------------------------------------

    def _on_attach(self, info: dict[str, Any]) -> None:
        """Set up what lives as long as this attach (`info`: the supervisor's answer)."""

    def _on_detach(self) -> None:
        """Release what `_on_attach` set up, before the control block is unmapped."""

    def _forget_parent(self) -> None:
        """In a forked child, before re-attaching: drop the parent's handles unclosed."""

    def _before_check(self) -> None:
        """At each staleness check of a live attach, before looking."""

    def _after_check(self) -> None:
        """At each staleness check that found the supervisor alive."""

    def _closing(self) -> None:
        """At `close`, under the thread lock, before detaching."""

    # --- staleness ----------------------------------------------------------------------

    def _ensure_live(self) -> str:
        """ "" when attached to a live supervisor (re-attaching if needed), else why not.
        Caller holds the thread lock."""
        if self._closed:
            return "the client is closed"
        if self._fork_gen != _FORKS[0] or self._pid != os.getpid():
            # A forked child: start over with our own handles. The liveness lock's
            # descriptor is the parent's open file: keeping it would make a dead parent
            # look alive.
            with contextlib.suppress(OSError):
                self._live.forget()  # done at fork already (_after_fork_in_child)
            self._attached = False
            self._forget_parent()
            return self._reattach("re-attach after fork failed: {}")
        now = time.monotonic()
        if self._attached and now - self._last_stale_check < _STALE_CHECK_S:
            return ""
        self._last_stale_check = now
        if self._attached:
            self._before_check()
            stale = Flags(self._cb).word & c.FLAG_STOPPED
            if not stale:
                r, _, _ = select.select([self._sock], [], [], 0)
                stale = bool(r)  # the supervisor closed our connection: it is gone
            if not stale:
                self._after_check()
                return ""
            self._detach()
        return self._reattach(f"the supervisor of {self.store_dir} is not running ({{}})")

    def _reattach(self, failed: str) -> str:
        """Attach afresh: "" once attached, else `failed` with the error in its {}."""
        try:
            self._attach()
        except (OSError, ValueError) as e:
            return failed.format(e)
        return ""

    # --- the public accessors: reads and asyncio ----------------------------------------

    def live_control_block(self) -> c.ControlBlock:
        """The control block of a live attach (re-attaching, like a put, when the
        supervisor restarted). Raises channel.SupervisorUnavailable with the reason."""
        with self._tlock:
            why = self._ensure_live()
            if why:
                raise channel.SupervisorUnavailable(why)
            return self._cb

    def flushed_position(self) -> int:
        """The flusher's flushed position in the control block, as mapped now (no
        staleness check; AttributeError or ValueError while detached)."""
        return Positions(self._cb).flushed

    def positions(self) -> dict[str, int]:
        """The control block's positions (reserved, published, committed, flushed)."""
        pos = Positions(self._cb)
        return {
            "reserved": pos.reserved,
            "published": pos.published,
            "committed": pos.committed,
            "flushed": pos.flushed,
        }
