"""The consumer-group load run (issue 25), shared by `tests/load` (short) and
`tests/reliability` (1,000,000 messages):

4 member processes of one group consume a topic of 8 queues while 2 producer processes
put; every `kill_every_s`, until every message is processed, one member (at random,
from the seed) is SIGKILLed and a new one joins. Checked at the end: every acknowledged
put processed at least once; a message processed twice only if no member had acked it
before (its first processing was by a member then killed, or whose queue was taken from
it). Rebalances measured: from each SIGKILL until no queue is owned by the dead member
and all 8 have a live owner, and from each join until the newcomer owns its share.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.groups.helpers import (
    Member,
    Processed,
    owners,
    produced,
    spawn_member,
    spawn_producer,
)
from tests.runtime.harness import Store

TOPIC = "load-orders"
GROUP = "load-group"
CONFIG = {
    "flush_disk_type": "ASYNC_FLUSH",
    "default_topic_queue_nums": 8,
    "segment_size_bytes": 16 << 20,
    "transient_store_pool_size": 3,
}


@dataclass
class Figures:
    messages: int = 0
    processed: int = 0
    duplicates: int = 0
    kills: int = 0
    kill_rebalance_s: list[float] = field(default_factory=list)
    join_rebalance_s: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        def stat(xs: list[float]) -> str:
            if not xs:
                return "-"
            return (
                f"median {statistics.median(xs) * 1000:.0f} ms, "
                f"max {max(xs) * 1000:.0f} ms over {len(xs)}"
            )

        return (
            f"{self.messages} messages, {self.processed} processings, "
            f"{self.duplicates} duplicates (all un-acked at a kill), {self.kills} kills, "
            f"rebalance after SIGKILL {stat(self.kill_rebalance_s)}, "
            f"after a join {stat(self.join_rebalance_s)}, {self.seconds:.1f} s"
        )


def _wait_owners(store: Path, cond: object, timeout_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        o = owners(store, GROUP, TOPIC)
        if cond(o):  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.005)
    return None


def run(root: Path, per_producer: int, kill_every_s: float, min_kills: int, seed: int) -> Figures:
    rnd = random.Random(seed)
    store = Store(root / "store", CONFIG)
    store.start()
    members: list[Member] = []
    logs: list[Path] = []
    fig = Figures()
    t_start = time.monotonic()
    try:

        def add_member() -> Member:
            log = root / f"member-{len(logs)}.log"
            logs.append(log)
            m = spawn_member(store.path, GROUP, TOPIC, log)
            members.append(m)
            return m

        for _ in range(4):
            add_member()
        for m in members:
            m.wait_joined()
        prod_logs = [root / f"producer-{i}.log" for i in range(2)]
        producers = [
            spawn_producer(store.path, TOPIC, f"p{i}", per_producer, prod_logs[i]) for i in range(2)
        ]
        next_kill = time.monotonic() + kill_every_s
        wantset: set[str] = set()
        deadline = float("inf")
        last_check = 0.0
        while True:
            if time.monotonic() < next_kill:
                time.sleep(0.05)
            if all(p.poll() is not None for p in producers) and not wantset:
                for p in producers:
                    assert p.returncode == 0
                want = produced(prod_logs)
                fig.messages = len(want)
                assert fig.messages == 2 * per_producer
                wantset = set(want)
                deadline = time.monotonic() + max(120.0, fig.messages / 2000)
            if wantset and fig.kills >= min_kills and time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()  # reading the logs takes a while: not too often
                missing = wantset - Processed.read(logs).by_body.keys()
                if not missing:
                    break
                assert time.monotonic() < deadline, (
                    f"{len(missing)} of {len(wantset)} messages never processed (lost), "
                    f"e.g. {sorted(missing)[:5]}"
                )
            if time.monotonic() < next_kill:
                continue
            # a kill every `kill_every_s` while producers put and members consume
            next_kill = time.monotonic() + kill_every_s
            live = [m for m in members if not m.killed]
            victim = rnd.choice(live)
            victim.kill()
            fig.kills += 1
            dead = victim.member_id
            took = _wait_owners(
                store.path,
                lambda o, dead=dead: (
                    len(o) == 8 and all(v is not None and v != dead for v in o.values())
                ),
                30,
            )
            assert took is not None, f"no rebalance within 30 s of SIGKILL {fig.kills}"
            fig.kill_rebalance_s.append(took)
            new = add_member()
            new_id = new.wait_joined()
            took = _wait_owners(
                store.path,
                lambda o, new_id=new_id: (
                    sum(v == new_id for v in o.values()) == 2
                    and all(v is not None for v in o.values())
                ),
                30,
            )
            assert took is not None, "the newcomer got no share within 30 s"
            fig.join_rebalance_s.append(took)
        for m in members:
            if not m.killed:
                assert m.stop() == 0
        done = Processed.read(logs)
        fig.processed = sum(len(v) for v in done.by_body.values())
        dups = done.duplicates()
        fig.duplicates = len(dups)
        killed = {i for i, m in enumerate(members) if m.killed}
        for body, seen in dups.items():
            for member_index, _ns in seen[:-1]:
                # processed again only because this earlier processing was never acked
                assert body not in done.acked[member_index], (
                    f"{body} was acked by member {member_index} and processed again "
                    f"({len(seen)} times; killed members {sorted(killed)})"
                )
        fig.seconds = time.monotonic() - t_start
        return fig
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait()
        code = store.stop()
        assert code == 0, store.output()[-2000:]
        assert not store.shm_leftovers()
