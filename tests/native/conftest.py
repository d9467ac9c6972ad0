"""`make sanitize` runs this folder against an ASan/UBSan build of the extension: it names
that build in MQSTORE_NATIVE_SO, and it is loaded here, before any test imports
`mqstore._native`, in place of the normal one (the process runs with libasan preloaded)."""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_so = os.environ.get("MQSTORE_NATIVE_SO")
if _so:
    _spec = importlib.util.spec_from_file_location("mqstore._native", _so)
    assert _spec is not None and _spec.loader is not None, _so
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    sys.modules["mqstore._native"] = _mod
    import mqstore

    mqstore._native = _mod  # type: ignore[attr-defined]

from mqstore.ipc import control as c  # noqa: E402  (after the build under test is loaded)

SEG = 1 << 20


@pytest.fixture
def cb(tmp_path: Path) -> Iterator[c.ControlBlock]:
    """A control block with a pool of two 1 MiB segments, running, 64 segments allocated;
    no supervisor."""
    geo = c.Geometry(segment_size=SEG, pool_buffers=2, slot_count=64, qtable_capacity=256)
    block = c.ControlBlock.create(tmp_path, 1, geo, token=secrets.token_hex(4))
    block.set(c.OFF_FLAGS, c.FLAG_RUNNING)
    block.set(c.OFF_ALLOCATED, 64 * SEG)
    try:
        yield block
    finally:
        block.close()


def pytest_report_header() -> str:
    import mqstore._native as native

    return f"mqstore._native: {native.__file__}"
