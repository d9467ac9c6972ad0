"""A verifiable workload: every message is derived from (tag, index), so what is on disk
can be checked against what was put without keeping the bodies.

`python -m tests.reliability.workload DIR TAG SEED` attaches and puts forever (sync and
async puts and batches, mixed), printing one line per acknowledged message
`<S|A> <index> <physical_offset>` (S: a SYNC put acknowledged on disk; A: acknowledged
without waiting). Refusals print `R <status>` and it carries on (the store may be
restarting). It is meant to be SIGKILLed.
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from dataclasses import dataclass, field

TOPICS = ("rel-a", "rel-b", "rel-c")
QUEUES = 4
MAX_BATCH = 8


def message(tag: str, i: int) -> dict[str, object]:
    """The put arguments of message `i` of producer `tag` (deterministic)."""
    h = hashlib.blake2b(f"{tag}/{i}".encode(), digest_size=8).digest()
    n = int.from_bytes(h[:2], "little") % 700
    body = f"{tag}|{i}|".encode() + h * (1 + n // 8)
    return {
        "topic": TOPICS[h[2] % len(TOPICS)],
        "body": body,
        "tags": f"t{h[3] % 5}",
        "keys": f"k-{tag}-{i}",
        "queue_id": h[4] % QUEUES,
    }


def parse_body(body: bytes) -> tuple[str, int] | None:
    parts = body.split(b"|", 2)
    if len(parts) != 3:
        return None
    try:
        return parts[0].decode(), int(parts[1])
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass
class Acks:
    """What one producer's output says was acknowledged."""

    sync: dict[int, int] = field(default_factory=dict)  # index -> physical offset
    asyn: dict[int, int] = field(default_factory=dict)
    refused: int = 0

    def feed(self, line: str) -> None:
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("S", "A"):
            (self.sync if parts[0] == "S" else self.asyn)[int(parts[1])] = int(parts[2])
        elif parts and parts[0] == "R":
            self.refused += 1

    @property
    def count(self) -> int:
        return len(self.sync) + len(self.asyn)

    @property
    def highest(self) -> int:
        return max([*self.sync, *self.asyn], default=-1)


def produce(store_dir: str, tag: str, seed: int) -> None:
    from mqstore import StoreClient

    rng = random.Random(seed)
    client = StoreClient.attach(store_dir)
    print("ready", flush=True)
    i = 0
    while True:
        sync = rng.random() < 0.6
        n = rng.randint(2, MAX_BATCH) if rng.random() < 0.2 else 1
        msgs = [message(tag, i + k) for k in range(n)]
        if n == 1:
            rs = [client.put(**msgs[0], wait_store=sync)]  # type: ignore[arg-type]
        else:
            rs = client.put_batch(msgs, wait_store=sync)
        out = []
        for k, r in enumerate(rs):
            if r.ok:
                out.append(f"{'S' if sync else 'A'} {i + k} {r.physical_offset}")
            else:
                out.append(f"R {r.status.value}")
        print("\n".join(out), flush=True)
        if not all(r.ok for r in rs):
            # The store is restarting or read-only: do not spin. (Longer than the client's
            # 10 ms staleness interval: a put sooner after a failed re-attach raises
            # AttributeError, see test_put_soon_after_a_refused_put_returns_a_status.)
            time.sleep(0.02)
        i += n


if __name__ == "__main__":
    produce(sys.argv[1], sys.argv[2], int(sys.argv[3]))
