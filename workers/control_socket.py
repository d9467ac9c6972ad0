"""The supervisor's end of its control socket (`ipc.channel` gives the protocol): what a
request may hold, and each connection's buffers and attach row.

No peer can hurt the supervisor's loop, whatever it sends or fails to read:

* every field of every request is checked (`parse_request`): a bad one is answered with
  `{"error": "bad request: ..."}`, never an exception; an unknown field is refused;
* a request line longer than `MAX_REQUEST_BYTES` is answered with an error and the
  connection is closed;
* replies are written without blocking. While a reply waits for its reader, the
  supervisor reads no further requests from that connection, so one connection holds
  at most one reply; a reader that leaves a reply untaken for `REPLY_TIMEOUT_S` is
  dropped;
* a connection holds at most one attach row, freed when the connection closes;
* a request the supervisor answers later (an attach waiting, up to the `wait_ms` it
  asked for, for the store's write path: `Supervisor._handle`) holds nothing but its
  connection: no row, no thread, no blocking call. It is asked again at each tick of the
  loop (`answer_waiting`); meanwhile that connection's further bytes are kept (a peer
  that sends more than `MAX_REQUEST_BYTES` is dropped), its other requests wait their
  turn, and it counts as a connection without an attach row for the limits below
  (closed for a new one only when no idle one is left to close).

Only the store's owner (and root, and with `ipc_allow_group` the store directory's
group) can reach the socket at all (it lies in the store's directory, `ipc.channel`), and
`ipc.access.peer_refusal` answers anyone else who gets this far at accept. Nor can a flood
of connections hurt it:

* at most `MAX_UNATTACHED` connections without an attach row are kept: a new one beyond
  that closes the oldest (an attached client's connection is never closed for another),
  so idle connections cannot keep a client from attaching;
* a connection that leaves fewer than `FD_HEADROOM` descriptors free closes the oldest
  connection without a row (or is refused), so the supervisor keeps descriptors for its
  own work; running out of them in accept anyway (EMFILE, ENFILE) refuses that
  connection (a spare descriptor is given up to accept and close it), and any other
  accept error is a refused connection too, never the supervisor's end;
* refusals are logged at a bounded rate (`RefusalLog`): the first at once, then one line
  per `REFUSAL_LOG_INTERVAL_S` counting those in between.

`ControlServer` is the server itself: the listening socket, accept, the connections
and their replies, on the supervisor's selector. What a request does is the
supervisor's (`Supervisor._handle`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from mqstore.ipc import access, channel

PID_MAX: Final = 1 << 22  # Linux's PID_MAX_LIMIT: no process id is larger
MAX_REQUEST_BYTES: Final = 1 << 20
REPLY_TIMEOUT_S: Final = 5.0
MAX_UNATTACHED: Final = 64  # connections holding no attach row
ACCEPTS_PER_EVENT: Final = 64  # then the loop's other work gets its turn
REFUSAL_LOG_INTERVAL_S: Final = 10.0
# Descriptors kept free for the supervisor's own work (a status reply, spawning a worker):
# a connection that would leave fewer closes the oldest one that holds no attach row.
FD_HEADROOM: Final = 16
LISTEN_BACKLOG: Final = 128
# Each op and the fields it takes besides "op".
OP_FIELDS: Final[dict[str, frozenset[str]]] = {
    "attach": frozenset({"pid", "wait_ms"}),
    "status": frozenset(),
    "stop": frozenset(),
    # consumer groups (`workers.group_coord` checks the fields' values)
    "group_join": frozenset({"group", "topics", "session_ms", "previous"}),
    "group_beat": frozenset({"group", "member", "release", "rtt_ms"}),
    "group_leave": frozenset({"group", "member", "release", "rtt_ms"}),
    "group_info": frozenset(),
    "group_reset": frozenset({"group", "offsets"}),
    "group_delete": frozenset({"group"}),
}
_SHOWN_CHARS: Final = 60
# The wait for the write path of an attach that does not say (StoreClient's default
# timeout); the longest one may ask for is `channel.MAX_ATTACH_WAIT_MS`.
DEFAULT_ATTACH_WAIT_MS: Final = 10_000


def _shown(value: object) -> str:
    """`repr(value)`, cut short: a hostile value is not echoed whole."""
    r = repr(value)
    return r if len(r) <= _SHOWN_CHARS else r[: _SHOWN_CHARS - 3] + "..."


def parse_request(line: bytes) -> tuple[dict[str, Any], str]:
    """`(request, "")` for a valid request line, else `({}, why it is refused)`."""
    try:
        req = json.loads(line)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        return {}, f"bad request: not JSON ({_shown(str(e))})"
    if not isinstance(req, dict):
        return {}, f"bad request: a request is a JSON object, not {type(req).__name__}"
    op = req.get("op")
    if not isinstance(op, str) or op not in OP_FIELDS:
        return {}, f"bad request: unknown op {_shown(op)} (one of {', '.join(OP_FIELDS)})"
    extra = sorted(set(req) - {"op"} - OP_FIELDS[op])
    if extra:
        return {}, f"bad request: {op} takes no field {_shown(extra[0])}"
    if op == "attach":
        pid = req.get("pid")
        if type(pid) is not int or not 0 < pid <= PID_MAX:
            want = f"a process id 1..{PID_MAX}"
            return {}, f"bad request: attach needs 'pid', {want}, not {_shown(pid)}"
        wait_ms = req.setdefault("wait_ms", DEFAULT_ATTACH_WAIT_MS)
        if type(wait_ms) is not int or not 0 <= wait_ms <= channel.MAX_ATTACH_WAIT_MS:
            want = f"milliseconds 0..{channel.MAX_ATTACH_WAIT_MS}"
            return {}, f"bad request: attach's 'wait_ms' is {want}, not {_shown(wait_ms)}"
    return req, ""


@dataclass(eq=False)
class Conn:
    """One client connection: bytes received but not yet a whole line, the reply not yet
    taken by the peer, the request whose answer waits (`waiting`, read at `asked`), and
    the client row its attach holds (-1: none)."""

    sock: socket.socket
    accepted: float = 0.0  # monotonic time of accept
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    row: int = -1
    reply_since: float = 0.0  # monotonic time the pending reply was queued
    closing: bool = False  # close once the pending reply is sent
    member: object = None  # the consumer-group member this connection is (group_coord)
    waiting: dict[str, Any] | None = None  # a request the handler answers at a later tick
    asked: float = 0.0  # monotonic time the request being handled was read

    def next_line(self) -> bytes | None:
        """The next whole request line, or None."""
        line, nl, rest = bytes(self.inbuf).partition(b"\n")
        if not nl:
            return None
        self.inbuf[:] = rest
        return line

    def oversized(self) -> bool:
        """A line longer than MAX_REQUEST_BYTES is being received."""
        return b"\n" not in self.inbuf and len(self.inbuf) > MAX_REQUEST_BYTES

    def queue_reply(self, reply: dict[str, Any]) -> None:
        if not self.outbuf:
            self.reply_since = time.monotonic()
        self.outbuf += json.dumps(reply).encode() + b"\n"

    def send_pending(self) -> None:
        """Send what the socket takes now. Raises OSError when the peer is gone."""
        while self.outbuf:
            try:
                n = self.sock.send(self.outbuf)
            except (BlockingIOError, InterruptedError):
                return
            del self.outbuf[:n]
            self.reply_since = time.monotonic()

    def stalled(self, now: float) -> bool:
        """A reply has waited for its reader longer than REPLY_TIMEOUT_S."""
        return bool(self.outbuf) and now - self.reply_since > REPLY_TIMEOUT_S


# The reply to a request, or None: not yet (asked again at each `answer_waiting`).
Handler = Callable[[dict[str, Any], Conn], dict[str, Any] | None]


@dataclass(eq=False)
class RefusalLog:
    """Refused and failed connections, said at a bounded rate: the first at once, then at
    most one line per `interval_s` that counts those since the last line. A flood of
    connections makes a few lines, not one per connection."""

    say: Callable[[str, str], None]
    interval_s: float = REFUSAL_LOG_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    _last: float = float("-inf")
    _unsaid: int = 0

    def refused(self, why: str) -> None:
        now = self.clock()
        if now - self._last < self.interval_s:
            self._unsaid += 1
            return
        more = f" ({self._unsaid} more since the last line)" if self._unsaid else ""
        self.say(f"refused a connection: {why}{more}", "WARNING")
        self._last = now
        self._unsaid = 0


@dataclass(eq=False)
class ControlServer:
    """The supervisor's listening socket and its connections, on the main loop's selector.

    `handle(request, conn)` answers a valid request (the supervisor's; it may set
    `conn.row` on attach), or returns None to be asked again at the next
    `answer_waiting` (the loop's tick); `on_close(conn)` is told of each connection
    closed, so the attach row it held can be freed. Peers that are not the store's owner
    are refused at accept (`ipc.access.peer_refusal`, with `allow_group()` read at each
    accept), with one line saying why. `listen` binds the socket file, `close_listener`
    removes it. Main loop only.
    """

    store_dir: str
    allow_group: Callable[[], bool]
    handle: Handler
    on_close: Callable[[Conn], None]
    say: Callable[[str, str], None]
    conns: dict[socket.socket, Conn] = field(default_factory=dict)
    waiting: set[Conn] = field(default_factory=set)  # connections whose request waits
    listener: socket.socket | None = None
    refusals: RefusalLog = field(init=False)
    _bound: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket file bound
    _spare_fd: int = -1  # given up to refuse a connection when descriptors run out

    def __post_init__(self) -> None:
        self.refusals = RefusalLog(self.say)

    def listen(self) -> None:
        """Bind the supervisor socket (`ipc.channel.SOCKET_NAME` in the store directory),
        replacing the file a run that died left there: the caller holds the store lock,
        so no other supervisor serves this store. Raises OSError."""
        dir_fd = channel.open_store_dir(self.store_dir)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(channel.SOCKET_NAME, dir_fd=dir_fd)
            sock.bind(channel.socket_path(dir_fd))
            mode = 0o660 if self.allow_group() else 0o600
            os.chmod(channel.SOCKET_NAME, mode, dir_fd=dir_fd)
            st = os.stat(channel.SOCKET_NAME, dir_fd=dir_fd, follow_symlinks=False)
            self._bound = (st.st_dev, st.st_ino)
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        finally:
            os.close(dir_fd)
        sock.setblocking(False)
        self.listener = sock
        self._spare_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)

    def register(self, sel: selectors.BaseSelector) -> None:
        assert self.listener is not None
        sel.register(self.listener, selectors.EVENT_READ)

    def on_ready(self, sel: selectors.BaseSelector, key: selectors.SelectorKey, mask: int) -> bool:
        """Serve one selector event; False when it is not one of this server's."""
        if key.fileobj is self.listener:
            self._accept(sel)
            return True
        conn = self.conns.get(key.fileobj)  # type: ignore[call-overload]
        if conn is None:
            return False
        self._on_conn(sel, conn, mask)
        return True

    def close_listener(self) -> None:
        """Stop listening and remove the socket file this server bound (not one another
        run put there since)."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self._spare_fd >= 0:
            os.close(self._spare_fd)
            self._spare_fd = -1
        if self._bound is None:
            return
        path = os.path.join(self.store_dir, channel.SOCKET_NAME)
        with contextlib.suppress(OSError):
            st = os.stat(path, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == self._bound:
                os.unlink(path)
        self._bound = None

    def drop_all(self, sel: selectors.BaseSelector) -> None:
        for conn in list(self.conns.values()):
            self._drop(sel, conn)

    def drop_stalled(self, sel: selectors.BaseSelector) -> None:
        """Drop each connection whose reader has left a reply untaken too long."""
        now = time.monotonic()
        for conn in [cn for cn in self.conns.values() if cn.stalled(now)]:
            self.say(
                f"dropped a client connection that took no reply for {REPLY_TIMEOUT_S:g} s",
                "WARNING",
            )
            self._drop(sel, conn)

    def answer_waiting(self, sel: selectors.BaseSelector) -> None:
        """Ask the handler again about each request whose answer waits; send the answers
        it gives now. O(waiting connections)."""
        for conn in list(self.waiting):
            assert conn.waiting is not None
            reply = self.handle(conn.waiting, conn)
            if reply is None:
                continue
            conn.waiting = None
            self.waiting.discard(conn)
            conn.queue_reply(reply)
            self._serve(sel, conn)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        """Accept what is waiting (at most ACCEPTS_PER_EVENT): refuse other users, keep
        at most MAX_UNATTACHED connections without a row, and turn every accept error,
        descriptor exhaustion included, into a refused connection."""
        assert self.listener is not None
        for _ in range(ACCEPTS_PER_EVENT):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE) and self._drop_oldest_unattached(
                    sel, "out of descriptors"
                ):
                    continue
                self._refuse_without_descriptor(e)
                return
            sock.setblocking(False)
            if self._short_of_descriptors() and not self._drop_oldest_unattached(
                sel, f"fewer than {FD_HEADROOM} descriptors would be left"
            ):
                self.refusals.refused(f"fewer than {FD_HEADROOM} descriptors would be left")
                sock.close()
                continue
            why = access.peer_refusal(sock, self.store_dir, self.allow_group())
            if why:  # another user: one line saying why, and nothing else
                self.refusals.refused(why)
                with contextlib.suppress(OSError):  # a fresh socket's buffer takes it
                    sock.send(json.dumps({"error": why, "denied": True}).encode() + b"\n")
                sock.close()
                continue
            while (
                sum(cn.row < 0 and cn.member is None for cn in self.conns.values())
                >= MAX_UNATTACHED
            ):
                self._drop_oldest_unattached(sel, f"at most {MAX_UNATTACHED} are kept")
            self.conns[sock] = Conn(sock, accepted=time.monotonic())
            sel.register(sock, selectors.EVENT_READ)

    @staticmethod
    def _short_of_descriptors() -> bool:
        """Fewer than FD_HEADROOM descriptors are free under the limit as it is now (the
        open ones counted in /proc/self/fd: its listing takes one, so failing to list it
        is being short too). O(open descriptors)."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return False
        try:
            in_use = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
        except OSError:
            return True
        return in_use > soft - FD_HEADROOM

    def _drop_oldest_unattached(self, sel: selectors.BaseSelector, why: str) -> bool:
        """Close the longest-held connection that holds no attach row, one whose attach
        waits only when none is merely idle; False if none."""
        idle = [cn for cn in self.conns.values() if cn.row < 0 and cn.member is None]
        if not idle:
            return False
        self.refusals.refused(
            f"{len(idle)} connections hold no attach row; closed the oldest ({why})"
        )
        self._drop(sel, min(idle, key=lambda cn: (cn.waiting is not None, cn.accepted)))
        return True

    def _refuse_without_descriptor(self, err: OSError) -> None:
        """accept failed (`err`): when descriptors ran out, give up the spare one to
        accept the waiting connection and close it at once, so it is refused rather than
        left to wake the loop again and again."""
        assert self.listener is not None
        self.refusals.refused(f"accept failed: {err.strerror or err}")
        if err.errno not in (errno.EMFILE, errno.ENFILE) or self._spare_fd < 0:
            return
        os.close(self._spare_fd)
        self._spare_fd = -1
        try:
            sock, _ = self.listener.accept()
            sock.close()
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self._spare_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)

    def _drop(self, sel: selectors.BaseSelector, conn: Conn) -> None:
        """Close a connection; `on_close` frees the client row its attach holds."""
        self.conns.pop(conn.sock)
        self.waiting.discard(conn)
        sel.unregister(conn.sock)
        conn.sock.close()
        self.on_close(conn)

    def _on_conn(self, sel: selectors.BaseSelector, conn: Conn, events: int) -> None:
        """Take what the event brings (the peer's bytes, or room for the pending reply),
        then serve the connection."""
        try:
            if events & selectors.EVENT_WRITE:
                conn.send_pending()
            elif not self._receive(conn):
                self._drop(sel, conn)
                return
        except OSError:
            self._drop(sel, conn)
            return
        self._serve(sel, conn)

    def _serve(self, sel: selectors.BaseSelector, conn: Conn) -> None:
        """Answer requests one at a time: while a reply waits for its reader, the
        connection is watched for writing only; while a request's answer waits
        (`waiting`), for reading (so a peer that leaves is seen), keeping at most
        MAX_REQUEST_BYTES of what it sends meanwhile."""
        try:
            conn.send_pending()
            while not conn.outbuf and not conn.closing and conn.waiting is None:
                line = conn.next_line()
                if line is None:
                    break
                req, why = parse_request(line)
                conn.asked = time.monotonic()
                reply = self.handle(req, conn) if req else {"error": why}
                if reply is None:
                    conn.waiting = req
                    self.waiting.add(conn)
                    break
                conn.queue_reply(reply)
                conn.send_pending()
            if conn.waiting is not None and len(conn.inbuf) > MAX_REQUEST_BYTES:
                self._drop(sel, conn)  # a peer has no business sending while it waits
                return
            if not conn.outbuf and conn.waiting is None and conn.oversized():
                conn.closing = True
                conn.queue_reply({"error": f"bad request: a line over {MAX_REQUEST_BYTES} bytes"})
                conn.send_pending()
        except OSError:
            self._drop(sel, conn)
            return
        if conn.closing and not conn.outbuf:
            self._drop(sel, conn)
            return
        want = selectors.EVENT_WRITE if conn.outbuf else selectors.EVENT_READ
        if sel.get_key(conn.sock).events != want:
            sel.modify(conn.sock, want)

    @staticmethod
    def _receive(conn: Conn) -> bool:
        """Take what the peer sent; False when it has closed its end."""
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        conn.inbuf += data
        return bool(data)
