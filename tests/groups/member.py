"""A consumer-group member as its own process, for the tests:

    python -m tests.groups.member STORE GROUP TOPIC LOG [--session-ms N] [--fail-first K]

Joins GROUP on TOPIC and consumes until SIGTERM (then leaves cleanly). For each message it
appends `P <topic> <queue> <offset> <body> <reconsume times> <monotonic ns>` to LOG before
acking it and `A <body>` after the ack returned, each line one unbuffered write, so a
SIGKILL loses nothing of what was processed. `--fail-first K` nacks each message's first
K deliveries (retries). An ack refused (the queue is no longer this member's) is
`X <body>`. It writes `J <member id>` once joined.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from mqstore import StoreClient


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("log")
    p.add_argument("--session-ms", type=int, default=2000)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--max-reconsume", type=int, default=16)
    a = p.parse_args()
    stop = [False]

    def on_term(_sig: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
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
            for m in consumer.poll(64, 0.2):
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
    os.write(fd, b"L\n")
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
