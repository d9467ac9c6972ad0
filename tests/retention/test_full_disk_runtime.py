"""The full-disk cycle of a running store, on a real size-limited filesystem.

The whole store (segments, consume queues, index) lives on a tmpfs mounted for the test;
the supervisor, its cleaner (real psutil) and producers are real processes. A ballast
file brings the disk near the warning ratio; the puts fill the log until the allocator's
next segment tips it over, the cleaner publishes DISK_FULL and puts are refused with
SERVICE_NOT_AVAILABLE and the reason; nothing half-written. Removing the ballast makes the
store writable again by itself, with no restart. Every acknowledged message still in the
log (the cleaner may delete the oldest segments, over the force ratio) reads back intact.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mqstore import PutMessageStatus, StoreClient
from tests.runtime.harness import REPO, Store, wait_for

FS_BYTES = 48 * 1024 * 1024
SEG = 1024 * 1024
CONFIG = {
    "segment_size_bytes": SEG,
    "transient_store_pool_enable": False,
    "consume_queue_file_size_bytes": 20 * 4096,
    "max_hash_slot_num": 1024,
    "max_index_num": 4096,
}


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (CAP_SYS_ADMIN); not root here")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES},mode=0700", "tmpfs", str(mnt)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def _used(path: Path) -> int:
    return int(psutil.disk_usage(str(path)).used)


@pytest.mark.slow
def test_running_store_refuses_when_full_and_resumes_by_itself(small_fs: Path) -> None:
    st = Store(small_fs / "store", CONFIG)
    st.start()
    try:
        st.wait_workers_running()
        # Ballast up to 87 % of the filesystem: the next segments tip it over 90 %.
        ballast = small_fs / "ballast"
        room = int(FS_BYTES * 0.87) - _used(small_fs)
        assert room > 0
        fd = os.open(ballast, os.O_CREAT | os.O_RDWR, 0o600)
        os.posix_fallocate(fd, 0, room)
        os.close(fd)
        acked: dict[int, bytes] = {}
        refused = None
        with StoreClient.attach(st.path) as client:
            for i in range(40_000):
                body = i.to_bytes(8, "big") * 125
                r = client.put("fill", body, queue_id=0)
                if r.status is PutMessageStatus.PUT_OK:
                    acked[r.physical_offset] = body
                    continue
                refused = r
                break
            assert refused is not None, "the disk never filled"
            assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, refused
            assert "disk is full" in refused.reason, refused.reason
            disk = st.status()["cleaner"]["disk"]
            assert disk["disk_full"] and disk["ratio"] > 0.90, (disk, _used(small_fs), len(acked))
            reserved = st.status()["positions"]["reserved"]
            again = client.put("fill", b"late", queue_id=0)
            assert again.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert st.status()["positions"]["reserved"] == reserved  # nothing half-written

            ballast.unlink()  # space is back: writable again by itself, no restart

            def writable() -> bool:
                r = client.put("fill", b"after", queue_id=0)
                if r.status is PutMessageStatus.PUT_OK:
                    acked[r.physical_offset] = b"after"
                    return True
                assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, r
                return False

            wait_for(writable, 30, "puts to resume after the ballast was removed")
            assert not st.status()["cleaner"]["disk"]["disk_full"]
        assert st.stop() == 0
        recs = st.read_log()
        low = min(r.physical_offset for r in recs)
        kept = {off: body for off, body in acked.items() if off >= low}
        assert len(kept) > 100
        got = {r.physical_offset: r.body for r in recs}
        assert all(got.get(off) == body for off, body in kept.items())
        check = subprocess.run(
            [sys.executable, "-m", "mqstore", "check", str(st.path)],
            capture_output=True, text=True, cwd=str(REPO), timeout=60,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        st.stop()
    assert st.shm_leftovers() == []
