"""Consumer groups across a supervisor SIGKILL and restart: the members of the dead run
and the new run's members never consume a queue at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from mqstore import StoreClient
from mqstore.ipc import group_slots
from mqstore.ipc.commit import pid_alive
from tests.groups.helpers import (
    Member,
    first_membership,
    info,
    owners,
    spawn_member,
    wait_processed,
)
from tests.runtime.harness import Store, wait_for

QUEUES = {"default_topic_queue_nums": 4}


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _kill_supervisor(st: Store) -> None:
    """SIGKILL the supervisor; its workers follow it (they watch it)."""
    assert st.proc is not None
    workers = [w["pid"] for w in st.status()["workers"] if w["pid"]]
    st.proc.kill()
    st.proc.wait()
    st.proc = None
    st._log.close()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 60, "the workers to exit")


SESSION_MS = 15_000  # member 0's: longer than the default 2 s, to outlive a restart


def _first_delivery_ns(log: Path) -> int:
    for line in log.read_text().splitlines():
        parts = line.split(" ")
        if parts[0] == "P" and len(parts) == 7:
            return int(parts[6])
    raise AssertionError(f"{log} delivered nothing")


@pytest.mark.slow
def test_a_killed_supervisors_leases_end_before_the_next_run_grants_and_deliver_nothing(
    make_store: object, tmp_path: Path
) -> None:
    """Member 0 (a 15 s session) stops itself with messages fetched under its lease
    (`--stop-at filled`); the supervisor is SIGKILLed and started again, and member 1
    joins the new run. Two things must hold:

    * the new run grants member 1 nothing before member 0's lease is over: its grace is
      the longest session of the run before, not the default session (it was 2 s, and
      member 1 consumed the queues while member 0's lease still held);
    * member 0, resumed inside that lease, delivers nothing of it: the supervisor that
      granted it is dead, and the slot file its acks would go to is no longer read (it
      delivered the batch it held and its acks returned True, then member 1 delivered
      the same messages again)."""
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    logs = [tmp_path / "m0.log", tmp_path / "m1.log"]
    members: list[Member] = [
        spawn_member(store.path, "g", "orders", logs[0], "--session-ms", str(SESSION_MS),
                     "--stop-at", "filled"),
    ]  # fmt: skip
    want = {f"w-{i}" for i in range(200)}
    try:
        m0 = members[0]
        m0.wait_joined()
        wait_for(lambda: set(owners(store.path, "g", "orders").values()) == {m0.member_id},
                 20, "member 0 to own every queue")  # fmt: skip
        os.kill(m0.proc.pid, signal.SIGUSR2)
        wait_for(lambda: "\nU\n" in logs[0].read_text(), 20, "the stop to be armed")
        with StoreClient.attach(store.path) as client:
            for body in sorted(want):
                client.put("orders", body.encode(), wait_store=False)
        wait_for(lambda: "\nS " in logs[0].read_text(), 20, "member 0 to stop after its pull")
        wait_for(lambda: _stopped(m0.proc.pid), 20, "member 0 to be stopped")
        # its lease runs from its last beat's send, before the supervisor received it
        asked_ns = time.monotonic_ns()
        beats = {m["id"]: m["last_beat_s"] for m in info(store.path, "g")["members"]}
        lease_end_ns = asked_ns - int(beats[m0.member_id] * 1e9) + SESSION_MS * 1_000_000
        _kill_supervisor(store)
        store.start()
        members.append(spawn_member(store.path, "g", "orders", logs[1]))
        m1 = members[1]
        m1.wait_joined()
        assert time.monotonic_ns() < lease_end_ns - 2 * 10**9, "the restart outlived the lease"
        os.kill(m0.proc.pid, signal.SIGCONT)  # inside its lease
        wait_processed(logs, want, 60)
        assert _first_delivery_ns(logs[1]) >= lease_end_ns, "granted before the lease ended"
        wait_for(lambda: "\nR " in logs[0].read_text(), 30, "the resumed member to rejoin")
        assert first_membership(logs[0]) == [], "delivered under the dead supervisor's lease"
    finally:
        for m in members:
            if m.proc.poll() is None:
                os.kill(m.proc.pid, signal.SIGCONT)
            m.stop()


def test_the_recorded_longest_session_is_read_safely(tmp_path: Path) -> None:
    """What the next run's grace is read from: none recorded is none; anything but a
    plain file holding a session in range (garbage, a link, a FIFO another user of an
    `ipc_allow_group` store put there) is the longest session allowed, read without
    following the link or waiting on the FIFO."""
    (tmp_path / group_slots.GROUPS_DIR).mkdir()
    path = Path(group_slots.longest_session_path(tmp_path))
    assert group_slots.read_longest_session(tmp_path) == 0
    group_slots.write_longest_session(tmp_path, 15_000, 0o600)
    assert group_slots.read_longest_session(tmp_path) == 15_000
    assert path.stat().st_mode & 0o777 == 0o600
    for text in (b"", b"-5", b"60001", b"12 ", b"x" * 40):
        path.write_bytes(text)
        assert group_slots.read_longest_session(tmp_path) == 60_000, text
    path.unlink()
    (tmp_path / "elsewhere").write_bytes(b"300")
    path.symlink_to(tmp_path / "elsewhere")
    assert group_slots.read_longest_session(tmp_path) == 60_000
    path.unlink()
    os.mkfifo(path)
    assert group_slots.read_longest_session(tmp_path) == 60_000
