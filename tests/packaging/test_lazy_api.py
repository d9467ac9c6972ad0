"""`mqstore`'s names are imported at first use (PEP 562, `mqstore/__init__.py`): a
producer that only wants `StoreClient` starts without asyncio or the package metadata,
and every public name still resolves to the same object as its home module's."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import mqstore

_PROBE = """
import json, sys
from mqstore import StoreClient
names = ("asyncio", "importlib.metadata", "mqstore.ipc.aio")
print(json.dumps({m: m in sys.modules for m in names}))
"""


def test_a_producer_importing_store_client_loads_neither_asyncio_nor_package_metadata() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout) == {
        "asyncio": False,
        "importlib.metadata": False,
        "mqstore.ipc.aio": False,
    }


@pytest.mark.parametrize("name", sorted(set(mqstore.__all__) - {"__version__"}))
def test_every_public_name_is_its_home_modules_object(name: str) -> None:
    home = importlib.import_module(mqstore._WHERE[name])
    assert getattr(mqstore, name) is getattr(home, name)
    assert name in dir(mqstore)


def test_all_names_every_lazy_name() -> None:
    assert set(mqstore.__all__) == {*mqstore._WHERE, "__version__"}


def test_the_version_and_an_unknown_name() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        expected = version("mqstore")
    except PackageNotFoundError:
        expected = "0+unknown"
    assert mqstore.__version__ == expected
    with pytest.raises(AttributeError, match="no attribute 'StoreClinet'"):
        _ = mqstore.StoreClinet
    with pytest.raises(ImportError):
        exec("from mqstore import StoreClinet", {})
