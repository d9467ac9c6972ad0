"""The README's examples run, and say what is true of the defaults.

Before, the put example was commented `# SYNC_FLUSH: on disk` while the default flush
mode is ASYNC_FLUSH (an acknowledged put is in the page cache, not yet on disk). Each
Python block of the README is run here, in order, each in a fresh interpreter (a
program of its own, as a user's is), against a real store started with the default
flush mode, at the path the README names replaced by the test's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from mqstore.conf.settings import FlushDiskType, StoreSettings
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO

README = REPO / "README.md"
README_STORE = "/var/lib/mqstore"


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.M | re.S)


def test_the_readme_says_which_flush_mode_is_the_default() -> None:
    default = StoreSettings().flush_disk_type
    comments = [
        line.partition("#")[2]
        for block in _python_blocks()
        for line in block.splitlines()
        if "_FLUSH" in line.partition("#")[2]
    ]
    assert comments, "the README's examples no longer say what a PUT_OK means"
    for c in comments:
        for mode in FlushDiskType:
            named_default = re.search(rf"\b{mode.value} \(the default\)", c) is not None
            assert named_default == (mode is default), c


def test_the_readmes_python_examples_run_against_a_store_with_the_defaults(
    make_store: StoreFactory,
) -> None:
    blocks = _python_blocks()
    assert len(blocks) >= 2
    st = make_store({"flush_disk_type": StoreSettings().flush_disk_type.value})
    st.wait_workers_running()  # as `mqstore start` is, once it says it serves
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for block in blocks:
        code = block.replace(README_STORE, str(st.path))
        ran = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True, text=True, timeout=120, cwd=str(REPO), env=env,
        )  # fmt: skip
        assert ran.returncode == 0, f"{block}\n{ran.stdout}{ran.stderr}\n{st.output()[-3000:]}"
    assert st.stop() == 0
