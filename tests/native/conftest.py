"""`make sanitize` runs this folder against an ASan/UBSan build of the extension: it names
that build in MQSTORE_NATIVE_SO, and it is loaded here, before any test imports
`mqstore._native`, in place of the normal one (the process runs with libasan preloaded)."""

from __future__ import annotations

import importlib.util
import os
import sys

_so = os.environ.get("MQSTORE_NATIVE_SO")
if _so:
    _spec = importlib.util.spec_from_file_location("mqstore._native", _so)
    assert _spec is not None and _spec.loader is not None, _so
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    sys.modules["mqstore._native"] = _mod
    import mqstore

    mqstore._native = _mod  # type: ignore[attr-defined]


def pytest_report_header() -> str:
    import mqstore._native as native

    return f"mqstore._native: {native.__file__}"
