"""What message ids and idempotent puts cost (issue 26): one producer's ASYNC puts of 1 KiB
bodies in the README's call shape (`keys=[...]`, tags), with each put's UNIQ_KEY made in
C and noted in the idempotence table (the default), against the same client with ids
and idempotence off (`Appender.use_ids(None, False)`: the put as it was before), in
the same process on the same store, alternating every 2,000 puts (a load spike hits both);
the rates are over all rounds.

    python -m bench.bench_uniq [--n 60000] [--rounds 3]

Prints both rates, their ratio (goal >= 0.9; exit 1 below it) and the client CPU per put
and its ratio: on a shared, loaded machine the rates swing with the neighbours, the CPU
per put much less.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.store_run import running_store

CHUNK = 2000  # puts per turn: the two clients alternate this often, so load spikes hit both


def _turn(
    client: object, lo: int, hi: int, bodies: list[bytes], keys: list[str]
) -> tuple[float, float]:
    put = client.put  # type: ignore[attr-defined]
    c0, t0 = time.process_time(), time.perf_counter()
    bad = 0
    for i in range(lo, hi):
        if put("t", bodies[i], tags="t", keys=[keys[i]]).status.name != "PUT_OK":
            bad += 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if bad:
        raise SystemExit(f"{bad} puts not PUT_OK")
    return dt, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=60000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from mqstore import StoreClient

    pad = b"x" * 1000
    bodies = [b"%023d|" % i + pad for i in range(args.n)]
    keys = [f"k{i}" for i in range(args.n)]
    with tempfile.TemporaryDirectory(prefix="perf-uniq-") as root:
        extra = {"segment_size_bytes": 1 << 30}
        with running_store(Path(root), "uniq", sync=False, pool=True, extra=extra) as run:
            on = StoreClient.attach(run.store_dir)
            off = StoreClient.attach(run.store_dir, idempotence=False)
            off._puts.app.use_ids(None, False)  # the put without ids (this client's appender)
            for c in (on, off):
                for _ in range(2000):
                    c.put("warm", pad)
            spent = {"ids+idempotence": [0.0, 0.0], "without": [0.0, 0.0]}
            clients = [("ids+idempotence", on), ("without", off)]
            for _ in range(args.rounds):
                for lo in range(0, args.n, CHUNK):
                    clients.reverse()  # each goes first in half the turns
                    for name, c in clients:
                        dt, cpu = _turn(c, lo, min(lo + CHUNK, args.n), bodies, keys)
                        spent[name][0] += dt
                        spent[name][1] += cpu
            puts = args.rounds * args.n
            best = {k: (puts / v[0], v[1] / puts * 1e6) for k, v in spent.items()}
            check = off.put("t", b"x")
            assert check.uniq_key == "", "the 'without' client made an id: re-attached?"
            on.close()
            off.close()
    ratio = best["ids+idempotence"][0] / best["without"][0]
    print(
        "async README-shape puts/s: "
        + ", ".join(f"{k} {r:,.0f} ({c:.2f} us CPU/put)" for k, (r, c) in best.items())
        + f"; ratio {ratio:.3f} (goal >= 0.9); client CPU per put without / with "
        + f"{best['without'][1] / best['ids+idempotence'][1]:.3f}; load {os.getloadavg()[0]:.1f}"
    )
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
