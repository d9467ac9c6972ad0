"""`mqstore group list|describe|reset` with members running."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from mqstore import StoreClient
from tests.groups.helpers import info
from tests.runtime.harness import REPO, Store, wait_for


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
        assert refused.returncode == 1 and "consumer attached" in refused.stderr
        c.close()
    assert _cli("group", d, "delete", "--group", "live").returncode == 0
    missing = _cli("group", d, "describe", "--group", "live")
    assert missing.returncode == 1, missing.stdout
