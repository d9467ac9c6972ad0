"""engine.fileio's sync seam with the power-loss suite's recorder (`powerloss.ShadowRecorder`,
its record of what was synced), run in a child process that has it enabled, as the
store's processes do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.reliability.powerloss import build_image, shadow_env

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import os, sys
from mqstore.engine import fileio
store = sys.argv[1]
fileio.makedirs(os.path.join(store, "sub"))             # entry of sub/ synced in store/
fd = fileio.open_file(os.path.join(store, "sub", "synced"), create=True)
fileio.pwrite(fd, b"durable", 0, "synced")
fileio.fsync(fd, os.path.join(store, "sub", "synced"))
fileio.pwrite(fd, b"-later", 7, "synced")               # written after the sync: not durable
fileio.close(fd)
fd = fileio.open_file(os.path.join(store, "sub", "unsynced"), create=True)
fileio.pwrite(fd, b"never synced", 0, "unsynced")
fileio.close(fd)
fileio.fsync_dir(os.path.join(store, "sub"))            # both entries durable now
fd = fileio.open_file(os.path.join(store, "sub", "late"), create=True)
fileio.pwrite(fd, b"entry never synced", 0, "late")
fileio.fsync(fd, os.path.join(store, "sub", "late"))    # content synced, entry not
fileio.close(fd)
fileio.write_file_atomic(os.path.join(store, "atomic"), b"renamed in")
"""


def test_the_image_holds_exactly_what_was_synced(tmp_path: Path) -> None:
    store, shadow, image = tmp_path / "store", tmp_path / "shadow", tmp_path / "image"
    store.mkdir()
    (shadow / "data").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), **shadow_env(store, shadow)}
    subprocess.run([sys.executable, "-c", CHILD, str(store)], check=True, env=env, cwd=REPO)
    assert (store / "sub" / "synced").read_bytes() == b"durable-later"  # the live file
    stats: Counter[str] = Counter()
    build_image(store, shadow, image, None, stats)
    assert (image / "sub" / "synced").read_bytes() == b"durable"
    assert (image / "sub" / "unsynced").read_bytes() == b""  # entry durable, data not
    assert not (image / "sub" / "late").exists()  # data synced, its entry never
    assert (image / "atomic").read_bytes() == b"renamed in"
    assert not (image / "atomic.tmp").exists()
    assert json.loads((shadow / "dirs" / "sub.json").read_text()) == {
        "synced": "f",
        "unsynced": "f",
    }


def test_the_seam_is_off_without_the_environment(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MQSTORE_DURABLE", "MQSTORE_SYNC_WATCH"))
    } | {"PYTHONPATH": str(REPO)}
    code = "from engine import fileio; print(fileio.sync_watch() is fileio.NO_WATCH)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True, env=env, cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert out.stdout.strip() == "True"
