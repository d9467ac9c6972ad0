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

An attach is one typed record, `Attached`: what the supervisor said and this process's
handles on it, replaced whole at each re-attach. What rides on the session is its
`Rider` (the put path, `ipc.producer.PutPath`): told of each attach, detach, fork and
staleness check. The read side (`ipc.reads.for_client`) and asyncio (`ipc.aio`, through
`StoreClient`) use the public accessors only: `live_control_block`, `attached`,
`flushed_position`, `positions`.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
import weakref
from collections.abc import Mapping
from typing import Final, NamedTuple, Protocol

from mqstore import _native
from mqstore.conf.settings import StoreSettings, settings_from_doc
from mqstore.engine.geometry import Geometry
from mqstore.ipc import access, channel
from mqstore.ipc import control as c
from mqstore.ipc.accepts import BOOL, NUMBER, PATH, check_types
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


# Of an attach's timeout, the part kept to read the supervisor's answer after the
# `wait_ms` it is asked to wait for the write path (at most this, at most a quarter).
_ANSWER_SLACK_S: Final = 0.5


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
    method: str, store_dir: object, topic_queue_nums: object, timeout_s: object, idempotence: object
) -> None:
    """TypeError for `attach`'s arguments of the wrong type (shared with AsyncStoreClient)."""
    check_types(
        method,
        store_dir=(store_dir, PATH),
        timeout_s=(timeout_s, NUMBER),
        idempotence=(idempotence, BOOL),
    )
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


class Attached(NamedTuple):
    """One attach: the supervisor's answer and this process's handles on it. A
    `NamedTuple`, not a dataclass: built once per attach, and a frozen dataclass's
    decoration cost every producer's import ~0.5 ms of CPU (its generated methods are
    compiled at import; bench/results/client_start.md)."""

    sock: socket.socket  # the supervisor's end closing means it is gone
    cb: c.ControlBlock  # the mapped control block (and pool)
    live: LiveLock  # this process's liveness byte
    pid: int  # the process that attached
    fork_gen: int  # `_FORKS` at attach: a put notices a fork without getpid()
    client_index: int  # this client's statistics row
    settings: StoreSettings  # the running store's settings
    geometry: Geometry  # its file sizes


class Rider(Protocol):
    """What rides on a session (the put path): told of each change, under its lock."""

    def attached(self, a: Attached) -> None:
        """A new attach (`a`): set up what lives as long as it."""

    def detaching(self, a: Attached) -> None:
        """Before `a`'s control block is unmapped: release what `attached` set up."""

    def checking(self, a: Attached) -> None:
        """At each staleness check of a live attach, before looking."""

    def checked(self, a: Attached) -> None:
        """At each staleness check that found the supervisor alive."""


