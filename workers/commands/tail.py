"""`mqstore tail DIR --topic T [--queue Q] [--group G] [--from-beginning] [--tags "a || b"]
[--limit N] [--body text|base64|hex]`: follow new messages of a running store.

Prints one JSON object per message, as `mqstore dump` does, as soon as the dispatcher has
made it pullable (durable and in the consume queues). Every queue of the topic is
followed (those of `config/topics.json`, and any that appear under `consumequeue/T/`),
or only queue Q. Where it starts in each queue: the group's committed offset when it has
one, else the queue's first message with `--from-beginning`, else its end (new messages
only). With `--group`, the next offset of each queue is committed after every batch
printed (`config/consumerOffset.json`), so a later tail of the same group goes on where
this one stopped. While it runs, it is a member of the group (`ipc.groups`), so `mqstore
group DIR reset|delete` of that group is refused instead of being undone by its next
commit. Ctrl-C or SIGTERM (whatever disposition the process inherited: `_signals`), or
N messages printed (`--limit N`; `--max-messages` is its deprecated spelling), commits
and exits 0; exit 1 when the store stops
or is not running, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from mqstore.engine import topics
from mqstore.engine.offsets import ConsumerOffsets
from mqstore.engine.reader import GetStatus
from mqstore.ipc.channel import SupervisorUnavailable
from mqstore.ipc.client import StoreClient
from mqstore.ipc.groups import GroupMember
from mqstore.ipc.reads import ClientReads, for_client
from mqstore.workers.commands._common import (
    add_limit_arguments,
    below_minimum,
    group_arg,
    topic_arg,
)
from mqstore.workers.commands._records import add_body_argument, print_records
from mqstore.workers.commands._signals import stop_signals

NAME = "tail"
HELP = "follow new messages of a running store (and commit a group's offsets)"
BATCH = 64
IDLE_WAIT_S = 0.2  # longest sleep between looks while nothing comes
REDISCOVER_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory of a running store")
    p.add_argument("--topic", required=True, type=topic_arg)
    p.add_argument("--queue", type=int, default=None, metavar="Q", help="only queue Q")
    p.add_argument(
        "--group", default=None, type=group_arg, metavar="G", help="commit offsets as group G"
    )
    p.add_argument("--from-beginning", action="store_true", help="start at the first message")
    p.add_argument("--tags", default=None, help='tag filter, e.g. "a || b"')
    add_limit_arguments(p, default=None, old="--max-messages")  # then it stops
    add_body_argument(p)


def _queue_ids(store_dir: Path, topic: str, only: int | None) -> set[int]:
    if only is not None:
        return {only}
    ids = set(range(topics.queue_count(store_dir, topic)))
    with contextlib.suppress(OSError):
        ids |= {int(n) for n in os.listdir(store_dir / "consumequeue" / topic) if n.isdigit()}
    return ids


class _Tail:
    def __init__(self, reads: ClientReads, args: argparse.Namespace) -> None:
        self.reads = reads
        self.args = args
        self.offsets = ConsumerOffsets(args.store_dir)
        self.next: dict[int, int] = {}
        self.dirty: dict[int, int] = {}
        self.printed = 0

    def start_at(self, q: int) -> int:
        a = self.args
        if a.group is not None:
            got = self.offsets.committed(a.group, a.topic, q)
            if got >= 0:
                return got
        at = (
            self.reads.min_offset(a.topic, q)
            if a.from_beginning
            else self.reads.max_offset(a.topic, q)
        )
        if a.group is not None:
            self.dirty[q] = at  # the group starts here, also when it stops before a message
        return at

    def commit(self) -> None:
        if self.args.group is not None and self.dirty:
            self.offsets.commit_many(
                self.args.group, [(self.args.topic, q, o) for q, o in self.dirty.items()]
            )
        self.dirty.clear()

    def done(self) -> bool:
        m = self.args.limit
        return m is not None and self.printed >= m

    def round(self) -> bool:
        """One pull per queue; True when anything was printed or skipped."""
        a = self.args
        moved = False
        for q in sorted(self.next):
            off = self.next[q]
            res = self.reads.pull(a.topic, q, off, BATCH, tags=a.tags)
            msgs = res.messages
            nxt = res.next_offset
            if a.limit is not None and len(msgs) > a.limit - self.printed:
                msgs = msgs[: a.limit - self.printed]
                nxt = msgs[-1].queue_offset + 1
            if res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                print(
                    f"mqstore tail: queue {q}: {res.status.value} at {off}, going on at {nxt}",
                    file=sys.stderr,
                )
            self.printed += print_records(msgs, a.body)
            if nxt != off:
                self.next[q] = nxt
                self.dirty[q] = nxt
                moved = True
            if self.done():
                break
        self.commit()
        return moved

    def run(self) -> None:
        a = self.args
        last_look = 0.0
        while not self.done():
            now = time.monotonic()
            if now - last_look >= REDISCOVER_S:
                last_look = now
                for q in _queue_ids(a.store_dir, a.topic, a.queue) - set(self.next):
                    self.next[q] = self.start_at(q)
                self.commit()
            seen = self.reads.dispatched()
            if self.round():
                continue
            deadline = time.monotonic() + IDLE_WAIT_S
            step = 0.001
            while self.reads.dispatched() == seen and time.monotonic() < deadline:
                time.sleep(step)
                step = min(step * 2, 0.01)


def run(args: argparse.Namespace) -> int:
    if below_minimum(NAME, ("--limit", args.limit, 1), ("--queue", args.queue, 0)):
        return 2
    try:
        client = StoreClient.attach(args.store_dir)
    except (SupervisorUnavailable, OSError) as e:
        print(f"mqstore tail: {args.store_dir} is not running ({e})", file=sys.stderr)
        return 1
    try:
        member = GroupMember(args.store_dir, args.group) if args.group is not None else None
    except (ValueError, OSError) as e:
        client.close()
        print(f"mqstore tail: --group: {e}", file=sys.stderr)
        return 2
    reads = for_client(client)
    tail = _Tail(reads, args)
    try:
        with stop_signals():
            tail.run()
    except KeyboardInterrupt:
        pass
    except SupervisorUnavailable as e:
        print(f"mqstore tail: the store stopped ({e})", file=sys.stderr)
        return 1
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (no error at exit)
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            tail.commit()
            reads.close()
            client.close()
            if member is not None:
                member.close()
    return 0
