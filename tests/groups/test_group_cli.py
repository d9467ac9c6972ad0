"""`mqstore group list|describe|reset` with members running, and `mqstore tail --group`
as one of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mqstore import StoreClient
from tests.groups.helpers import info, owners
from tests.runtime.harness import REPO, Store, sigint_ignored, wait_for


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=120,
    )  # fmt: skip


def test_list_describe_and_reset_while_members_run(make_store: object) -> None:
    store: Store = make_store({"default_topic_queue_nums": 2})  # type: ignore[operator]
    d = str(store.path)
    with StoreClient.attach(store.path) as client:
        for i in range(10):
            client.put("gt", b"%d" % i, queue_id=i % 2)
        c = client.consumer("live", "gt")
        got = []
        while len(got) < 10:
            ms = c.poll(16, 2.0)
            assert ms or len(got) == 10, "nothing consumed"
            for m in ms:
                c.ack(m)
            got += ms
        wait_for(
            lambda: sorted(q["offset"] for q in info(store.path, "live")["queues"]
                           if q["topic"] == "gt") == [5, 5],
            10, "offsets 5 and 5",
        )  # fmt: skip
        listed = _cli("group", d, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {r["group"]: r for r in map(json.loads, listed.stdout.splitlines())}
        assert rows["live"]["members"] == 1 and rows["live"]["lag"] == 0

        described = _cli("group", d, "describe", "--group", "live", "--json")
        assert described.returncode == 0, described.stderr
        lines = [json.loads(x) for x in described.stdout.splitlines()]
        members = [x for x in lines if "member" in x]
        queues = {(x["topic"], x["queue_id"]): x for x in lines if "queue_id" in x}
        assert [m["member"] for m in members] == [c.member_id]
        assert queues[("gt", 0)]["owner"] == c.member_id
        assert (queues[("gt", 1)]["committed"], queues[("gt", 1)]["lag"]) == (5, 0)
        text = _cli("group", d, "describe", "--group", "live")
        assert c.member_id in text.stdout and "members: 1" in text.stdout

        # a reset while the member runs: it is told, and consumes from the new offsets
        t0 = time.monotonic()
        reset = _cli("group", d, "reset", "--group", "live", "--topic", "gt", "--to", "earliest")
        assert reset.returncode == 0, reset.stderr
        assert "1 running member(s) told" in reset.stderr
        again: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(again) < 10 and time.monotonic() < deadline:
            for m in c.poll(16, 0.5):
                again.append(m.body)
                c.ack(m)
        assert sorted(again) == sorted(b"%d" % i for i in range(10))
        print(f"reset to redelivery of all 10: {time.monotonic() - t0:.2f} s")
        # delete is refused while members run
        refused = _cli("group", d, "delete", "--group", "live")
        assert refused.returncode == 1 and "has members running" in refused.stderr
        c.close()
    assert _cli("group", d, "delete", "--group", "live").returncode == 0
    missing = _cli("group", d, "describe", "--group", "live")
    assert missing.returncode == 1, missing.stdout


def test_a_tail_of_the_group_shares_the_queues_with_the_other_members(
    make_store: object,
) -> None:
    """`mqstore tail --group G` is a real member: the group's queues are split between it
    and a program's member (none twice, none left out), every message is printed or
    processed once, and when the tail leaves its queues go to the other member at the
    offsets it acked."""
    store: Store = make_store({"default_topic_queue_nums": 4})  # type: ignore[operator]
    d = str(store.path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with StoreClient.attach(store.path) as client:
        c = client.consumer("mix", "mt", retry=False)
        tail = subprocess.Popen(
            sigint_ignored([sys.executable, "-m", "mqstore", "tail", d, "--topic", "mt",
                            "--group", "mix", "--from-beginning"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=env,
        )  # fmt: skip
        printed: list[str] = []
        reader = threading.Thread(
            target=lambda: printed.extend(json.loads(line)["body"] for line in tail.stdout or [])
        )
        reader.start()
        try:

            def split() -> bool:
                own = owners(store.path, "mix", "mt")
                return len(own) == 4 and len({o for o in own.values() if o}) == 2

            wait_for(split, 30, "the queues split between the tail and the member")
            tail_member = next(
                m["id"] for m in info(store.path, "mix")["members"] if m["pid"] == tail.pid
            )
            tail_queues = {
                q for q, o in owners(store.path, "mix", "mt").items() if o == tail_member
            }
            assert len(tail_queues) == 2 and set(c.assignment()) == {
                ("mt", q) for q in range(4) if q not in tail_queues
            }
            for i in range(40):
                assert client.put("mt", b"a%d" % i, queue_id=i % 4).ok
            processed: list[str] = []

            def all_seen() -> bool:
                for m in c.poll(64, 0.1):
                    processed.append(m.body.decode())
                    assert c.ack(m)
                return len(processed) + len(printed) >= 40

            wait_for(all_seen, 30, "every message printed or processed")
            assert sorted(processed + printed) == sorted(f"a{i}" for i in range(40))
            assert {int(b[1:]) % 4 for b in printed} == tail_queues
        finally:
            tail.send_signal(signal.SIGINT)
            try:
                _out, err = tail.communicate(timeout=60)
            finally:
                if tail.poll() is None:
                    tail.kill()
                    tail.communicate()
            reader.join()
        assert tail.returncode == 0, err
        # the tail left: its queues go to the member, from the offsets the tail acked
        wait_for(lambda: len(c.assignment()) == 4, 30, "the member to get every queue")
        for i in range(40, 48):
            assert client.put("mt", b"a%d" % i, queue_id=i % 4).ok
        later: list[str] = []
        wait_for(
            lambda: bool(later.extend(m.body.decode() for m in c.poll(64, 0.1))) or len(later) >= 8,
            30,
            "the later messages",
        )
        assert sorted(later) == sorted(f"a{i}" for i in range(40, 48))
        c.close()


# `mqstore tail` with its ack held: the gate file is made once the batch is printed and
# flushed, and the ack waits 2 s after it (a tail descheduled between the two on a busy
# machine), the window a stop signal must not cut.
_SLOW_ACK_TAIL = """
import pathlib, sys, time
from mqstore.ipc.consumer import Consumer
from mqstore.workers.cli import main
gate, ack_many = pathlib.Path(sys.argv[1]), Consumer.ack_many
def held(self, msgs):
    gate.touch()
    time.sleep(2.0)
    return ack_many(self, msgs)
