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
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

from mqstore import StoreClient
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
            if armed.is_set() and batch:  # hold this batch until the late beat's lapse
                batch_held.set()
                lapsed.wait(10)
            for m in batch:
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
