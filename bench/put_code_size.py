"""The size of the production put code at a git revision (tests excluded), issue 22's
"smaller than today":

    python -m bench.put_code_size [REV ...]     (default: 42f9d27, the issue's base, and HEAD;
                                                 `.`: the working tree)

What counts, by file name, wherever the revision keeps it (the native files moved from
ipc/native to engine/native after the issue was filed):
- Python: the client's put and what only the put uses, `ipc/` client.py, session.py
  (attach, staleness), producer.py (the put path), aio.py (the asyncio client), accepts.py
  (argument types), results.py (the outcome), reservation.py, and, before issue 22,
  prepare.py and general_path.py (the Python general path);
- C: the put (mqs_put, mqs_fields), its reservation and publish (mqs_append,
  mqs_appender.h, mqs_futex, mqs_layout.h, mqs_crashpoint), the record encoder and CRC
  (mqs_record, mqs_crc32, mqs_be.h), argument readers (mqs_args) and the module's entry
  files (then mqs_module.c, now mqs_ipc_py and mqs_engine_py).
Not counted: the reads, the control block's own type (mqs_control_py), the committer's
round (mqs_round), the store's processes.

Prints lines as `wc -l` counts them and code lines (not blank, not only a comment).
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

PYTHON = ("client.py", "session.py", "producer.py", "aio.py", "accepts.py", "results.py",
          "reservation.py", "prepare.py", "general_path.py")  # fmt: skip
C_NAMES = ("mqs_put", "mqs_fields", "mqs_append", "mqs_appender", "mqs_futex", "mqs_layout",
           "mqs_crashpoint", "mqs_record", "mqs_crc32", "mqs_be", "mqs_args", "mqs_module",
           "mqs_ipc_py", "mqs_engine_py")  # fmt: skip
BASE = "42f9d27"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def files(rev: str) -> list[str]:
    """The counted files of `rev`."""
    out = []
    listed = _git("ls-files") if rev == "." else _git("ls-tree", "-r", "--name-only", rev)
    for path in listed.splitlines():
        d, _, name = path.rpartition("/")
        python = d == "ipc" and name in PYTHON
        if python or (d in ("ipc/native", "engine/native") and name.split(".")[0] in C_NAMES):
            out.append(path)
    return sorted(out)


def code_lines(text: str, c: bool) -> int:
    """Lines that are not blank, not only a comment, not inside a docstring or block comment."""
    n = 0
    in_block = False
    for line in text.splitlines():
        s = line.strip()
        if c:
            if in_block:
                in_block = "*/" not in s
                continue
            if s.startswith("/*"):
                in_block = "*/" not in s
                continue
            if not s or s.startswith("//"):
                continue
        else:
            quotes = len(re.findall(r'"""', s))
            if in_block:
                in_block = quotes % 2 == 0
                continue
            if s.startswith('"""'):
                in_block = quotes % 2 == 1
                continue
            if not s or s.startswith("#"):
                continue
        n += 1
    return n


def measure(rev: str) -> dict[str, tuple[int, int]]:
    sizes = {}
    for path in files(rev):
        text = Path(path).read_text() if rev == "." else _git("show", f"{rev}:{path}")
        sizes[path] = (len(text.splitlines()), code_lines(text, not path.endswith(".py")))
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.put_code_size", description=__doc__)
    ap.add_argument("revs", nargs="*", default=[BASE, "HEAD"])
    a = ap.parse_args(argv)
    for rev in a.revs:
        sizes = measure(rev)
        commit = "working tree" if rev == "." else _git("rev-parse", "--short", rev).strip()
        py = [v for k, v in sizes.items() if k.endswith(".py")]
        cc = [v for k, v in sizes.items() if not k.endswith(".py")]
        print(f"{rev} ({commit}): Python {sum(v[0] for v in py)} lines "
              f"({sum(v[1] for v in py)} code), C {sum(v[0] for v in cc)} lines "
              f"({sum(v[1] for v in cc)} code), total {sum(v[0] for v in sizes.values())} "
              f"lines ({sum(v[1] for v in sizes.values())} code)")  # fmt: skip
        for path, (lines, code) in sizes.items():
            print(f"  {path:40} {lines:5} {code:5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