Consumer.ack_many = held
sys.argv = ["mqstore", *sys.argv[2:]]
sys.exit(main())
"""


def test_a_tail_stopped_between_its_print_and_its_ack_still_acks_what_it_printed(
    make_store: object, tmp_path: Path
) -> None:
    """Ctrl-C right after a tail of the group printed a batch, before its ack: the stop
    waits for the ack, so what was printed is never delivered to the group again (it
    was: the KeyboardInterrupt cut the ack, and the next member got the batch again)."""
    store: Store = make_store({"default_topic_queue_nums": 1})  # type: ignore[operator]
    d = str(store.path)
    gate = tmp_path / "printed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with StoreClient.attach(store.path) as client:
        for i in range(3):
            assert client.put("st", b"s%d" % i, queue_id=0).ok
        tail = subprocess.Popen(
            sigint_ignored([sys.executable, "-c", _SLOW_ACK_TAIL, str(gate), "tail", d,
                            "--topic", "st", "--group", "sg", "--from-beginning"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=env,
        )  # fmt: skip
        try:
            wait_for(lambda: gate.exists() or tail.poll() is not None, 60, "the tail to print")
            tail.send_signal(signal.SIGINT)
            out, err = tail.communicate(timeout=60)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.communicate()
        assert tail.returncode == 0, err
        assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["s0", "s1", "s2"]
        with client.consumer("sg", "st", retry=False) as c:
            wait_for(lambda: c.assignment() == [("st", 0)], 30, "the member to own the queue")
            assert c.poll(8, 1.0) == []  # acked by the tail before it left
