"""A reader in another process keeps reading a segment the cleaner deletes (its mapping
outlives the unlink), and its read-only view drops the file on refresh()."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mqstore.conf.settings import StoreSettings
from mqstore.workers.cleaner import clean_once
from tests.retention.helpers import HOUR_MS, SEG, Clock, build_log, set_mtime

REPO = Path(__file__).resolve().parents[2]

READER = textwrap.dedent(
    """
    import sys
    from mqstore.engine.segment_queue import SegmentQueue
    q = SegmentQueue(sys.argv[1], int(sys.argv[2]), read_only=True)
    q.load()
    first = q.first()
    held = first.select(0, 64)
    before = bytes(held.view)
    print(len(q), flush=True)
    sys.stdin.readline()  # the cleaner runs now
    print(bytes(held.view) == before, flush=True)
    held.release()
    q.refresh()
    print(len(q), q.min_offset(), flush=True)
    q.close()
    """
)


def test_reader_in_another_process_survives_deletion(tmp_path: Path) -> None:
    clock = Clock()
    log = build_log(tmp_path, clock, 4)
    paths = [s.path for s in log.queue.segments]
    log.close()
    for p in paths:
        set_mtime(p, clock.ms - 100 * HOUR_MS)
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, str(tmp_path / "commitlog"), str(SEG)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "4"
        r = clean_once(tmp_path, StoreSettings(segment_size_bytes=SEG), now=True)
        assert r.files_deleted == 3
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "True"
        assert proc.stdout.readline().split() == ["1", str(3 * SEG)]
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
