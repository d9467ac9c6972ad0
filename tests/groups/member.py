"""A consumer-group member as its own process, for the tests:

    python -m tests.groups.member STORE GROUP TOPIC LOG [--session-ms N] [--fail-first K]

Joins GROUP on TOPIC and consumes until SIGTERM (then leaves cleanly). For each message it
appends `P <topic> <queue> <offset> <body> <reconsume times> <monotonic ns>` to LOG before
acking it and `A <body>` after the ack returned, each line one unbuffered write, so a
SIGKILL loses nothing of what was processed. `--fail-first K` nacks each message's first
K deliveries (retries). An ack refused (the queue is no longer this member's) is
`X <body>`. It writes `J <member id>` once joined.

Faults, injected at the consumer's one seam (`Consumer._exchange`, a beat's send and
reply): `--reply-delay-ms N` makes every beat reply reach the member N ms late;
`--late-beat` arms, at SIGUSR1, one beat whose thread is held 500 ms after it read the
clock and whose reply is held until the member's lease has run out: the member acks the
batch it holds in that window (`W` once it did), then the reply renews the grant.

Stops, at the consumer's delivery path: `--stop-at filled` arms, at SIGUSR2, a SIGSTOP of
the whole member the next time `Consumer._fill` pulled messages (fetched with the lease
held, not yet taken: the lease checks are still ahead); `--stop-at taking` arms one inside
`Consumer._take`, with messages buffered, just after it read the clock it checks the
leases against (the clock `ipc.consumer` reads is wrapped, in the main thread only);
`--stop-at taken` arms one the next time `Consumer._take` returns a batch (every check
done, the batch not yet in the caller's hands: the narrow window the docs name). It
writes `S <monotonic ns>` just before.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import types
from typing import Any

from mqstore import StoreClient
from mqstore.ipc import consumer as consumer_mod
from mqstore.ipc.consumer import Consumer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("log")
    p.add_argument("--session-ms", type=int, default=2000)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--max-reconsume", type=int, default=16)
    p.add_argument("--reply-delay-ms", type=int, default=0)
    p.add_argument("--late-beat", action="store_true")
    p.add_argument("--stop-at", choices=("filled", "taking", "taken"))
    a = p.parse_args()
    stop = [False]
    armed = threading.Event()  # SIGUSR1: the next beat is late
    batch_held = threading.Event()  # the main thread holds a delivered batch
    lapsed = threading.Event()  # the late beat's lease ran out
    acked = threading.Event()  # the main thread acked its batch in that window
    exchange = Consumer._exchange

    def faulty(
        self: Consumer, sock: Any, buf: bytearray, req: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        if req["op"] == "group_beat" and a.reply_delay_ms:
            t0 = time.monotonic()
            _, reply = exchange(self, sock, buf, req)
            time.sleep(a.reply_delay_ms / 1000)
            self._rtt_ms = int((time.monotonic() - t0) * 1000)
            return t0, reply
        if req["op"] == "group_beat" and armed.is_set() and batch_held.is_set():
            armed.clear()
            t0 = time.monotonic()
            time.sleep(0.5)  # the thread stalls after reading the clock
            _, reply = exchange(self, sock, buf, req)
            while time.monotonic() < t0 + a.session_ms / 1000 + 0.05:
                time.sleep(0.01)  # the reply stalls past the lease it renews
            lapsed.set()
            acked.wait(10)
            return t0, reply
        return exchange(self, sock, buf, req)

    def on_term(_sig: int, _frame: object) -> None:
        stop[0] = True

    stop_armed = threading.Event()  # SIGUSR2: stop at `--stop-at`
    fill, take = Consumer._fill, Consumer._take

    def stop_here() -> None:
        stop_armed.clear()
        os.write(fd, f"S {time.monotonic_ns()}\n".encode())
        os.kill(os.getpid(), signal.SIGSTOP)

    def stopping_fill(self: Consumer) -> bool:
        got = fill(self)
        if got and stop_armed.is_set():
            stop_here()
        return got

    def stopping_take(self: Consumer, max_count: int) -> list[Any]:
        got = take(self, max_count)
        if got and stop_armed.is_set():
            stop_here()
        return got

    in_take = [False]

    def stopping_monotonic() -> float:
        t = time.monotonic()
        if in_take[0] and threading.current_thread() is threading.main_thread():
            in_take[0] = False
            stop_here()  # the clock was read before the stop: `t` is stale after it
        return t

    def taking(self: Consumer, max_count: int) -> list[Any]:
        in_take[0] = stop_armed.is_set() and any(
            q.state == "active" and q.buffer for q in list(self._queues.values())
        )
        try:
            return take(self, max_count)
        finally:
            in_take[0] = False

    if a.stop_at == "taking":
        consumer_mod.time = types.SimpleNamespace(  # type: ignore[assignment]
            monotonic=stopping_monotonic, sleep=time.sleep
        )
        Consumer._take = taking  # type: ignore[method-assign]
    elif a.stop_at == "filled":
        Consumer._fill = stopping_fill  # type: ignore[method-assign]
    elif a.stop_at == "taken":
        Consumer._take = stopping_take  # type: ignore[method-assign]

    def on_usr2(_sig: int, _frame: object) -> None:
        stop_armed.set()
        os.write(fd, b"U\n")

    signal.signal(signal.SIGUSR2, on_usr2)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, lambda _s, _f: armed.set())
    if a.reply_delay_ms or a.late_beat:
        Consumer._exchange = faulty  # type: ignore[method-assign]
    fd = os.open(a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with (
        StoreClient.attach(a.store) as client,
        client.consumer(
            a.group, [a.topic], session_ms=a.session_ms, max_reconsume_times=a.max_reconsume
        ) as consumer,
    ):
        os.write(fd, f"J {consumer.member_id}\n".encode())
        me = consumer.member_id
        while not stop[0]:
            if consumer.member_id != me:  # joined again (its connection broke)
                me = consumer.member_id
                os.write(fd, f"R {me} {time.monotonic_ns()}\n".encode())
            batch = consumer.poll(64, 0.2)
            if consumer.member_id != me:
                # joined again during the poll: what it handed out of the membership it
                # lost (queues `_drop_all` dropped) is logged before `R`, the rest after
                batch.sort(key=lambda m: m._q.state != "dropped")
            if armed.is_set() and batch:  # hold this batch until the late beat's lapse
                batch_held.set()
                lapsed.wait(10)
            for m in batch:
                if consumer.member_id != me and m._q.state != "dropped":
                    me = consumer.member_id
                    os.write(fd, f"R {me} {time.monotonic_ns()}\n".encode())
                body = m.body.decode()
                os.write(
                    fd,
                    f"P {m.topic} {m.queue_id} {m.queue_offset} {body} {m.reconsume_times} "
                    f"{time.monotonic_ns()}\n".encode(),
                )
                if m.reconsume_times < a.fail_first:
                    consumer.nack(m)
                    os.write(fd, f"N {body}\n".encode())
                elif consumer.ack(m):
                    os.write(fd, f"A {body}\n".encode())
                else:  # the queue was no longer ours (lease over): the next owner has it
                    os.write(fd, f"X {body}\n".encode())
            if lapsed.is_set() and not acked.is_set():
                os.write(fd, b"W\n")
                acked.set()
    os.write(fd, b"L\n")
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
