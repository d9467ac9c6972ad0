"""systemd's readiness protocol (`sd_notify(3)`), with nothing but a socket.

Under `Type=notify` systemd passes `NOTIFY_SOCKET` (a path, or `@name` for an abstract
address) and waits for a `READY=1` datagram before it counts the unit as started, so
units ordered after the store (`After=mqstore@x.service`) start once it takes puts. The
supervisor sends `READY=1` once recovery is done and every worker reports itself
running, `STATUS=...` with it, and `STOPPING=1` when it begins to drain. Without
`NOTIFY_SOCKET` (a terminal, a test, another supervisor) every call is a no-op.

A notification that cannot be sent is logged by the caller and never stops the store:
systemd then times the start out (`TimeoutStartSec`), which says more than a crash.
"""

from __future__ import annotations

import os
import socket

ENV = "NOTIFY_SOCKET"


def notify(*fields: str) -> bool:
    """Send `fields` ("READY=1", "STATUS=...") as one datagram; False when there is no
    NOTIFY_SOCKET. Raises OSError when the socket is there but the send fails."""
    addr = os.environ.get(ENV)
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # an abstract address
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.sendto("\n".join(fields).encode(), addr)
    return True