class Session:
    """This process's attachment to the store at `store_dir` (`attached`, None while
    detached), kept live by `ensure_live`; `lock` serialises its users' threads."""

    def __init__(self, store_dir: str | os.PathLike[str], timeout_s: float, rider: Rider) -> None:
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self._timeout_s = timeout_s
        self._rider = rider
        self.lock = _native.PutLock()  # threading.Lock's API; the C put takes it too
        self.closed = False
        self.attached: Attached | None = None
        self._last_stale_check = 0.0

    # --- attach / detach --------------------------------------------------------------

    def attach(self) -> None:
        """Attach (raises channel.SupervisorUnavailable, access.StoreAccessDenied).

        The supervisor answers once the workers a put waits on are running, waiting up
        to this session's timeout (less `_ANSWER_SLACK_S` to read the answer); still
        down then, it says which and why: channel.WorkersNotUp."""
        deadline = time.monotonic() + self._timeout_s
        sock = channel.connect(self.store_dir, self._timeout_s)
        try:
            left = max(0.0, deadline - time.monotonic())
            wait_s = min(left - min(_ANSWER_SLACK_S, left / 4), channel.MAX_ATTACH_WAIT_MS / 1000)
            wait_ms = int(wait_s * 1000)
            channel.send_json(sock, {"op": "attach", "pid": os.getpid(), "wait_ms": wait_ms})
            sock.settimeout(max(left, 0.001))
            try:
                info = channel.recv_json(sock)
            except channel.SupervisorUnavailable:
                raise
            except OSError as e:  # no answer in time (a stopped supervisor), a reset
                raise channel.SupervisorUnavailable(
                    f"no attach answer from the supervisor of {self.store_dir} in "
                    f"{self._timeout_s:g} s: {e}"
                ) from e
            if info.get("denied"):
                raise access.StoreAccessDenied(str(info["error"]))
            if "not_up" in info:
                raise channel.WorkersNotUp(str(info["error"]), dict(info["not_up"]))
            if "error" in info:
                raise channel.SupervisorUnavailable(str(info["error"]))
            cb = _attach_checked(self.store_dir, info["ctl"], info["pool"])
        except BaseException:
            sock.close()
            raise
        try:
            live = LiveLock(self.store_dir)
        except OSError:
            cb.close()
            sock.close()
            raise
        _LIVE_LOCKS.add(live)
        a = Attached(
            sock=sock,
            cb=cb,
            live=live,
            pid=os.getpid(),
            fork_gen=_FORKS[0],
            client_index=int(info["client_index"]),
            settings=settings_from_doc(info["settings"]),
            geometry=Geometry(**info["geometry"]),
        )
        self._last_stale_check = time.monotonic()
        self._rider.attached(a)
        self.attached = a

    def _detach(self) -> None:
        a = self.attached
        if a is None:
            return
        self.attached = None
        self._rider.detaching(a)
        a.cb.close()
        a.live.close()
        a.sock.close()

    def close(self) -> None:
        """Detach: nothing of this client stays in the supervisor or in /dev/shm."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.attached is not None and self.attached.pid == os.getpid():
                self._detach()

    # --- staleness ----------------------------------------------------------------------

    def ensure_live(self) -> str:
        """ "" when attached to a live supervisor (re-attaching if needed), else why not.
        Caller holds the lock."""
        if self.closed:
            return "the client is closed"
        a = self.attached
        if a is not None and (a.fork_gen != _FORKS[0] or a.pid != os.getpid()):
            # A forked child: start over with our own handles. The liveness lock's
            # descriptor is the parent's open file: keeping it would make a dead parent
            # look alive. The parent's handles are dropped unclosed.
            with contextlib.suppress(OSError):
                a.live.forget()  # done at fork already (_after_fork_in_child)
            self.attached = None
            return self._reattach("re-attach after fork failed: {}")
        now = time.monotonic()
        if a is not None and now - self._last_stale_check < _STALE_CHECK_S:
            return ""
        self._last_stale_check = now
        if a is not None:
            self._rider.checking(a)
            stale = Flags(a.cb).word & c.FLAG_STOPPED
            if not stale:
                r, _, _ = select.select([a.sock], [], [], 0)
                stale = bool(r)  # the supervisor closed our connection: it is gone
            if not stale:
                self._rider.checked(a)
                return ""
            self._detach()
        return self._reattach(f"the supervisor of {self.store_dir} is not running ({{}})")

    def _reattach(self, failed: str) -> str:
        """Attach afresh: "" once attached, else `failed` with the error in its {}."""
        try:
            self.attach()
        except (OSError, ValueError) as e:
            return failed.format(e)
        return ""

    # --- the public accessors: reads and asyncio ----------------------------------------

    def live(self) -> Attached:
        """The attach of a live supervisor (re-attaching, like a put, when the
        supervisor restarted). Raises channel.SupervisorUnavailable with the reason."""
        with self.lock:
            why = self.ensure_live()
            if why:
                raise channel.SupervisorUnavailable(why)
            assert self.attached is not None
            return self.attached

    def live_control_block(self) -> c.ControlBlock:
        """The control block of a live attach (`live`)."""
        return self.live().cb

    def current(self) -> Attached:
        """The attach as it is now, no staleness check (ValueError while detached)."""
        a = self.attached
        if a is None:
            raise ValueError(f"not attached to the supervisor of {self.store_dir}")
        return a

    def flushed_position(self) -> int:
        """The flusher's flushed position in the control block, as mapped now (no
        staleness check; ValueError while detached)."""
        return Positions(self.current().cb).flushed

    def positions(self) -> dict[str, int]:
        """The control block's positions (reserved, published, committed, flushed)."""
        pos = Positions(self.current().cb)
        return {k: getattr(pos, k) for k in ("reserved", "published", "committed", "flushed")}
