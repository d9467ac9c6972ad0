"""The producer's side of a put alone: the C call into a real control block, no store.

    python -m bench.profile_put_native put|batch [--n 200000] [--reps 3] [--warm 300000]
                                                 [--dir DIR] [--shape SHAPE]

Creates a control block and a write pool (two 64 MiB buffers) in this process, configures
an `Appender` as `StoreClient` does (one topic, four queues, tags TagA), then times
`put_message` (1 KiB body, a unique key each, in `--shape`: the call shapes of
`../shared/perf/put_shapes.py`, str_key by default) or `put_batch_messages` of 128 dicts
of that shape, `--reps` times over `--n` messages, after `--warm` messages have mapped the
whole pool. With nobody to commit, it plays the committer's part in the control block at
each segment end (`--dir`: the control block's directory, else a temporary one). Prints
thread CPU and page faults per message. Deterministic enough for callgrind:

    valgrind --tool=callgrind python -m bench.profile_put_native batch --n 12800 --reps 1 \\
        --warm 1280
    callgrind_annotate --inclusive=yes callgrind.out.<pid> | grep mqs_put_batch_messages
"""

from __future__ import annotations

import argparse
import array
import os
import resource
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from mqstore import _native
from mqstore.engine.record import Message
from mqstore.ipc import control as c
from mqstore.ipc.control_views import Flags, Positions
from mqstore.ipc.results import PutMessageStatus, PutResult

SEG = 64 << 20
TOPIC = "BenchTopic"
TAGS = "TagA"
BATCH = 128
OK = PutMessageStatus.PUT_OK

# put_message's (tags, keys, properties) for message i, as ../shared/perf/put_shapes.py puts
SHAPES: dict[str, Callable[[str], tuple[str, Any, Any]]] = {
    "str_key": lambda k: (TAGS, k, None),
    "readme": lambda k: (TAGS, [k], None),
    "two_keys": lambda k: (TAGS, [k, "order"], None),
    "properties": lambda k: (TAGS, k, {"source": "web", "trace": k}),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_put_native", description=__doc__)
    ap.add_argument("mode", choices=("put", "batch"))
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warm", type=int, default=300_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="str_key")
    a = ap.parse_args(argv)
    tmp = a.dir or tempfile.mkdtemp(prefix="mqs-native-")
    geo = c.Geometry(SEG, 2, slot_count=8192, qtable_capacity=256)
    cb = c.ControlBlock.create(tmp, 1, geo, token=secrets.token_hex(4))
    try:
        Flags(cb).mark_running()
        Positions(cb).raise_allocated(1 << 50)
        tb = TOPIC.encode()
        lanes = {TOPIC: [tb, 4, 4, 0, [cb.find_or_add_queue(tb, q) for q in range(4)]]}
        app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
        app.configure(
            lock=_native.PutLock(),
            lanes=lanes,
            new_lane=lambda topic: lanes[topic],
            find_row=cb.find_or_add_queue,
            map_segment=None,
            message_type=Message,
            message_fields=lambda _i, _m: "no Messages here",
            stats=array.array("q", bytes(8 * c.CLIENT_FIELDS)),
            stats_off=cb.client_off(0),
            result_type=PutResult,
            statuses=tuple(PutMessageStatus),
            flush_reasons=("timed out", "failed"),
            msg_id_prefix="7F00000100002A9F",
            sync=False,
            sync_timeout_ns=10**9,
            busy_ns=10**8,
            fast_fail=True,  # no committer here: a roll past the pool is refused at once
            max_body=1 << 22,
            store_addr=b"\x7f\x00\x00\x01",
            store_port=10911,
        )
        app.checked(10**15)
        body = os.urandom(1024)

        def roll() -> None:
            """A segment's end the pool cannot take: what the committer would free."""
            pos = Positions(cb)
            pos.skip_to((pos.reserved // SEG + 1) * SEG)

        def run(n: int) -> tuple[float, float]:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.thread_time()
            done = 0
            if a.mode == "put":
                put = app.put_message
                shape = SHAPES[a.shape]
                for i in range(n):
                    tags, keys, props = shape(f"c{i}")
                    if put(TOPIC, body, tags, keys, props, None, False).status is not OK:
                        roll()
                    done += 1
            else:
                msgs = [dict(zip(("topic", "body", "tags", "keys", "properties"),
                                 (TOPIC, body, *SHAPES[a.shape](f"k{i}")), strict=True))
                        for i in range(BATCH)]  # fmt: skip
                for _ in range(max(1, n // BATCH)):
                    if app.put_batch_messages(msgs, False)[0].status is not OK:
                        roll()
                    done += BATCH
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            return (time.thread_time() - t0) / done * 1e6, faults / done

        run(a.warm)
        for _ in range(a.reps):
            cpu, faults = run(a.n)
            print(
                f"{a.mode}: {cpu:.3f} µs CPU/msg, {faults:.3f} faults/msg, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        app.close()
    finally:
        cb.close()
        if a.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
