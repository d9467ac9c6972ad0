"""Issue 25: does a consumer group of 2 keep up with one producer's async put rate?

    python -m bench.bench_groups [--n 200000] [--body 1024] [--members 2] [--ack-many]

A fresh ASYNC_FLUSH store (pool on, 8 queues per topic). `--members` consumer processes
join one group (`StoreClient.consumer`, poll 64, ack each, or `ack_many` per poll), then
one producer process puts `--n` messages as fast as it can (`put(..., wait_store=False)`:
the async put). Reported: the producer's rate, the group's rate over the same window
(first put to the last message acked), the lag when the producer finished and how long
the group took to drain it, and when the dispatcher had put the last message in its
consume queue (a consumer reads nothing before that), and each member's CPU time per
message it acked (the rates follow the load of a shared machine; this much less). The
group keeps up when it is done soon after the dispatcher. Prints one JSON line with the
load average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.store_run import REPO, running_store
from mqstore import StoreClient
from mqstore.ipc.control_views import Positions

_PRODUCER = r"""
import sys, time
from mqstore import StoreClient
store, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = b"x" * size
with StoreClient.attach(store) as c:
    t0 = time.monotonic_ns()
    for i in range(n):
        while c.put("bench-group", body, wait_store=False).status.name != "PUT_OK":
            time.sleep(0.001)
    t1 = time.monotonic_ns()
print(t0, t1)
"""

_MEMBER = r"""
import os, signal, sys, time
from mqstore import StoreClient
store, out, many = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
n = 0
last = 0
said = 0
with StoreClient.attach(store) as c, c.consumer("bench", "bench-group") as g:
    os.write(fd, b"J\n")
    while not stop:
        got = g.poll(64, 0.05)
        if many:
            g.ack_many(got)
            n += len(got)
        else:
            for m in got:
                g.ack(m)
                n += 1
        if got:
            last = time.monotonic_ns()
        if n - said >= 1000 or (not got and n != said):
            os.write(fd, b"%d %d %d\n" % (n, last, time.process_time_ns()))
            said = n
"""


def _progress(path: Path) -> list[tuple[int, int]]:
    """A member's marks: (messages acked, when the last was) after each 1000 or so."""
    return [(n, t) for n, t, _cpu in _marks(path)]


def _marks(path: Path) -> list[tuple[int, int, int]]:
    """A member's marks with its process's CPU time (ns) at each."""
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return out


def _cpu_per_message(marks: list[tuple[int, int, int]]) -> float | None:
    """The member's CPU µs per message from its first mark to its last (its idle polls
    before the producer started left out)."""
    if len(marks) < 2 or marks[-1][0] == marks[0][0]:
        return None
    return (marks[-1][2] - marks[0][2]) / 1e3 / (marks[-1][0] - marks[0][0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--ack-many", action="store_true", help="members ack each poll's batch at once")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory(prefix="bench-groups-") as tmp:
        root = Path(tmp)
        extra = {"default_topic_queue_nums": 8, "segment_size_bytes": 256 << 20}
        with running_store(root, "groups", sync=False, pool=True, extra=extra) as run:
            logs = [root / f"member-{i}.log" for i in range(a.members)]
            members = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _MEMBER,
                        str(run.store_dir),
                        str(log),
                        str(int(a.ack_many)),
                    ],
                    env=env,
                )
                for log in logs
            ]
            try:
                deadline = time.monotonic() + 60
                while not all(p.exists() and p.read_text().startswith("J") for p in logs):
                    if time.monotonic() > deadline:
                        raise SystemExit("members did not join")
                    time.sleep(0.05)
                time.sleep(1.0)  # the first rebalance settles (2 members: 4 queues each)
                prod = subprocess.run(
                    [sys.executable, "-c", _PRODUCER, str(run.store_dir), str(a.n), str(a.body)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                t0, t1 = map(int, prod.stdout.split())
                with StoreClient.attach(run.store_dir) as watcher:
                    end = watcher.positions()["published"]
                    while Positions(watcher.live_control_block()).dispatched < end:
                        time.sleep(0.001)
                    t_dispatched = time.monotonic_ns()
                deadline = time.monotonic() + 600
                while True:
                    got = [_progress(log) for log in logs]
                    done = sum(g[-1][0] if g else 0 for g in got)
                    if done >= a.n:
                        break
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the group consumed {done} of {a.n}")
                    time.sleep(0.05)
            finally:
                for p in members:
                    p.send_signal(signal.SIGTERM)
                for p in members:
                    p.wait(60)
            got = [_progress(log) for log in logs]
            total = sum(g[-1][0] for g in got)
            # consumed by the producer's end: each member's last mark at or before t1
            at_end = sum(max((n for n, t in g if t <= t1), default=0) for g in got)
            last = max(g[-1][1] for g in got if g)
            result = {
                "messages": a.n,
                "body_bytes": a.body,
                "members": a.members,
                "ack": "ack_many" if a.ack_many else "ack",
                "consumed": total,
                "producer_rate_per_s": round(a.n / ((t1 - t0) / 1e9)),
                "group_rate_per_s": round(total / ((last - t0) / 1e9)),
                "lag_at_producer_end": a.n - at_end,
                "drain_after_producer_s": round(max(0, last - t1) / 1e9, 3),
                # consumers read only what the dispatcher has put in the consume queues
                "dispatched_after_producer_s": round(max(0, t_dispatched - t1) / 1e9, 3),
                "group_done_after_dispatch_s": round((last - t_dispatched) / 1e9, 3),
                # each member's CPU per message it acked, from its first mark to its last
                "member_cpu_us_per_msg": [
                    None if c is None else round(c, 3)
                    for c in (_cpu_per_message(_marks(log)) for log in logs)
                ],
                "uptime": os.getloadavg(),
            }
            print(json.dumps(result))
            return 0 if total >= a.n else 1


if __name__ == "__main__":
    sys.exit(main())
