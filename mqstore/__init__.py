"""mqstore: the public API.

Users write `from mqstore import StoreClient`. This module only re-exports; the
implementation lives in the subpackages `mqstore.engine`, `mqstore.ipc`, `mqstore.conf`,
`mqstore.workers` and `mqstore.pipeline` (in a checkout, links to the top-level folders of
the same names).

Each name is imported when it is first used (PEP 562), so a producer process that only
wants `StoreClient` does not pay for asyncio (`AsyncStoreClient`) or the package metadata
(`__version__`): `import mqstore` cost a process about 100 ms of CPU, half of it for
those two, which 64 sync producers starting beside the running ones paid together
(`bench/results/sync_disk.md`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqstore.conf.load import ConfigError
    from mqstore.engine.checkpoint import CheckpointError
    from mqstore.engine.fileio import StoreIOError
    from mqstore.engine.record import Message, RecordError
    from mqstore.engine.record_decode import DecodedRecord, RecordView
    from mqstore.engine.segment import SegmentNameError, SegmentSizeError
    from mqstore.engine.storedir import StoreDirError
    from mqstore.ipc.access import StoreAccessDenied
    from mqstore.ipc.aio import AsyncStoreClient
    from mqstore.ipc.aio_consumer import AsyncConsumer
    from mqstore.ipc.channel import SupervisorUnavailable, WorkersNotUp
    from mqstore.ipc.client import StoreClient
    from mqstore.ipc.consumer import ConsumedMessage, Consumer, ConsumerClosed
    from mqstore.ipc.locks import StoreLockHeld
    from mqstore.ipc.read_results import GetMessageStatus, PullResult, PullViews
    from mqstore.ipc.reads import ClientReads
    from mqstore.ipc.results import (
        FlushError,
        MessageIllegalError,
        PutError,
        PutMessageStatus,
        PutResult,
        ServiceUnavailableError,
    )

    __version__: str

_WHERE = {
    "AsyncConsumer": "mqstore.ipc.aio_consumer",
    "AsyncStoreClient": "mqstore.ipc.aio",
    "CheckpointError": "mqstore.engine.checkpoint",
    "ClientReads": "mqstore.ipc.reads",
    "ConfigError": "mqstore.conf.load",
    "ConsumedMessage": "mqstore.ipc.consumer",
    "Consumer": "mqstore.ipc.consumer",
    "ConsumerClosed": "mqstore.ipc.consumer",
    "DecodedRecord": "mqstore.engine.record",
    "FlushError": "mqstore.ipc.results",
    "GetMessageStatus": "mqstore.ipc.read_results",
    "Message": "mqstore.engine.record",
    "MessageIllegalError": "mqstore.ipc.results",
    "PullResult": "mqstore.ipc.read_results",
    "PullViews": "mqstore.ipc.read_results",
    "PutError": "mqstore.ipc.results",
    "PutMessageStatus": "mqstore.ipc.results",
    "PutResult": "mqstore.ipc.results",
    "RecordError": "mqstore.engine.record",
    "RecordView": "mqstore.engine.record",
    "SegmentNameError": "mqstore.engine.segment",
    "SegmentSizeError": "mqstore.engine.segment",
    "ServiceUnavailableError": "mqstore.ipc.results",
    "StoreAccessDenied": "mqstore.ipc.access",
    "StoreClient": "mqstore.ipc.client",
    "StoreDirError": "mqstore.engine.storedir",
    "StoreIOError": "mqstore.engine.fileio",
    "StoreLockHeld": "mqstore.ipc.locks",
    "SupervisorUnavailable": "mqstore.ipc.channel",
    "WorkersNotUp": "mqstore.ipc.channel",
}

__all__ = [
    "AsyncConsumer",
    "AsyncStoreClient",
    "CheckpointError",
    "ClientReads",
    "ConfigError",
    "ConsumedMessage",
    "Consumer",
    "ConsumerClosed",
    "DecodedRecord",
    "FlushError",
    "GetMessageStatus",
    "Message",
    "MessageIllegalError",
    "PullResult",
    "PullViews",
    "PutError",
    "PutMessageStatus",
    "PutResult",
    "RecordError",
    "RecordView",
    "SegmentNameError",
    "SegmentSizeError",
    "ServiceUnavailableError",
    "StoreAccessDenied",
    "StoreClient",
    "StoreDirError",
    "StoreIOError",
    "StoreLockHeld",
    "SupervisorUnavailable",
    "WorkersNotUp",
    "__version__",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mqstore")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'mqstore' has no attribute {name!r}")
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
