"""A producer process for the consume tests: `python -m tests.consume.producer DIR TOPIC NAME N`.

Attaches, prints "ready", then puts N messages (forever when N is 0) with sync puts,
spread over the topic's queues by the client; after each PUT_OK it prints
`queue_id queue_offset physical_offset body` (an acknowledged message). Stops at the
first put that fails, printing `failed STATUS`.
"""

from __future__ import annotations

import sys

from mqstore.ipc.client import StoreClient


def main(store_dir: str, topic: str, name: str, n: int) -> None:
    client = StoreClient.attach(store_dir)
    print("ready", flush=True)
    i = 0
    while n == 0 or i < n:
        body = f"{name}-{i}"
        r = client.put(topic, body.encode(), keys=[body], tags=name)
        if not r.ok:
            print(f"failed {r.status.value}", flush=True)
            break
        print(f"{r.queue_id} {r.queue_offset} {r.physical_offset} {body}", flush=True)
        i += 1
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
