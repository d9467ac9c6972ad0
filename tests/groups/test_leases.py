"""Leases under late beats (`ipc.consumer`, `workers.group_coord`): a member whose lease
ran out while its grant was still renewed by the supervisor, and a member whose beat
replies keep arriving too late to use its leases."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path

from mqstore import StoreClient
from tests.groups.helpers import info, owners, spawn_member, wait_processed
from tests.runtime.harness import Store, wait_for

QUEUES = {"default_topic_queue_nums": 4}


def _acks(logs: list[Path]) -> collections.Counter[str]:
    """How many times each body's ack returned True, over every member's log."""
    out: collections.Counter[str] = collections.Counter()
    for log in logs:
        for line in log.read_text().splitlines():
            if line.startswith("A "):
                out[line[2:]] += 1
    return out


def _put_until(store: Store, prefix: str, stop: threading.Event, sent: list[str]) -> None:
    with StoreClient.attach(store.path) as client:
        i = 0
        while not stop.is_set() or i < 500:
            body = f"{prefix}-{i}"
            client.put("orders", body.encode(), wait_store=False)
            sent.append(body)
            i += 1
            if i % 50 == 0:
                time.sleep(0.01)


def test_an_ack_refused_after_a_lapse_never_lets_a_later_commit_pass_it(
    make_store: object, tmp_path: Path
) -> None:
    """The member's lease runs out while the supervisor still holds its grant (a beat
    stalled after the member read its clock, its reply stalled past the lease): the acks
    it makes then are refused, and the reply renews the grant. Then it is SIGKILLed. The
    next owner of its queues starts at the lowest offset it had not acked: nothing whose
    ack returned True is delivered again, nothing is lost, the queues move on at once."""
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    logs = [tmp_path / "late.log", tmp_path / "ok.log"]
    late = spawn_member(store.path, "g", "orders", logs[0], "--session-ms", "1000", "--late-beat")
    late.wait_joined()
    ok = spawn_member(store.path, "g", "orders", logs[1], "--session-ms", "1000")
    ok.wait_joined()
    stop = threading.Event()
    sent: list[str] = []
    producer = threading.Thread(target=_put_until, args=(store, "l", stop, sent))
    try:
        wait_for(
            lambda: len(set(owners(store.path, "g", "orders").values()) - {None}) == 2,
            20,
            "both members to own queues",
        )
        producer.start()
        wait_for(lambda: logs[0].stat().st_size > 2000, 30, "the late member to consume")
        os.kill(late.proc.pid, signal.SIGUSR1)
        wait_for(lambda: "\nW\n" in logs[0].read_text(), 30, "the late beat's window")
        refused = logs[0].read_text().count("\nX ")
        assert refused > 0, "no ack was made after the lease ran out: the fault missed"
        # the late member consumes again after the lapse, then dies
        size = logs[0].stat().st_size
        wait_for(lambda: logs[0].stat().st_size > size + 2000, 30, "consuming after the lapse")
        late.kill()
        t_kill = time.monotonic()
        wait_for(
            lambda: set(owners(store.path, "g", "orders").values()) == {ok.member_id},
            10,
            "the survivor to own every queue",
        )
        took = time.monotonic() - t_kill
        stop.set()
        producer.join(60)
        done = wait_processed(logs, set(sent), 120)
        twice = {b: n for b, n in _acks(logs).items() if n > 1}
        assert not twice, f"acked twice (an acked message delivered again): {list(twice)[:5]}"
        assert took < 3.0, f"rebalance after SIGKILL took {took:.2f} s"
        print(
            f"refused acks in the lapse: {refused}; rebalance after SIGKILL {took * 1000:.0f} ms;"
            f" duplicates {len(done.duplicates())}"
        )
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(60)
        for m in (late, ok):
            if m.proc.poll() is None:
                m.stop()


def test_a_member_whose_beat_replies_come_late_hands_its_queues_on(
    make_store: object, tmp_path: Path
) -> None:
    """Every beat reply reaches one member 700 ms late (session 1 s): it keeps beating in
    time for the supervisor, but holds too little of each lease to consume. Its queues
    go to the other member, which consumes everything; it is still a member."""
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    logs = [tmp_path / "slow.log", tmp_path / "ok.log"]
    slow = spawn_member(
        store.path, "g", "orders", logs[0], "--session-ms", "1000", "--reply-delay-ms", "700"
    )
    ok = spawn_member(store.path, "g", "orders", logs[1], "--session-ms", "1000")
    try:
        slow.wait_joined()
        ok.wait_joined()
        wait_for(
            lambda: (
                set(owners(store.path, "g", "orders").values()) == {ok.member_id}
                and len(owners(store.path, "g", "orders")) == 4
            ),
            20,
            "the quick member to own every queue",
        )
        members = {m["id"]: m for m in info(store.path, "g")["members"]}
        assert members[slow.member_id]["slow"] and not members[slow.member_id]["gone"]
        with StoreClient.attach(store.path) as client:
            for i in range(2000):
                client.put("orders", f"s-{i}".encode(), wait_store=False)
        done = wait_processed(logs, {f"s-{i}" for i in range(2000)}, 60)
        assert not done.duplicates(), list(done.duplicates())[:5]
        assert set(owners(store.path, "g", "orders").values()) == {ok.member_id}
    finally:
        for m in (slow, ok):
            if m.proc.poll() is None:
                m.stop()


def test_a_grant_revoked_before_its_member_heard_of_it_is_handed_on_at_its_next_beat(
    make_store: object, tmp_path: Path
) -> None:
    """A grant made between two of its member's beats (here the member is stopped when
    another dies) and revoked before the next (a newcomer joins) was never taken up: the
    member hands it back at that beat, and the newcomer gets its share then, not when
    the grant's lease (10 s) would have run out."""
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    session = ("--session-ms", "10000")
    a = spawn_member(store.path, "g", "orders", tmp_path / "a.log", *session)
    a.wait_joined()
    b = spawn_member(store.path, "g", "orders", tmp_path / "b.log", *session)
    b.wait_joined()
    c = None
    try:
        wait_for(
            lambda: len(set(owners(store.path, "g", "orders").values()) - {None}) == 2,
            30,
            "two owners of two queues each",
        )
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            a.kill()  # a's queues are granted to b while b hears nothing
            wait_for(
                lambda: set(owners(store.path, "g", "orders").values()) == {b.member_id},
                30,
                "a's queues granted to the stopped b",
            )
            c = spawn_member(store.path, "g", "orders", tmp_path / "c.log", *session)
            c.wait_joined()  # revokes two of b's grants: at least one b never heard of
            wait_for(
                lambda: None in owners(store.path, "g", "orders").values(),
                30,
                "b's queues being handed over",
            )
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        resumed = time.monotonic()
        new = c.member_id
        wait_for(
            lambda: sum(o == new for o in owners(store.path, "g", "orders").values()) == 2,
            30,
            "the newcomer's share",
        )
        took = time.monotonic() - resumed
        assert took < 3.0, f"the newcomer got its share {took:.2f} s after b resumed"
    finally:
        for m in (b, c):
            if m is not None:
                assert m.stop() == 0
