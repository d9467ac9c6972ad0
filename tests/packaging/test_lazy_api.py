"""`mqstore`'s names are imported at first use (PEP 562, `mqstore/__init__.py`): a
producer that only wants `StoreClient` starts without asyncio or the package metadata,
nor the read stack, the compression codecs or multiprocessing (each a client's first read,
a compressing store's attach, the supervisor imports them), and every public name still
resolves to the same object as its home module's."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mqstore

_PROBE = """
import json, sys
from mqstore import StoreClient
names = ("asyncio", "importlib.metadata", "mqstore.ipc.aio", *sys.argv[1:])
print(json.dumps({m: m in sys.modules for m in names}))
"""

# What `from mqstore import StoreClient` must not load: each was imported by every producer
# at start (0.09 s of CPU per start, against 0.05 s without them), paid by 16-64 clients of
# the sync checks starting beside the ones already putting.
_NOT_FOR_A_PRODUCER = (
    "mqstore.engine.reader",  # and the commit log, consume queue and index readers
    "mqstore.engine.segment",  # and memlock's subprocess, tempfile, ctypes.util, logging
    "mqstore.engine.compression",  # zstandard, lz4
    "zstandard",
    "lz4",
    "multiprocessing",  # shared_memory: the supervisor creates, clients map (`Mapped`)
    "subprocess",
    "logging",
    "hashlib",  # and OpenSSL's _hashlib: the supervisor's store_hash (sha1), not a put's
    "_hashlib",
    "base64",  # a record's JSON (`mqstore dump`)
    # what setuptools' editable import hook (`__editable___mqstore_*_finder`, run by `site`
    # from its `.pth`) imported in every interpreter of the venv, about 10 ms of CPU per
    # start; the editable install is a plain path entry now (Makefile: plain-path)
    "pathlib",
    "urllib.parse",
    "fnmatch",
    "importlib.util",
    "ipaddress",  # the store's host, parsed at attach: inet_pton reads its spelling
    # the read side, imported by a client's first read (`StoreClient._Read`) and the decoded
    # records by their first use (`engine.record.__getattr__`): ~38M instructions and 7
    # dataclass decorations of every producer's start (bench/results/client_start.md)
    "mqstore.ipc.reads",
    "mqstore.ipc.read_results",
    "mqstore.engine.get_result",
    "mqstore.engine.record_decode",
    # dataclasses and what it imports (inspect: ast, dis, tokenize, linecache): ~38M
    # instructions; a producer's three frozen dataclasses (StoreSettings, Message,
    # Geometry) are engine.frozen's, which needs none of them until asked for fields
    "dataclasses",
    "inspect",
    "ast",
    "dis",
    "tokenize",
    "linecache",
)

# With the interpreter's `site` off (-S), so that nothing else has loaded them first (the
# editable install's import hook in `site` imports pathlib and its urllib.parse,
# ipaddress, fnmatch): about 5 ms of CPU per producer start, for the two
# `engine.fileio` functions that make directories and write files atomically.
_NOT_FOR_A_PRODUCER_WITHOUT_SITE = ("pathlib", "urllib.parse", "fnmatch", "hashlib")


def test_a_producer_importing_store_client_loads_neither_asyncio_nor_package_metadata() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *_NOT_FOR_A_PRODUCER],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == {
        "asyncio": False,
        "importlib.metadata": False,
        "mqstore.ipc.aio": False,
        **dict.fromkeys(_NOT_FOR_A_PRODUCER, False),
    }


def test_the_install_adds_no_import_hook_and_no_bare_top_level_names(tmp_path: Path) -> None:
    """However `mqstore` is installed (editable by `make setup`, or a wheel), starting an
    interpreter runs no finder of its install, and from a directory outside the checkout
    only `mqstore` resolves, never the checkout's `engine` or `bench` under a bare name."""
    probe = (
        "import importlib.util, json, sys\n"
        "hooks = [m for m in sys.modules if m.startswith('__editable__')]\n"
        "finders = [type(f).__module__ for f in sys.meta_path]\n"
        "bare = [n for n in ('engine', 'conf', 'ipc', 'bench') if importlib.util.find_spec(n)]\n"
        "print(json.dumps([hooks, finders, bare]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    hooks, finders, bare = json.loads(out.stdout)
    assert hooks == []
    assert [f for f in finders if "editable" in f] == []
    assert bare == []


# The dataclasses a producer's import makes. With `dataclasses.dataclass` each one's
# __init__, __repr__, __eq__, ... were compiled with exec at import (0.4-2 ms of CPU each);
# these three are `engine.frozen.dataclass`'s (no code compiled, tests/engine/test_frozen.py
# holds them to their dataclasses twins). They stay dataclasses because they are public
# (`mqstore.__all__`) or `dataclasses.fields`/`replace` is called on them;
# an internal record on this path is a NamedTuple (ipc.session.Attached, ipc.control.Geometry,
# engine.findings.Finding, engine.topics.TopicConfig, engine.retry.SendBack,
# conf.settings.SettingInfo were dataclasses); the read side's (RecordFields, DecodedRecord,
# RecordView, GetResult, PullResult, PullViews, _Pulled) load with a client's first read.
_PRODUCER_DATACLASSES = {
    "mqstore.conf.settings.StoreSettings",
    "mqstore.engine.geometry.Geometry",
    "mqstore.engine.record.Message",
}

_DATACLASS_PROBE = """
import json, sys
from mqstore import StoreClient
print(json.dumps(sorted(
    f"{name}.{c.__qualname__}"
    for name, m in list(sys.modules.items()) if name.startswith("mqstore")
    for c in vars(m).values()
    if isinstance(c, type) and c.__module__ == name and "__dataclass_fields__" in vars(c)
)))
"""


def test_a_producer_import_decorates_only_the_public_dataclasses() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _DATACLASS_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert set(json.loads(out.stdout)) == _PRODUCER_DATACLASSES


def test_a_producer_import_without_site_loads_no_pathlib() -> None:
    # the folder holding the package: the checkout (editable) or site-packages (a wheel)
    where = os.path.dirname(os.path.dirname(os.path.abspath(mqstore.__file__)))
    probe = f"import sys; sys.path.insert(0, {where!r}); exec({_PROBE!r})"
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe, *_NOT_FOR_A_PRODUCER_WITHOUT_SITE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = json.loads(out.stdout)
    assert [m for m in _NOT_FOR_A_PRODUCER_WITHOUT_SITE if loaded[m]] == []


_READS = (
    "pull", "get", "get_by_msg_id", "query", "offset_for_time", "min_offset", "max_offset",
    "commit_offset", "committed_offset",
)  # fmt: skip


@pytest.mark.parametrize("via", ["class", "instance"])
def test_a_read_method_first_looked_up_is_client_reads_own(via: str) -> None:
    """`StoreClient.pull` and its siblings, first looked up on the class or on an instance
    in a fresh interpreter, are `ClientReads`' methods run in-process: its name and
    docstring, bound to the client, and the class holds the method from then on."""
    probe = """
import json, sys
from mqstore import StoreClient
loaded = "mqstore.ipc.reads" in sys.modules
c = object.__new__(StoreClient)  # no attach: only the lookups are probed
out = {}
for name in sys.argv[2:]:
    m = getattr(StoreClient if sys.argv[1] == "class" else c, name)
    from mqstore.ipc.reads import ClientReads
    want = getattr(ClientReads, name)
    out[name] = [m.__name__ == name, m.__doc__ == want.__doc__,
                 m.__qualname__ == "StoreClient." + name,
                 getattr(m, "__self__", c) is c,
                 vars(StoreClient)[name] is getattr(StoreClient, name),
                 getattr(StoreClient, name) is getattr(StoreClient, name)]
print(json.dumps([loaded, out]))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe, via, *_READS],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    loaded, got = json.loads(out.stdout)
    assert loaded is False
    assert got == {name: [True] * 6 for name in _READS}


def test_the_decoded_records_are_engine_records_own() -> None:
    """`RecordFields`, `DecodedRecord`, `RecordView`, `decode` and `decompress_body` are
    `engine.record`'s names (defined in `engine.record_decode`), and a decoded record
    pickles under `mqstore.engine.record`, as it did."""
    import pickle

    from mqstore.engine import record, record_decode

    for name in record._DECODE_SIDE:
        assert getattr(record, name) is getattr(record_decode, name)
    for cls in (record.RecordFields, record.DecodedRecord, record.RecordView):
        assert cls.__module__ == "mqstore.engine.record"
    msg = record.Message(topic="t", body=b"hello", properties={"TAGS": "a"})
    enc = record.encode(msg)
    got = record.decode(enc.data, 0)
    assert type(got) is record.DecodedRecord and got.body == b"hello" and got.tags == "a"
    assert pickle.loads(pickle.dumps(got)) == got
    assert b"mqstore.engine.record\n" in pickle.dumps(got, protocol=0)
    with pytest.raises(AttributeError, match="has no attribute 'RecordFieldz'"):
        _ = record.RecordFieldz


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
