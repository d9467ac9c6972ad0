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
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Final

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
