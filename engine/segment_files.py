"""Which files of a log directory are its segments: the listing rules of a load.

A segment file is named by its start offset in 20 decimal digits (`engine.segment`).
`list_segment_files` applies the rules of `SegmentQueue.load` (spec §8.3):

* Files are listed in ascending name order; names that are not 20 digits are ignored,
  except leftovers `<20 digits>.tmp` (and `.next.tmp`, `PREPARED_SUFFIX`) of an
  interrupted pre-allocation, which a writable listing deletes.
* Every segment must be exactly `segment_size_bytes` bytes, else `SegmentSizeError`
  names the file, with one exception, decided here for the case RocketMQ 5.x also
  handles: a **zero-length last file** is an allocation that never finished and holds
  no data. A writable listing deletes it (as 5.x does) and records an INFO finding; a
  read-only one leaves it on disk and skips it (the queue's `check()` reports a
  WARNING). A zero-length file that is not the last is a hole in the log:
  `SegmentSizeError`.

`segment_files_after` is the follower's listing (`SegmentQueue.refresh`): the files
past a given start that are already full-sized. `numbered_files` is the plain listing
that consume queues and retention use for their own numbered files. Each costs one
directory listing and a stat per file; no reads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Final

from mqstore.engine import fileio
from mqstore.engine.findings import Finding, Severity
from mqstore.engine.segment import FILE_NAME_DIGITS, SegmentSizeError

PREPARED_SUFFIX: Final = ".next.tmp"  # a file prepared ahead of need (`want_prepared`)
_TMP_LEFTOVER: Final = re.compile(r"^\d{20}(\.next)?\.tmp$")


def numbered_files(directory: str, digits: int = FILE_NAME_DIGITS) -> list[str]:
    """The paths of the regular files in `directory` named by `digits` digits (commit-log
    and consume-queue files: 20; index files: 17), in name order; [] for no directory.
    A listing only: O(files) stats, no reads."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(
        os.path.join(directory, n)
        for n in names
        if len(n) == digits and n.isdigit() and os.path.isfile(os.path.join(directory, n))
    )


@dataclass
class SegmentFiles:
    """What a load opens: `paths` in offset order, what the listing did (`findings`),
    and the zero-length last file a read-only listing skipped."""

    paths: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    skipped_empty_last: str | None = None


def list_segment_files(directory: str, segment_size_bytes: int, *, read_only: bool) -> SegmentFiles:
    """The segment files of `directory` by the rules above (writable: deleting leftovers
    and an empty last file). Raises SegmentSizeError naming the first file of the wrong
    size, StoreIOError."""
    out = SegmentFiles()
    sized: list[tuple[str, int]] = []
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for name in names:
        path = os.path.join(directory, name)
        if _TMP_LEFTOVER.match(name) and not read_only:
            fileio.unlink(path, missing_ok=True)
            out.findings.append(
                Finding(Severity.INFO, "deleted an unfinished pre-allocation", path)
            )
        elif len(name) == FILE_NAME_DIGITS and name.isdigit() and os.path.isfile(path):
            sized.append((path, os.stat(path).st_size))
    if sized and sized[-1][1] == 0:
        path, _ = sized.pop()
        if read_only:
            out.skipped_empty_last = path
        else:
            fileio.unlink(path)
            fileio.fsync_dir(directory)
            out.findings.append(Finding(Severity.INFO, "deleted an empty last segment file", path))
    for path, size in sized:
        if size != segment_size_bytes:
            raise SegmentSizeError(path, size, segment_size_bytes)
        out.paths.append(path)
    return out


def segment_files_after(directory: str, segment_size_bytes: int, after: int) -> list[str]:
    """The segment files that start past `after`, in order, up to the first that is not
    yet `segment_size_bytes` long (a pre-allocation still being built: next time)."""
    out: list[str] = []
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for name in names:
        if len(name) != FILE_NAME_DIGITS or not name.isdigit() or int(name) <= after:
            continue
        path = os.path.join(directory, name)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            continue
        if size != segment_size_bytes:
            break
        out.append(path)
    return out
