"""The group slot file's grant slots (`ipc.group_slots`, `workers.group_coord`): a slot is
never granted again while the member whose lease in it ran out may still store into it.

The race, before the fence: a member checks its lease, then stores `tag << 40 | offset`
into its grant's slot, two steps. A member stopped between them (SIGSTOP, a deschedule)
loses its lease in the supervisor, which ended the grant and put the slot at the end of
its FIFO free list; 4,096 grants later the slot belongs to another member's grant, and
the late store overwrites that grant's offset (a foreign tag: the supervisor takes
nothing from the slot, and the new owner's acks since the last slot read are delivered
again). These tests drive the supervisor's coordinator itself, in this process, with its
clock seam, and real member processes (their pidfds are what the coordinator watches)."""

from __future__ import annotations

import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqstore.ipc import group_slots
from mqstore.workers.control_socket import Conn
from mqstore.workers.group_coord import Coordinator

QUEUES = 4


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Peer:
    """A member process: connected to `listener`, alive until `kill` (or teardown)."""

    def __init__(self, listener: socket.socket, path: str) -> None:
        code = (
            "import socket, sys; s = socket.socket(socket.AF_UNIX); "
            f"s.connect({path!r}); sys.stdin.read()"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        sock, _ = listener.accept()
        self.conn = Conn(sock)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.conn.sock.close()


@pytest.fixture
def coord(tmp_path: Path) -> Iterator[tuple[Coordinator, Clock, list[Peer], Any]]:
    clock = Clock()
    c = Coordinator(str(tmp_path), lambda msg, level: None, lambda: QUEUES, lambda: 0o600, clock)
    sel = selectors.DefaultSelector()
    c.attach_selector(sel)
    listener = socket.socket(socket.AF_UNIX)
    path = str(tmp_path / "sock")
    listener.bind(path)
    listener.listen(8)
    peers: list[Peer] = []

    def peer() -> Peer:
        p = Peer(listener, path)
        peers.append(p)
        return p

    try:
        yield c, clock, peers, (peer, sel)
    finally:
        c.close()
        for p in peers:
            p.close()
        listener.close()
        sel.close()


def _join(c: Coordinator, p: Peer, session_ms: int = 1000) -> dict[str, Any]:
    got = c.handle(
        {"op": "group_join", "group": "G", "topics": ["T"], "session_ms": session_ms}, p.conn
    )
    assert "error" not in got, got
    return got


def _deaths(c: Coordinator, sel: selectors.BaseSelector) -> None:
    """What the supervisor's loop does with the pidfds that turned readable."""
    for key, _ev in sel.select(5.0):
        c.on_ready(key)


def test_a_lapsed_grants_slot_is_never_granted_again_while_its_member_lives(
    coord: tuple[Coordinator, Clock, list[Peer], Any],
) -> None:
    c, clock, _peers, (peer, sel) = coord
    stale = peer()
    got = _join(c, stale)
    assert len(got["grants"]) == QUEUES
    _t, _q, stale_tag, stale_slot, _start, _left = got["grants"][0]
    # the stale member stops (no beats): its leases run out, its queues move on
    clock.t += 5.0
    c.tick()
    g = c.groups["G"]
    assert all(gr.member.id != got["member"] for gr in g.grants.values())
    # grants churn: a member joins and leaves, more than the slot file's slots over
    churn = peer()
    for _ in range(group_slots.SLOTS // QUEUES + 8):
        j = _join(c, churn)
        assert len(j["grants"]) == QUEUES
        assert stale_slot not in {gr.slot for gr in g.grants.values()}
        c.handle(
            {
                "op": "group_leave",
                "group": "G",
                "member": j["member"],
                "release": [x[2] for x in j["grants"]],
            },
            churn.conn,
        )
    # the stale member wakes and stores its late ack: nobody's grant is in that slot
    g.slots.write(stale_slot, stale_tag, 12345)
    # its process exits: the slot is free again, and granted in its turn
    stale.kill()
    _deaths(c, sel)
    seen = set()
    for _ in range(group_slots.SLOTS // QUEUES + 8):
        j = _join(c, churn)
        seen |= {x[3] for x in j["grants"]}
        c.handle(
            {
                "op": "group_leave",
                "group": "G",
                "member": j["member"],
                "release": [x[2] for x in j["grants"]],
            },
            churn.conn,
        )
    assert stale_slot in seen


def test_a_member_that_releases_a_lapsed_tag_frees_its_slot(
    coord: tuple[Coordinator, Clock, list[Peer], Any],
) -> None:
    """A member whose beat came after its leases ran out gets its queues again in new
    grants; the old grants' slots stay fenced until it releases their tags, as it does
    at its next beat (`Consumer._lapse`)."""
    c, clock, _peers, (peer, _sel) = coord
    a = peer()
    got = _join(c, a, session_ms=1000)
    old = {x[2]: x[3] for x in got["grants"]}
    g = c.groups["G"]
    clock.t += 1.05  # past the leases, not past the session

    def beat(release: list[int]) -> dict[str, Any]:
        req = {"op": "group_beat", "group": "G", "member": got["member"], "release": release}
        return c.handle(req, a.conn)

    again = beat([])
    assert {x[2] for x in again["grants"]}.isdisjoint(old)
    assert len(again["grants"]) == QUEUES
    assert dict(g.members[got["member"]].fenced) == old
    assert set(old.values()).isdisjoint(g.free)
    beat(list(old))
    assert not g.members[got["member"]].fenced
    assert set(old.values()) <= set(g.free)


def test_a_rejoining_member_frees_the_slots_its_previous_self_held(
    coord: tuple[Coordinator, Clock, list[Peer], Any],
) -> None:
    c, clock, _peers, (peer, _sel) = coord
    a = peer()
    got = _join(c, a)
    slots = {x[3] for x in got["grants"]}
    g = c.groups["G"]
    clock.t += 5.0
    c.tick()  # the leases ran out: fenced
    assert {s for m in g.members.values() for s in m.fenced.values()} == slots
    # the same process, on the same connection's successor, rejoins naming its old self
    c.on_close(a.conn)
    new = c.handle(
        {
            "op": "group_join",
            "group": "G",
            "topics": ["T"],
            "session_ms": 1000,
            "previous": got["member"],
        },
        a.conn,
    )
    assert "error" not in new, new
    assert got["member"] not in g.members
    assert not any(m.fenced for m in g.members.values())
    assert slots <= set(g.free) | {x[3] for x in new["grants"]}
