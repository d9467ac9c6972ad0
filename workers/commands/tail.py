"""`mqstore tail DIR --topic T [--queue Q | --group G] [--from-beginning] [--tags "a || b"]
[--limit N] [--body text|base64|hex]`: follow new messages of a running store.

Prints one JSON object per message, as `mqstore dump` does, as soon as the dispatcher has
made it pullable (durable and in the consume queues).

Without `--group` it only reads: every queue of the topic is followed (those of
`config/topics.json`, and any that appear under `consumequeue/T/`), or only queue Q,
each from its first message with `--from-beginning`, else from its end (new messages
only). Nothing is committed.

With `--group G` it is a **member of consumer group G**, as Kafka's console consumer with
`--group` is: it joins through the supervisor (`StoreClient.consumer`, docs/consumers.md),
consumes only the queues of T the group allocates to it (shared with G's other members,
tails or programs, and rebalanced as members come and go), and acks each message once it
is printed (or skipped by `--tags`), so G's committed offset of each queue moves on as it
prints: a later tail of G goes on where this one stopped, and what it printed is never
delivered to G again. Where a queue starts when G has no offset in it: its first message
with `--from-beginning`, else its end. `mqstore group DIR reset` of G works while it runs
(it drops the queues and gets them back at the new offsets), as for any member. `--queue`
does not go with `--group` (a member consumes what the group gives it); G's retry topic
is not consumed by a tail.

Ctrl-C or SIGTERM (whatever disposition the process inherited: `_signals`), or N
messages printed (`--limit N`; `--max-messages` is its deprecated spelling), leaves the
group (what was delivered and not printed goes to the next owner; a stop that comes
while a batch is printed waits for that batch's ack) and exits 0; exit 1
when the store stops or is not running, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from mqstore.engine import topics
from mqstore.engine.pull import TagFilter
from mqstore.engine.reader import GetStatus
from mqstore.ipc.channel import SupervisorUnavailable
from mqstore.ipc.client import StoreClient
from mqstore.ipc.consumer import Consumer
from mqstore.ipc.reads import ClientReads, for_client
from mqstore.workers.commands._common import (
    add_limit_arguments,
    below_minimum,
    group_arg,
    topic_arg,
)
from mqstore.workers.commands._records import add_body_argument, print_records
from mqstore.workers.commands._signals import held_stop_signals, stop_signals

NAME = "tail"
HELP = "follow new messages of a running store (with --group: as a member of a consumer group)"
BATCH = 64
IDLE_WAIT_S = 0.2  # longest sleep between looks while nothing comes
REDISCOVER_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path, help="the store directory of a running store")
    p.add_argument("--topic", required=True, type=topic_arg)
    p.add_argument(
        "--queue", type=int, default=None, metavar="Q", help="only queue Q (not with --group)"
    )
    p.add_argument(
        "--group",
        default=None,
        type=group_arg,
        metavar="G",
        help="consume as a member of group G: the queues G gives it, acked as printed",
    )
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the first message (with --group: where G has no offset yet)",
    )
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
    """The read-only tail: every queue of the topic (or one), nothing committed."""

    def __init__(self, reads: ClientReads, args: argparse.Namespace) -> None:
        self.reads = reads
        self.args = args
        self.next: dict[int, int] = {}
        self.printed = 0

    def start_at(self, q: int) -> int:
        a = self.args
        if a.from_beginning:
            return self.reads.min_offset(a.topic, q)
        return self.reads.max_offset(a.topic, q)

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
                moved = True
            if self.done():
                break
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
            seen = self.reads.dispatched()
            if self.round():
                continue
            deadline = time.monotonic() + IDLE_WAIT_S
            step = 0.001
            while self.reads.dispatched() == seen and time.monotonic() < deadline:
                time.sleep(step)
                step = min(step * 2, 0.01)


def _member(consumer: Consumer, args: argparse.Namespace) -> None:
    """The group member's loop: poll what the group gives, print, ack (a message the tag
    filter leaves out is acked unprinted, as a subscription's filter skips it)."""
    wanted = TagFilter.of(args.tags).wanted
    printed = 0
    while args.limit is None or printed < args.limit:
        n = BATCH if args.limit is None else min(BATCH, args.limit - printed)
        msgs = consumer.poll(n, IDLE_WAIT_S)
        if not msgs:
            continue
        shown = [m.record for m in msgs if wanted is None or m.tags in wanted]
        # a stop waits for the ack of what was printed: cut between the two, the next
        # member of the group was delivered the batch this one had printed
        with held_stop_signals():
            printed += print_records(shown, args.body)
            consumer.ack_many(msgs)


def run(args: argparse.Namespace) -> int:
    if below_minimum(NAME, ("--limit", args.limit, 1), ("--queue", args.queue, 0)):
        return 2
    if args.group is not None and args.queue is not None:
        print(
            "mqstore tail: --queue does not go with --group: a member of a group consumes "
            "the queues the group gives it (drop --group to read one queue)",
            file=sys.stderr,
        )
        return 2
    try:
        client = StoreClient.attach(args.store_dir)
    except (SupervisorUnavailable, OSError) as e:
        print(f"mqstore tail: {args.store_dir} is not running ({e})", file=sys.stderr)
        return 1
    consumer: Consumer | None = None
    reads: ClientReads | None = None
    try:
        with stop_signals():
            if args.group is not None:
                try:
                    consumer = client.consumer(
                        args.group,
                        args.topic,
                        from_where="first" if args.from_beginning else "last",
                        retry=False,
                    )
                except ValueError as e:
                    print(f"mqstore tail: --group: {e}", file=sys.stderr)
                    return 1
                _member(consumer, args)
            else:
                reads = for_client(client)
                _Tail(reads, args).run()
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
            if consumer is not None:
                consumer.close()  # leaves: its queues go to the group's other members
            if reads is not None:
                reads.close()
            client.close()
    return 0
