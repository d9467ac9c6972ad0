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
* a connection holds at most one attach row, freed when the connection closes.

Only the store's owner (and root, and with `ipc_allow_group` the store directory's
group) gets this far: `ipc.access.peer_refusal` answers everyone else at accept.

`ControlServer` is the server itself: the listening socket, accept, the connections
and their replies, on the supervisor's selector. What a request does is the
supervisor's (`Supervisor._handle`).
"""

from __future__ import annotations

import contextlib
import json
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
# Each op and the fields it takes besides "op".
OP_FIELDS: Final[dict[str, frozenset[str]]] = {
    "attach": frozenset({"pid"}),
    "status": frozenset(),
    "stop": frozenset(),
}
_SHOWN_CHARS: Final = 60


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
    return req, ""


@dataclass(eq=False)
class Conn:
    """One client connection: bytes received but not yet a whole line, the reply not yet
    taken by the peer, and the client row its attach holds (-1: none)."""

    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    row: int = -1
    reply_since: float = 0.0  # monotonic time the pending reply was queued
    closing: bool = False  # close once the pending reply is sent

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


Handler = Callable[[dict[str, Any], Conn], dict[str, Any]]


@dataclass(eq=False)
class ControlServer:
    """The supervisor's listening socket and its connections, on the main loop's selector.

    `handle(request, conn)` answers a valid request (the supervisor's; it may set
    `conn.row` on attach); `on_close(conn)` is told of each connection closed, so the
    attach row it held can be freed. Peers that are not the store's owner are refused at
    accept (`ipc.access.peer_refusal`, with `allow_group()` read at each accept), with one
    line saying why. Main loop only.
    """

    store_dir: str
    allow_group: Callable[[], bool]
    handle: Handler
    on_close: Callable[[Conn], None]
    say: Callable[[str, str], None]
    conns: dict[socket.socket, Conn] = field(default_factory=dict)
    listener: socket.socket | None = None

    def listen(self) -> None:
        """Bind the supervisor address (`ipc.channel`). Raises OSError."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(channel.supervisor_address(self.store_dir))
        except OSError:
            sock.close()
            raise
        sock.listen(128)
        sock.setblocking(False)
        self.listener = sock

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
        if self.listener is not None:
            self.listener.close()

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

    def _accept(self, sel: selectors.BaseSelector) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            why = access.peer_refusal(sock, self.store_dir, self.allow_group())
            if why:  # another user: one line saying why, and nothing else
                self.say(f"refused a connection: {why}", "WARNING")
                with contextlib.suppress(OSError):  # a fresh socket's buffer takes it
                    sock.send(json.dumps({"error": why, "denied": True}).encode() + b"\n")
                sock.close()
                continue
            self.conns[sock] = Conn(sock)
            sel.register(sock, selectors.EVENT_READ)

    def _drop(self, sel: selectors.BaseSelector, conn: Conn) -> None:
        """Close a connection; `on_close` frees the client row its attach holds."""
        self.conns.pop(conn.sock)
        sel.unregister(conn.sock)
        conn.sock.close()
        self.on_close(conn)

    def _on_conn(self, sel: selectors.BaseSelector, conn: Conn, events: int) -> None:
        """Read requests and answer them, one at a time: while a reply waits for its
        reader, the connection is watched for writing only."""
        try:
            if events & selectors.EVENT_WRITE:
                conn.send_pending()
            elif not self._receive(conn):
                self._drop(sel, conn)
                return
            while not conn.outbuf and not conn.closing:
                line = conn.next_line()
                if line is None:
                    break
                req, why = parse_request(line)
                conn.queue_reply(self.handle(req, conn) if req else {"error": why})
                conn.send_pending()
            if not conn.outbuf and conn.oversized():
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
