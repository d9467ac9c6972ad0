"""mqstore: the public API.

Users write `from mqstore import StoreClient`. This module only re-exports; the
implementation lives in the subpackages `mqstore.engine`, `mqstore.ipc`, `mqstore.conf`,
`mqstore.workers` and `mqstore.pipeline` (in a checkout, links to the top-level folders of
the same names).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

from mqstore.conf.load import ConfigError
from mqstore.engine.checkpoint import CheckpointError
from mqstore.engine.fileio import StoreIOError
from mqstore.engine.record import DecodedRecord, Message, RecordError, RecordView
from mqstore.engine.segment import SegmentNameError, SegmentSizeError
from mqstore.engine.storedir import StoreDirError
from mqstore.ipc.access import StoreAccessDenied
from mqstore.ipc.aio import AsyncConsumer, AsyncStoreClient
from mqstore.ipc.channel import SupervisorUnavailable
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

try:
    __version__ = _dist_version("mqstore")
except PackageNotFoundError:  # a checkout on sys.path, not installed
    __version__ = "0+unknown"

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
    "__version__",
]
