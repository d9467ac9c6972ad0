"""RocketMQ's JSON config files (`<store>/config/*.json`), read and replaced safely.

RocketMQ's ConfigManager keeps each table (consumer offsets, topics) in one JSON file
that it replaces whole. mqstore does the same, from any number of processes:

- an update takes an exclusive `flock` on `<file>.lock` (one fd per call, so threads of
  one process exclude each other too; the kernel drops it when the holder dies),
  re-reads the file, changes it and replaces it with `fileio.write_file_atomic` (tmp
  file, fsync, rename, fsync of the directory): after a crash the file is the old or the
  new version, never a torn one;
- a read takes no lock (a rename is atomic) and is cached by (mtime_ns, size, inode);
- a store shared with its group (`ipc_allow_group`: the store directory has group bits)
  shares `config/` too (02770, files 0660): its members' clients read the topics' queue
  counts and commit consumer offsets like the owner's.

fastjson writes integer map keys unquoted (`{0:12}`); they are accepted on read. What
mqstore writes is standard JSON. Unknown top-level keys are kept.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mqstore.engine import fileio

_UNQUOTED_INT_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def config_path(store_dir: str | os.PathLike[str], name: str) -> str:
    return os.path.join(os.fspath(store_dir), "config", name)


def group_shared(store_dir: str | os.PathLike[str]) -> bool:
    """Whether the store is shared with its group (its directory has group bits)."""
    try:
        return bool(os.stat(store_dir).st_mode & 0o070)
    except OSError:
        return False


def share_config_dir(store_dir: str | os.PathLike[str]) -> None:
    """Make `config/` the group's too (02770). Supervisor only, at boot, when the store is
    shared; files written there afterwards are 0660 (`update`)."""
    d = os.path.join(os.fspath(store_dir), "config")
    fileio.makedirs(d)
    os.chmod(d, 0o2770)


def _file_mode(path: str) -> int:
    return 0o660 if group_shared(os.path.dirname(os.path.dirname(path))) else 0o600


def parse(text: str) -> dict[str, Any]:
    """The document; {} for an empty file. Raises ValueError when it is not a JSON object."""
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        doc = json.loads(_UNQUOTED_INT_KEY.sub(r'\1"\2"\3', text))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def read(path: str) -> dict[str, Any]:
    """The document at `path`; {} when the file does not exist. Raises ValueError."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse(f.read())
    except FileNotFoundError:
        return {}


class CachedDoc:
    """`get()` re-reads the file only when its (mtime_ns, size, inode) changed. Cost: one
    stat per call. Not thread-safe (cheap enough to keep one per thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sig: tuple[int, int, int] | None = None
        self._doc: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._sig, self._doc = None, {}
            return self._doc
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if sig != self._sig:
            self._doc = read(self.path)
            self._sig = sig
        return self._doc


@contextmanager
def _locked(path: str) -> Iterator[None]:
    fileio.makedirs(os.path.dirname(path))
    lock = path + ".lock"
    fd = fileio.open_file(lock, create=True, mode=_file_mode(path))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fileio.close(fd, lock)  # closing the only fd drops the flock


def update(path: str, change: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Under the file's lock: read, let `change` edit the document in place (it returns
    False when nothing changed: nothing is written), replace the file durably. Returns the
    document. Raises StoreIOError, ValueError (a file that is not JSON is never replaced)."""
    with _locked(path):
        doc = read(path)
        if change(doc):
            data = json.dumps(doc, indent=1, sort_keys=False).encode("utf-8") + b"\n"
            fileio.write_file_atomic(path, data, mode=_file_mode(path))
        return doc
