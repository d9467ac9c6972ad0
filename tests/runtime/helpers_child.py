"""Child-process scripts for the crash tests (run as `python -m tests.runtime.helpers_child`).

`put-twice DIR`: attach, put b"warm" and b"crash" to ("crash", 0) without waiting; run
with MQSTORE_CRASHPOINT set, it kills or stops itself inside the second put.
`reserve-only DIR`: attach, print "ready", then put; run with MQSTORE_CRASHPOINT=
copy-half:stop, it stops itself inside the copy: the space is reserved, the slot never
becomes DONE.
`attach-exit DIR`: attach, put one message, exit without closing.
`produce-n DIR N NAME [STOP]`: N puts (sync and no-wait alternating, every tenth a batch
of 4) to "load" over 4 queues, across stops and restarts (a refused put is tried again
later), or fewer once the file STOP exists; prints "ok BODY" per acknowledged message,
then "done".
`batch DIR`: attach, put b"warm" to ("batch", 0), then one put_batch of eight messages
there without waiting; prints each status (run with MQSTORE_CRASHPOINT to die or stop in
the batch's copy).
"""

from __future__ import annotations

import os
import sys
import time

from mqstore.ipc.client import StoreClient


def put_twice(store_dir: str) -> None:
    client = StoreClient.attach(store_dir)
    for body in (b"warm", b"crash"):
        r = client.put("crash", body, queue_id=0, wait_store=False)
        print(r.status.value, flush=True)


def reserve_only(store_dir: str) -> None:
    client = StoreClient.attach(store_dir)
    print("ready", flush=True)
    client.put("crash", b"never copied", queue_id=0, wait_store=False)


def attach_exit(store_dir: str) -> None:
    client = StoreClient.attach(store_dir)
    r = client.put("exit", b"bye")
    print(r.status.value, flush=True)
    os._exit(0)


def produce_until_refused(store_dir: str) -> None:
    """Put (sync and no-wait, alternating) until refused; print each acknowledged
    physical offset and body, then "refused"."""
    client = StoreClient.attach(store_dir)
    print("ready", flush=True)
    i = 0
    while True:
        body = b"m%d" % i
        r = client.put("drain", body, queue_id=i % 4, wait_store=i % 2 == 0)
        if r.status.value != "PUT_OK":
            print(f"refused {r.status.value}", flush=True)
            break
        print(f"{r.physical_offset} {body.decode()}", flush=True)
        i += 1
    client.close()


def batch(store_dir: str) -> None:
    client = StoreClient.attach(store_dir)
    print(client.put("batch", b"warm", queue_id=0, wait_store=False).status.value, flush=True)
    msgs = [{"topic": "batch", "body": b"batch-%d" % i, "queue_id": 0} for i in range(8)]
    for r in client.put_batch(msgs, wait_store=False):
        print(r.status.value, flush=True)


def produce_n(store_dir: str, n: str, name: str, stop: str = "") -> None:
    deadline = time.monotonic() + 60
    while True:  # the supervisor may be restarting: attach once it answers
        try:
            client = StoreClient.attach(store_dir, timeout_s=5)
            break
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    i = 0
    while i < int(n) and not (stop and os.path.exists(stop)):
        bodies = [b"%s-%d-%d" % (name.encode(), i, k) for k in range(4 if i % 10 == 9 else 1)]
        if len(bodies) == 1:
            rs = [client.put("load", bodies[0], queue_id=i % 4, wait_store=i % 2 == 0)]
        else:
            msgs = [{"topic": "load", "body": b, "queue_id": i % 4} for b in bodies]
            rs = client.put_batch(msgs)
        if all(r.status.value == "PUT_OK" for r in rs):
            for b in bodies:
                print("ok", b.decode(), flush=True)
            i += 1
        else:
            time.sleep(0.01)  # stopping, restarting, fenced: the same put again later
    print("done", flush=True)
    client.close()


MODES = {
    "batch": batch,
    "put-twice": put_twice,
    "reserve-only": reserve_only,
    "attach-exit": attach_exit,
    "produce-n": produce_n,
    "produce": produce_until_refused,
}


if __name__ == "__main__":
    MODES[sys.argv[1]](*sys.argv[2:])
