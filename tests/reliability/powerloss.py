"""The disk a power cut leaves, built from what the store made durable.

`engine.fileio`'s durability seam (MQSTORE_DURABLE_SHADOW / MQSTORE_DURABLE_ROOT) records,
in every store process, the content each fsync, fdatasync or msync made durable and the
entries each directory fsync made durable. `build_image` makes a store directory from
exactly that: a directory holds the entries its last fsync recorded (none if it was never
synced), a file the content last recorded (empty if none was). With `rng`, pages of the
files that were written but never synced are also kept, each with even odds, as a real
disk may have written some of them before the power went.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path

PAGE = 4096


def shadow_env(store: Path, shadow: Path) -> dict[str, str]:
    return {"MQSTORE_DURABLE_SHADOW": str(shadow), "MQSTORE_DURABLE_ROOT": str(store)}


def seed_shadow(store: Path, shadow: Path) -> None:
    """Record everything now in `store` as durable (the machine came up with it)."""
    shutil.rmtree(shadow, ignore_errors=True)
    (shadow / "data").mkdir(parents=True)
    for dirpath, dirnames, filenames in os.walk(store):
        rel = os.path.relpath(dirpath, store)
        entries = {d: "d" for d in dirnames} | {f: "f" for f in filenames}
        man = shadow / "dirs" / (rel + ".json")
        man.parent.mkdir(parents=True, exist_ok=True)
        man.write_text(json.dumps(entries))
        for f in filenames:
            dst = shadow / "data" / rel / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(dirpath) / f, dst)


def build_image(
    store: Path, shadow: Path, out: Path, rng: random.Random | None, stats: Counter[str]
) -> None:
    """Write into `out` the store as a power cut would leave it (see the module doc)."""

    def walk(rel: str) -> None:
        (out / rel).mkdir(parents=True, exist_ok=True)
        man = shadow / "dirs" / (rel + ".json")
        entries: dict[str, str] = json.loads(man.read_text()) if man.exists() else {}
        for name, kind in sorted(entries.items()):
            r = os.path.join(rel, name)
            if kind == "d":
                walk(r)
                continue
            data = shadow / "data" / r
            if data.exists():
                shutil.copyfile(data, out / r)
            else:
                (out / r).write_bytes(b"")
                top = r.split(os.sep)[1] if r.startswith("." + os.sep) else r
                stats[f"files whose content was never synced (left empty): {top}"] += 1
            if rng is not None and (store / r).is_file():
                _mix_pages(store / r, out / r, rng, stats)

    walk(".")


def _mix_pages(real: Path, image: Path, rng: random.Random, stats: Counter[str]) -> None:
    """Keep each page of `real` that differs from `image` with even odds."""
    got = bytearray(image.read_bytes())
    have = real.read_bytes()[: len(got)]
    for pos in range(0, len(have), PAGE):
        page = have[pos : pos + PAGE]
        if page != got[pos : pos + len(page)]:
            if rng.random() < 0.5:
                got[pos : pos + len(page)] = page
                stats["unsynced pages kept"] += 1
            else:
                stats["unsynced pages dropped"] += 1
    image.write_bytes(bytes(got))
