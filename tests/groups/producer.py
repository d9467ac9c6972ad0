"""A producer process for the group tests:

    python -m tests.groups.producer STORE TOPIC TAG COUNT LOG [--rate N]

Puts COUNT messages with bodies `<TAG>-<i>` (ASYNC acknowledgement: `wait_store=False`),
spread over the topic's queues, and appends each acknowledged body to LOG (one line each,
written in chunks; the file is complete when `D` ends it). `--rate` caps messages per
second (0: as fast as it goes).
"""

from __future__ import annotations

import argparse
import sys
import time

from mqstore import PutMessageStatus, StoreClient


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("topic")
    p.add_argument("tag")
    p.add_argument("count", type=int)
    p.add_argument("log")
    p.add_argument("--rate", type=float, default=0.0)
    a = p.parse_args()
    done: list[str] = []
    started = time.monotonic()
    with StoreClient.attach(a.store) as client, open(a.log, "w") as log:
        for i in range(a.count):
            body = f"{a.tag}-{i}"
            while True:
                r = client.put(a.topic, body.encode(), wait_store=False)
                if r.status is PutMessageStatus.PUT_OK:
                    break
                time.sleep(0.01)  # busy or full: try again, the test counts acks only
            done.append(body)
            if len(done) >= 1000:
                log.write("\n".join(done) + "\n")
                log.flush()
                done.clear()
            if a.rate > 0:
                ahead = (i + 1) / a.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        log.write("".join(f"{b}\n" for b in done) + "D\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
