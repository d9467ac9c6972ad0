"""Consumer groups on a real supervisor: allocation, acks and offsets, handover on
leave, SIGKILL and SIGSTOP, hostile requests (`ipc.consumer`, `workers.group_coord`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from mqstore import StoreClient
from mqstore.engine.offsets import ConsumerOffsets
from mqstore.engine.record import SCHEDULE_TOPIC
from mqstore.ipc import channel
from mqstore.ipc.consumer import ConsumedMessage, ConsumerClosed
from mqstore.workers.group_coord import allocate_averagely
from tests.groups.helpers import (
    Member,
    acked_twice,
    first_membership,
    info,
    owners,
    refused,
    spawn_member,
    wait_processed,
)
from tests.runtime.harness import Store, wait_for
from tests.runtime.other_user import ROOT_ONLY, as_user, open_to_others

QUEUES = {"default_topic_queue_nums": 8}


def test_allocate_averagely_is_rocketmqs() -> None:
    """AllocateMessageQueueAveragely: contiguous ranges, the first `n % m` members one
    more; with more members than queues the last ones get nothing."""
    qs = [("t", i) for i in range(8)]
    ids = ["a", "b", "c"]
    got = [[q for _t, q in allocate_averagely(qs, ids, me)] for me in ids]
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7]]
    ids5 = [f"m{i}" for i in range(5)]
    got5 = [[q for _t, q in allocate_averagely(qs[:3], ids5, me)] for me in ids5]
    assert got5 == [[0], [1], [2], [], []]
    got4 = [[q for _t, q in allocate_averagely(qs, ids5[:4], me)] for me in ids5[:4]]
    assert got4 == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert allocate_averagely(qs, ids, "zz") == []


def _drain(consumer: object, want: int, timeout_s: float = 30) -> list[bytes]:
    from mqstore.ipc.consumer import Consumer

    assert isinstance(consumer, Consumer)
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for m in consumer.poll(64, 0.2):
            got.append(m.body)
            consumer.ack(m)
    return got


def test_members_share_queues_without_overlap(make_store: object) -> None:
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        for i in range(400):
            client.put("orders", b"m%d" % i)
        c1 = client.consumer("billing", "orders")
        c2 = StoreClient.attach(store.path).consumer("billing", ["orders"])
        try:
            wait_for(
                lambda: (
                    len(c1.assignment()) == 5
                    and len(c2.assignment()) == 4
                    and not set(c1.assignment()) & set(c2.assignment())
                ),
                20,
                "the two members to split the 9 queues",
            )
            a1, a2 = c1.assignment(), c2.assignment()
            # averagely: ids sort by join order, the first member takes the first range
            assert [q for t, q in a1 if t == "orders"] == [0, 1, 2, 3]
            assert [q for t, q in a2 if t == "orders"] == [4, 5, 6, 7]
            got = _drain(c1, 200) + _drain(c2, 200)
            assert sorted(got) == sorted(b"m%d" % i for i in range(400))
            view = owners(store.path, "billing", "orders")
            assert view == {q: c1.member_id if q < 4 else c2.member_id for q in range(8)}
        finally:
            c2.close()
        # c2 left: c1 owns all of them, and the offsets c2 acked went with the queues
        wait_for(lambda: len(c1.assignment()) == 9, 10, "c1 to take over c2's queues")
        assert c1.poll(64, 0.3) == []
        c1.close()
    committed = ConsumerOffsets(store.path)
    wait_for(
        lambda: all(committed.committed("billing", "orders", q) == 50 for q in range(8)),
        10,
        "every queue's offset (50) in consumerOffset.json",
    )


def test_a_revoked_queue_is_handed_over_after_its_delivered_messages(
    make_store: object,
) -> None:
    """A member joins while the other holds delivered, unacked messages of the queues it
    is to take: they move only once acked there (no redelivery of what was acked), and
    what was fetched but not delivered is fetched by the new owner."""
    store: Store = make_store({"default_topic_queue_nums": 2})  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        for i in range(40):
            client.put("t", b"%d" % i, queue_id=i % 2)
        c1 = client.consumer("g", "t", retry=False, pull_batch=8)
        held = []
        while len(held) < 8:
            held += c1.poll(4, 1.0)  # 8 delivered, more fetched and buffered
        c2 = StoreClient.attach(store.path).consumer("g", "t", retry=False)
        try:
            wait_for(lambda: c1.assignment() == [("t", 0)], 10, "queue 1 revoked from c1")
            assert c2.assignment() == []  # not before c1 acked what it delivered of it
            time.sleep(0.3)  # a beat or two: the handover must still be waiting (a negative)
            assert c2.assignment() == []
            for m in held:
                assert c1.ack(m)
            wait_for(lambda: c2.assignment() == [("t", 1)], 10, "c2 to own queue 1")
            got1 = _drain(c1, 20 - sum(m.queue_id == 0 for m in held), 10)
            got2 = _drain(c2, 20 - sum(m.queue_id == 1 for m in held), 10)
            bodies = [m.body for m in held] + got1 + got2
            assert sorted(bodies) == sorted(b"%d" % i for i in range(40))
        finally:
            c2.close()
            c1.close()


def test_offset_is_the_lowest_unacked(make_store: object) -> None:
    """A slow message holds back its own queue's offset, not the others'; a new member
    starts at that offset, so only the unacked messages come again."""
    store: Store = make_store({"default_topic_queue_nums": 2})  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        for i in range(20):
            client.put("t", b"%d" % i, queue_id=i % 2)
        c = client.consumer("g", "t", retry=False)
        got = []
        while len(got) < 20:
            got += c.poll(64, 1.0)
        slow = next(m for m in got if m.queue_id == 0 and m.queue_offset == 3)
        for m in got:
            if m is not slow and not (m.queue_id == 0 and m.queue_offset == 7):
                c.ack(m)
        wait_for(
            lambda: (
                {(q["queue_id"], q["offset"]) for q in info(store.path, "g")["queues"]}
                == {(0, 3), (1, 10)}
            ),
            10,
            "offsets 3 (queue 0, slow message) and 10 (queue 1)",
        )
        c.close()  # leaves: offsets persisted as they are, unacked redelivered
        c2 = client.consumer("g", "t", retry=False)
        again = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(again) < 9:
            again += c2.poll(64, 0.3)
        # queue 0 from offset 3: 3..9 (7 messages, of which only 3 and 7 were unacked)
        assert sorted((m.queue_id, m.queue_offset) for m in again) == [(0, o) for o in range(3, 10)]
        assert c2.ack(again[0])
        c2.close()


def test_sigkill_hands_unacked_messages_to_the_next_owner(
    make_store: object, tmp_path: Path
) -> None:
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    logs = [tmp_path / "m0.log", tmp_path / "m1.log"]
    members = [spawn_member(store.path, "g", "orders", log) for log in logs]
    try:
        _both_own_queues(store, members)
        with StoreClient.attach(store.path) as client:
            for i in range(3000):
                client.put("orders", f"k-{i}".encode(), wait_store=False)
        wait_for(lambda: logs[0].exists() and logs[0].stat().st_size > 2000, 30, "m0 to consume")
        victim = members[0]
        victim.kill()
        t_kill = time.monotonic()
        wait_for(
            lambda: set(owners(store.path, "g", "orders").values()) == {members[1].member_id},
            10,
            "the survivor to own every queue",
        )
        took = time.monotonic() - t_kill
        assert took < 3.0, f"rebalance after SIGKILL took {took:.2f} s"
        done = wait_processed(logs, {f"k-{i}" for i in range(3000)}, 60)
        for body, seen in done.duplicates().items():
            first_member = seen[0][0]
            assert first_member == 0 and body not in done.acked[0], (
                f"{body} processed {len(seen)} times, though it was acked before the kill"
            )
        print(f"rebalance after SIGKILL: {took * 1000:.0f} ms; duplicates "
              f"{len(done.duplicates())}")  # fmt: skip
    finally:
        for m in members:
            m.stop()


def test_sigstop_past_the_session_loses_the_queues(make_store: object, tmp_path: Path) -> None:
    """A stopped member's queues go to the others once its session ran out, never before;
    resumed, it delivers nothing of them (its lease ended first) and joins again."""
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    logs = [tmp_path / "m0.log", tmp_path / "m1.log"]
    members = [spawn_member(store.path, "g", "orders", log, "--session-ms", "1000") for log in logs]
    try:
        _both_own_queues(store, members)
        stopped = members[0]
        held = {q for q, o in owners(store.path, "g", "orders").items() if o == stopped.member_id}
        os.kill(stopped.proc.pid, signal.SIGSTOP)
        # the session runs from the member's last beat, up to a beat (100 ms, more on a
        # busy machine) before the SIGSTOP: the supervisor says how long ago it came
        t_asked = time.monotonic()
        beats = {m["id"]: m["last_beat_s"] for m in info(store.path, "g")["members"]}
        t_last_beat = t_asked - beats[stopped.member_id]
        with StoreClient.attach(store.path) as client:
            for i in range(1000):
                client.put("orders", f"s-{i}".encode(), wait_store=False)
        wait_for(
            lambda: set(owners(store.path, "g", "orders").values()) == {members[1].member_id},
            10,
            "the running member to own every queue",
        )
        took = time.monotonic() - t_last_beat
        assert took >= 0.999, f"queues moved {took:.3f} s after the last beat, before the session"
        os.kill(stopped.proc.pid, signal.SIGCONT)
        done = wait_processed(logs, {f"s-{i}" for i in range(1000)}, 60)
        wait_for(lambda: "\nR " in logs[0].read_text(), 30, "the resumed member to rejoin")
        # every message was put after its lease ended: under the membership it lost, the
        # resumed member delivered none of them (the lease is checked as a batch is handed
        # over, on the monotonic clock, from the send of its last confirmed beat)
        assert first_membership(logs[0]) == []
        # it joined again and may take queues back: the only duplicates allowed are
        # at-least-once ones (a message the running member was handed and did not ack
        # while its own lease held, e.g. its beats starved on a loaded machine); a
        # message acked is never delivered again
        dups = done.duplicates()
        assert not acked_twice(done), list(dups)[:5]
        assert held
        print(
            f"handover after the last beat: {took * 1000:.0f} ms (session 1000 ms); "
            f"{len(dups)} at-least-once duplicate(s)"
        )
    finally:
        for m in members:
            with pytest.raises(ProcessLookupError) if m.proc.poll() is not None else _null():
                os.kill(m.proc.pid, signal.SIGCONT)
            m.stop()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _stop_in_delivery(make_store: object, tmp_path: Path, point: str) -> tuple[Path, Path]:
    """Member 0 stops itself (SIGSTOP, through `--stop-at point`) with 200 messages of
    its queues in its delivery path, stays stopped until its queues went to member 1,
    is resumed and runs until every message was processed and it joined again."""
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    logs = [tmp_path / "m0.log", tmp_path / "m1.log"]
    members: list[Member] = [
        spawn_member(store.path, "g", "orders", logs[0], "--session-ms", "1000",
                     "--stop-at", point),
        spawn_member(store.path, "g", "orders", logs[1], "--session-ms", "1000"),
    ]  # fmt: skip
    try:
        _both_own_queues(store, members)
        stopped = members[0]
        os.kill(stopped.proc.pid, signal.SIGUSR2)
        wait_for(lambda: "\nU\n" in logs[0].read_text(), 20, "the stop to be armed")
        with StoreClient.attach(store.path) as client:
            for i in range(200):
                client.put("orders", f"w-{i}".encode(), wait_store=False)
        wait_for(lambda: "\nS " in logs[0].read_text(), 20, f"member 0 to stop at {point}")
        wait_for(lambda: _stopped(stopped.proc.pid), 20, "member 0 to be stopped")
        wait_for(
            lambda: set(owners(store.path, "g", "orders").values()) == {members[1].member_id},
            20,
            "the running member to own every queue",
        )
        os.kill(stopped.proc.pid, signal.SIGCONT)
        wait_processed(logs, {f"w-{i}" for i in range(200)}, 60)
        wait_for(lambda: "\nR " in logs[0].read_text(), 30, "the resumed member to rejoin")
        return logs[0], logs[1]
    finally:
        for m in members:
            with pytest.raises(ProcessLookupError) if m.proc.poll() is not None else _null():
                os.kill(m.proc.pid, signal.SIGCONT)
            m.stop()


def test_a_batch_fetched_before_a_stop_is_dropped_after_it(
    make_store: object, tmp_path: Path
) -> None:
    """Stopped after its pull fetched messages (with the lease held) and before they were
    handed over, resumed past its lease: the member drops them undelivered (the lease
    check at the hand-over reads the clock after the resume); member 1, which got the
    queues at the committed offset, delivers each once."""
    m0, m1 = _stop_in_delivery(make_store, tmp_path, "filled")
    assert first_membership(m0) == []
    done = wait_processed([m0, m1], {f"w-{i}" for i in range(200)}, 1)
    assert not acked_twice(done)


def test_a_stop_inside_the_hand_over_hands_over_nothing_of_a_lease_it_outlived(
    make_store: object, tmp_path: Path
) -> None:
    """Stopped inside `Consumer._take` just after it read the clock its lease checks
    use (with messages buffered), resumed past its lease: the last check, as the batch
    is returned, reads the clock again and drops the batch. (Before it, the checks used
    the reading taken before the stop and the member processed the batch, every ack
    refused, while member 1 delivered it too.)"""
    m0, m1 = _stop_in_delivery(make_store, tmp_path, "taking")
    assert first_membership(m0) == []
    done = wait_processed([m0, m1], {f"w-{i}" for i in range(200)}, 1)
    assert not acked_twice(done)


def test_a_batch_handed_over_just_before_a_stop_is_the_one_duplicate_window(
    make_store: object, tmp_path: Path
) -> None:
    """The window the docs name: stopped after the last lease check handed a batch over
    and before the caller got it, resumed past its lease, the member's caller gets that
    batch (it was handed over while the lease held) and processes it although member 1
    delivers it too: at-least-once. Every ack of it is refused (False: the lease is
    over), so nothing acked is delivered again and the committed offset never passes
    what member 1 had not acked; nothing else of the lost queues reaches the member."""
    m0, m1 = _stop_in_delivery(make_store, tmp_path, "taken")
    stale = first_membership(m0)
    assert stale  # the batch in hand when it stopped
    assert set(stale) <= refused(m0)
    done = wait_processed([m0, m1], {f"w-{i}" for i in range(200)}, 1)
    assert set(stale) <= set(done.duplicates())
    assert not acked_twice(done)


def _both_own_queues(store: Store, members: list[Member]) -> None:
    for m in members:
        m.wait_joined()
    wait_for(
        lambda: len(set(owners(store.path, "g", "orders").values()) - {None}) == 2,
        20,
        "both members to own queues",
    )


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _send(sock: socket.socket, obj: object) -> dict[str, object]:
    sock.sendall(json.dumps(obj).encode() + b"\n")
    return channel.recv_json(sock)


def test_hostile_group_requests_are_answered_and_harmless(make_store: object) -> None:
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    bad = [
        {"op": "group_join", "group": "g", "topics": "orders"},
        {"op": "group_join", "group": "g", "topics": []},
        {"op": "group_join", "group": "g", "topics": ["a b"]},
        {"op": "group_join", "group": "../x", "topics": ["t"]},
        {"op": "group_join", "group": "g", "topics": ["t"], "session_ms": 10**9},
        {"op": "group_join", "group": "g", "topics": ["t"], "session_ms": 1e400},
        {"op": "group_join", "group": "g", "topics": ["t"] * 100},
        {"op": "group_join", "group": "g", "topics": ["t"], "extra": 1},
        {"op": "group_beat", "group": "g", "member": "00000001@1", "release": [1]},
        {"op": "group_leave", "group": "g", "member": 5},
        {"op": "group_reset", "group": "g", "offsets": [["t", -1, 0]]},
        {"op": "group_reset", "group": "g", "offsets": "x"},
        {"op": "group_reset", "group": 7, "offsets": []},
    ]
    s = channel.connect(store.path)
    try:
        for req in bad:
            got = _send(s, req)
            assert "error" in got, (req, got)
        # a member that joins and never beats loses its queues after its session
        ok = _send(s, {"op": "group_join", "group": "g", "topics": ["orders"], "session_ms": 300})
        assert "member" in ok, ok
        for rtt in ("x", -5, 10**30, None, [1]):  # a bad round trip is ignored
            got = _send(
                s,
                {"op": "group_beat", "group": "g", "member": ok["member"], "release": [],
                 "rtt_ms": rtt},
            )  # fmt: skip
            assert "grants" in got or got.get("rejoin"), (rtt, got)
        again = _send(s, {"op": "group_join", "group": "g", "topics": ["orders"]})
        assert "error" in again
        with StoreClient.attach(store.path) as client:
            c = client.consumer("g", "orders")
            wait_for(lambda: len(c.assignment()) == 9, 10, "the real member to own all 9")
            client.put("orders", b"x", queue_id=0)
            assert [m.body for m in c.poll(8, 5.0)] == [b"x"]
            c.close()
    finally:
        s.close()
    # many joins on many connections: bounded, the store still serves
    socks = []
    try:
        for i in range(80):
            t = channel.connect(store.path)
            socks.append(t)
            _send(t, {"op": "group_join", "group": f"h{i % 3}", "topics": ["orders"]})
        assert store.status()  # the supervisor answers
        with StoreClient.attach(store.path) as client:
            assert client.put("orders", b"y").status.name == "PUT_OK"
    finally:
        for t in socks:
            t.close()


def test_consumer_threads_and_close_while_polling(make_store: object) -> None:
    store: Store = make_store(QUEUES)  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        c = client.consumer("g", "orders")
        got: list[object] = []

        def poll() -> None:
            try:
                got.append(c.poll(8, 30.0))
            except ConsumerClosed:  # closed before the poll began
                got.append([])

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.2)  # most likely inside the poll's wait now; closing must end it
        t0 = time.monotonic()
        c.close()
        t.join(10)
        assert not t.is_alive() and time.monotonic() - t0 < 5
        assert got == [[]]


@ROOT_ONLY
def test_another_user_cannot_join_or_stall_a_group(shared_dir: Path) -> None:
    """Another local user, even with the store opened to everyone, is refused before a
    group request is read: 300 joins change nothing, and the group goes on."""
    store = Store(shared_dir / "store", QUEUES)
    store.start()
    try:
        _another_user_joins(store)
    finally:
        assert store.stop() == 0
        assert not store.shm_leftovers()


def _another_user_joins(store: Store) -> None:
    with StoreClient.attach(store.path) as client:
        c = client.consumer("g", "orders")
        wait_for(lambda: len(c.assignment()) == 9, 10, "the member to own all 9")
        open_to_others(store.path)

        def joins() -> str:
            out: dict[str, int] = {}
            for _ in range(300):
                try:
                    s = channel.connect(store.path)
                except channel.SupervisorUnavailable as e:
                    out[type(e).__name__] = out.get(type(e).__name__, 0) + 1
                    continue
                with s:
                    channel.send_json(s, {"op": "group_join", "group": "g", "topics": ["orders"]})
                    reply = channel.recv_json(s)
                    key = "denied" if reply.get("denied") else json.dumps(reply)[:60]
                    out[key] = out.get(key, 0) + 1
            return json.dumps(out)

        assert json.loads(as_user(joins)) == {"denied": 300}
        assert [m["id"] for m in info(store.path, "g")["members"]] == [c.member_id]
        assert len(c.assignment()) == 9
        client.put("orders", b"still", queue_id=3)
        assert [m.body for m in c.poll(8, 5.0)] == [b"still"]
        c.close()


def test_ack_many_commits_the_lowest_unacked_of_each_queue(make_store: object) -> None:
    """`ack_many` is `ack` for a batch: it counts what it accepted, each queue's offset
    is its lowest unacked one, and a message acked twice counts once."""
    store: Store = make_store({"default_topic_queue_nums": 2})  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        for i in range(20):
            client.put("t", b"%d" % i, queue_id=i % 2)
        c = client.consumer("g", "t", retry=False)
        got = []
        while len(got) < 20:
            got += c.poll(64, 1.0)
        held = next(m for m in got if m.queue_id == 1 and m.queue_offset == 4)
        assert c.ack_many([m for m in got if m is not held]) == 19
        assert c.ack_many([got[0], got[0]]) == 0
        wait_for(
            lambda: (
                {(q["queue_id"], q["offset"]) for q in info(store.path, "g")["queues"]}
                == {(0, 10), (1, 4)}
            ),
            10,
            "offsets 10 (queue 0) and 4 (queue 1, one message held)",
        )
        assert c.ack_many([held]) == 1
        wait_for(
            lambda: {q["offset"] for q in info(store.path, "g")["queues"]} == {10},
            10,
            "both queues at 10",
        )
        c.close()


def test_an_ack_or_nack_of_what_this_consumer_did_not_deliver_changes_nothing(
    make_store: object,
) -> None:
    """A message another consumer delivered (of another group here) is refused by
    `ack`, `ack_many` and `nack` with ValueError, anything that is not a delivered
    message with TypeError, and neither changes a thing: the consumer that delivered the
    message still acks it, and no retry is sent back. (Before, `ack` of the other
    consumer's message returned True: it marked that message done, so its own consumer's
    ack returned False, and stored the other queue's offset into this group's slot file;
    `nack` sent it back to this group's retry topic; a non-message got AttributeError.)"""
    store: Store = make_store({"default_topic_queue_nums": 1})  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        for i in range(4):
            client.put("t", b"%d" % i, queue_id=0)
        c1 = client.consumer("g1", "t", retry=False)
        c2 = client.consumer("g2", "t", retry=False)
        got1: list[ConsumedMessage] = []
        got2: list[ConsumedMessage] = []
        while len(got1) < 4:
            got1 += c1.poll(64, 1.0)
        while len(got2) < 4:
            got2 += c2.poll(64, 1.0)
        foreign = got2[0]
        for call in (c1.ack, c1.nack, lambda m: c1.ack_many([got1[0], m])):
            with pytest.raises(ValueError, match="not delivered by this consumer"):
                call(foreign)
        for bad in (None, 1, "m", foreign.record):
            for call in (c1.ack, c1.nack, lambda m: c1.ack_many([m])):
                with pytest.raises(TypeError, match="expected a ConsumedMessage"):
                    call(bad)
        assert c2.ack_many(got2) == 4
        assert c1.ack_many(got1) == 4
        for g in ("g1", "g2"):
            wait_for(lambda g=g: [q["offset"] for q in info(store.path, g)["queues"]] == [4],
                     10, f"{g} at offset 4")  # fmt: skip
        assert client.max_offset(SCHEDULE_TOPIC, 2) == 0  # nothing sent back
        c1.close()
        c2.close()
