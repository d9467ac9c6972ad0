"""CPU per put by call shape, through the public client, in interleaved rounds.

    python -m bench.put_shapes_cpu [--rounds 30] [--n 4000]

The shapes of `../shared/perf/put_shapes.py` (its lambdas, 1 KiB bodies, one ASYNC_FLUSH
store started here) and two controls that split the properties shape's extra cost:
`props_prebuilt` passes a properties dict built before the loop (the put's own work on
properties), `str_key+dict` builds the dict per call, as the properties shape does, but
does not pass it (the caller's work). Each round runs `--n` puts of every shape in turn;
the thread CPU time of a shape's best round and its median round are reported, and
their ratio to the str-key shape's, which on a machine loaded by other work says more
than put_shapes.py's wall-clock rates (a round that lost its core counts CPU only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.store_run import running_store

CLIENT = r"""
import json, sys, time
from mqstore import StoreClient
store, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pad = b"x" * 1000
bodies = [b"%023d|" % i + pad for i in range(n)]
keys = ["k%d" % i for i in range(n)]
props = [{"source": "web", "trace": k} for k in keys]
shapes = {
    "str_key": lambda c, i: c.put("t", bodies[i], tags="t", keys=keys[i]),
    "readme": lambda c, i: c.put("t", bodies[i], tags="t", keys=[keys[i]]),
    "two_keys": lambda c, i: c.put("t", bodies[i], tags="t", keys=[keys[i], "order"]),
    "properties": lambda c, i: c.put("t", bodies[i], tags="t", keys=keys[i],
                                     properties={"source": "web", "trace": keys[i]}),
    "props_prebuilt": lambda c, i: c.put("t", bodies[i], tags="t", keys=keys[i],
                                         properties=props[i]),
    "str_key+dict": lambda c, i: {"source": "web", "trace": keys[i]} and c.put(
        "t", bodies[i], tags="t", keys=keys[i]),
}
ns = {k: [] for k in shapes}
with StoreClient.attach(store) as c:
    for i in range(2000):
        c.put("warm", pad)
    for _ in range(rounds):
        for name, f in shapes.items():
            t0 = time.thread_time()
            for i in range(n):
                f(c, i)
            ns[name].append((time.thread_time() - t0) / n * 1e9)
print(json.dumps(ns))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.put_shapes_cpu", description=__doc__)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--n", type=int, default=4000)
    a = ap.parse_args(argv)
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mqs-shapes-cpu-") as tmp:
        root = Path(tmp)
        client = root / "client.py"
        client.write_text(CLIENT)
        extra = {"segment_size_bytes": 1 << 30}
        with running_store(root, "store", sync=False, pool=True, extra=extra) as run:
            r = subprocess.run(
                [sys.executable, str(client), str(run.store_dir), str(a.rounds), str(a.n)],
                capture_output=True,
                text=True,
                check=True,
            )
    ns: dict[str, list[float]] = json.loads(r.stdout)
    best0, med0 = min(ns["str_key"]), statistics.median(ns["str_key"])
    print(f"thread CPU ns per put, {a.rounds} rounds of {a.n} (load {before[0]:.1f} at start)")
    for k, v in ns.items():
        best, med = min(v), statistics.median(v)
        print(f"{k:15} best {best:5.0f} ({best0 / best:.3f})  median {med:5.0f} ({med0 / med:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
