"""Instructions of the C put by call shape, through the public client, counted by callgrind.

    python -m bench.callgrind_put_shapes [--n 20000] [--shapes str_key,readme,...]
                                         [--out FILE]

The shapes of `../shared/perf/put_shapes.py` (the same lambdas, 1 KiB bodies, one
ASYNC_FLUSH store started here): for each shape a client process under
`valgrind --tool=callgrind --toggle-collect=mqs_put_message` puts `--n` messages; the
instructions counted inside the C put (`Appender.put_message`, all it calls), over the
puts made, are its cost per put. Callgrind counts instructions, not time, so the figure
does not move with the machine's load, where put_shapes.py's rates do. (The client's
whole process is not counted: its instructions moved by thousands per put from run to
run with the load, the C put's retries while the committer, starved, held the pool
buffers.)

`--python`: the caller's side of each shape, also in instructions: the shape's lambda
against a put of `StoreClient.put`'s signature that does nothing, no store, under
callgrind for `--n` and 3x`--n` calls; the difference over 2x`--n` calls is what
building and freeing the shape's arguments (a list, a dict) costs per put. The two
tables add up to a shape's cost over the str key's; the whole client process's count
moves by more than that with the load (the client's refresh when its attach is stale).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.store_run import running_store

# The shapes of ../shared/perf/put_shapes.py, for both clients below: `count` bodies
# and keys, and the same lambdas.
SHAPES_SRC = r"""
pad = b"x" * 1000
bodies = [b"%023d|" % i + pad for i in range(count)]
keys = ["k%d" % i for i in range(count)]
shapes = {
    "str_key": lambda c, i: c.put("t", bodies[i], tags="t", keys=keys[i]),
    "readme": lambda c, i: c.put("t", bodies[i], tags="t", keys=[keys[i]]),
    "two_keys": lambda c, i: c.put("t", bodies[i], tags="t", keys=[keys[i], "order"]),
    "properties": lambda c, i: c.put("t", bodies[i], tags="t", keys=keys[i],
                                     properties={"source": "web", "trace": keys[i]}),
}
"""

CLIENT = (
    r"""
import sys
from mqstore import StoreClient
store, shape, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
count = n
"""
    + SHAPES_SRC
    + r"""f = shapes[shape]
with StoreClient.attach(store) as c:
    for i in range(200):
        f(c, i)
    for i in range(n):
        if f(c, i).status.name != "PUT_OK":
            raise SystemExit("not PUT_OK")
"""
)
SHAPES = ("str_key", "readme", "two_keys", "properties")


def _count(out: Path, store: Path, shape: str, n: int, client: Path) -> float:
    """Instructions inside mqs_put_message per put, one client run of n puts (+200 warm)."""
    r = subprocess.run(
        ["valgrind", "--tool=callgrind", "--toggle-collect=mqs_put_message",
         f"--callgrind-out-file={out}", sys.executable, str(client), str(store), shape, str(n)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"{shape} n={n}: {r.stderr[-2000:]}")
    out.unlink()
    total = int(re.search(r"Collected : (\d+)", r.stderr).group(1))  # type: ignore[union-attr]
    return total / (n + 200)


PY_CLIENT = (
    r"""
import sys
shape, n = sys.argv[1], int(sys.argv[2])


class Nothing:  # StoreClient.put's parameters, its work left out
    def put(self, topic, body, *, tags=None, keys=None, properties=None, queue_id=None,
            wait_store=True, delay_level=0):
        return None


count = 1000
"""
    + SHAPES_SRC
    + r"""f, c = shapes[shape], Nothing()
for i in range(n):
    f(c, i % 1000)
"""
)


def _python_side(n: int, shapes: list[str], root: Path) -> list[tuple[str, float]]:
    """Instructions per call of each shape's lambda against a put that does nothing:
    what building and freeing its arguments costs the caller."""
    script = root / "py_client.py"
    script.write_text(PY_CLIENT)
    rows = []
    for shape in shapes:
        counts = []
        for calls in (n, 3 * n):
            r = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={root / 'py.out'}",
                 sys.executable, str(script), shape, str(calls)],
                capture_output=True,
                text=True,
            )  # fmt: skip
            if r.returncode != 0:
                raise SystemExit(f"{shape} --python: {r.stderr[-2000:]}")
            (root / "py.out").unlink()
            counts.append(int(re.search(r"Collected : (\d+)", r.stderr).group(1)))  # type: ignore[union-attr]
        rows.append((shape, (counts[1] - counts[0]) / (2 * n)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.callgrind_put_shapes", description=__doc__)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--python", action="store_true", help="count the shapes' Python side only")
    ap.add_argument("--out", default=None, help="also write the table here")
    a = ap.parse_args(argv)
    load = f"load {os.getloadavg()[0]:.1f}"
    if a.python:
        with tempfile.TemporaryDirectory(prefix="mqs-cg-shapes-") as tmp:
            rows = _python_side(a.n, a.shapes.split(","), Path(tmp))
        lines = [f"instructions per call of the shape's lambda, put doing nothing ({load})"]
        lines += [f"{s:12} {t:6.0f} (+{t - rows[0][1]:.0f})" for s, t in rows]
    else:
        rows = []
        with tempfile.TemporaryDirectory(prefix="mqs-cg-shapes-") as tmp:
            root = Path(tmp)
            client = root / "client.py"
            client.write_text(CLIENT)
            extra = {"segment_size_bytes": 1 << 30}
            with running_store(root, "store", sync=False, pool=True, extra=extra) as run:
                for shape in a.shapes.split(","):
                    rows.append((shape, _count(root / "cg.out", run.store_dir, shape, a.n, client)))
        lines = [f"instructions per put inside the C put (callgrind, n={a.n}, {load})"]
        lines += [f"{s:12} {t:6.0f} (+{t - rows[0][1]:.0f})" for s, t in rows]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
