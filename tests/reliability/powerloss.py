"""The disk a power cut leaves, built from what the store made durable.

`ShadowRecorder`, installed in every store process through `engine.fileio`'s sync seam
(`shadow_env`: MQSTORE_SYNC_WATCH names `from_env`, which reads MQSTORE_DURABLE_SHADOW and
MQSTORE_DURABLE_ROOT), keeps a shadow of what the syncs under the store made durable:
before an fsync or fdatasync the file's content is copied to `<shadow>/data/<path>`,
before an msync the range synced; an fsync of a directory records the names it then holds
in `<shadow>/dirs/<path>.json` (an entry is durable only once its directory was synced); a
rename carries the recorded content along.

`build_image` makes a store directory from exactly that: a directory holds the entries
its last fsync recorded (none if it was never synced), a file the content last recorded
(empty if none was). With `rng`, pages of the files that were written but never synced
are also kept, each with even odds, as a real disk may have written some of them before
the power went.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import sys
import threading
from collections import Counter
from pathlib import Path

PAGE = 4096
StrPath = str | os.PathLike[str]


def shadow_env(store: Path, shadow: Path) -> dict[str, str]:
    """The environment that makes a store's processes record into `shadow`."""
    return {
        "MQSTORE_SYNC_WATCH": f"{__name__}:from_env",
        "MQSTORE_DURABLE_SHADOW": str(shadow),
        "MQSTORE_DURABLE_ROOT": str(store),
    }


def from_env() -> ShadowRecorder:
    """The recorder `shadow_env` asks for (`engine.fileio` calls it at import)."""
    return ShadowRecorder(os.environ["MQSTORE_DURABLE_SHADOW"], os.environ["MQSTORE_DURABLE_ROOT"])


class _ShadowLock:
    """One lock for every process's and thread's shadow updates (the dispatcher syncs
    in two threads): each holder flocks its own descriptor, kept per thread."""

    def __init__(self, shadow: str) -> None:
        self.path = os.path.join(shadow, ".lock")
        self._held = threading.local()

    def __enter__(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._held.fd = fd

    def __exit__(self, *exc: object) -> None:
        os.close(self._held.fd)


class ShadowRecorder:
    """A `engine.fileio.SyncWatch` that records into `shadow` what the syncs under `root`
    made durable (see the module doc). Any number of processes record into one shadow."""

    def __init__(self, shadow: str, root: str) -> None:
        self.shadow = shadow
        self.root = os.path.realpath(root)
        self._lock = _ShadowLock(shadow)
        self.log_syncs: Counter[str] = Counter()

    def _count_log_sync(self, rel: str) -> None:
        """Count a commit-log sync by who forced it: the flusher's C flush step (its I/O
        seam calls `fileio.native_seam`'s hook, which calls this), the Python flush step
        (`ipc/commit.py` on the stack: its references, which production must never run),
        or other Python code (`fileio`'s own calls: the allocator's new files, recovery);
        kept per process in `<shadow>/syncs/<pid>.json` (`log_sync_counts`)."""
        if not rel.startswith("commitlog" + os.sep):
            return
        frame = sys._getframe(2)  # data_synced <- the seam that called it
        if frame.f_code.co_name == "before":
            who = "C flush step"
        else:
            who = "allocator and recovery"
            while frame is not None:
                if frame.f_code.co_filename.endswith(os.path.join("ipc", "commit.py")):
                    who = "Python flush step"
                    break
                frame = frame.f_back  # type: ignore[assignment]
        self.log_syncs[who] += 1
        path = os.path.join(self.shadow, "syncs", f"{os.getpid()}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(self.log_syncs, f)
        os.replace(path + ".tmp", path)

    def _rel(self, path: StrPath) -> str | None:
        """`path` relative to the store ("." for the store itself), or None."""
        real = os.path.realpath(os.fspath(path))
        if real == self.root:
            return "."
        if not real.startswith(self.root + os.sep):
            return None
        return os.path.relpath(real, self.root)

    def data_synced(self, path: StrPath, offset: int, length: int) -> None:
        """Record the content of `path` (or of one range) as durable."""
        rel = self._rel(path)
        if rel is None:
            return
        dst = os.path.join(self.shadow, "data", rel)
        with self._lock:
            self._count_log_sync(rel)
            try:
                src_fd = os.open(path, os.O_RDONLY)
            except OSError:
                return
            try:
                size = os.fstat(src_fd).st_size
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                out = os.open(dst, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    os.ftruncate(out, size)
                    start, end = (0, size) if length < 0 else (offset, min(size, offset + length))
                    pos = start
                    while pos < end:
                        chunk = os.pread(src_fd, min(1 << 20, end - pos), pos)
                        if not chunk:
                            break
                        os.pwrite(out, chunk, pos)
                        pos += len(chunk)
                finally:
                    os.close(out)
            finally:
                os.close(src_fd)

    def dir_synced(self, path: StrPath) -> None:
        """Record the entries `path` holds now as durable (name -> "d" or "f")."""
        rel = self._rel(path)
        if rel is None:
            return
        try:
            with os.scandir(path) as it:
                entries = {e.name: "d" if e.is_dir() else "f" for e in it}
        except OSError:
            return
        dst = os.path.join(self.shadow, "dirs", rel + ".json")
        with self._lock:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst + ".tmp", "w") as f:
                json.dump(entries, f)
            os.replace(dst + ".tmp", dst)

    def renamed(self, src: StrPath, dst: StrPath) -> None:
        """The recorded content of `src` is now that of `dst` (the same inode)."""
        a, b = self._rel(src), self._rel(dst)
        if a is None or b is None:
            return
        with self._lock:
            old = os.path.join(self.shadow, "data", a)
            if os.path.exists(old):
                new = os.path.join(self.shadow, "data", b)
                os.makedirs(os.path.dirname(new), exist_ok=True)
                os.replace(old, new)


def log_sync_counts(shadow: Path) -> Counter[str]:
    """The commit-log syncs every process recorded into `shadow`, by who forced them."""
    out: Counter[str] = Counter()
    for p in (shadow / "syncs").glob("*.json"):
        out.update(json.loads(p.read_text()))
    return out


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
