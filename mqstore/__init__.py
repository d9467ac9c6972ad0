"""mqstore: the public API.

Users write `from mqstore import StoreClient`. This package only re-exports; the
implementation lives in `engine/`, `ipc/` and `workers/`.
"""

from engine.record import DecodedRecord, Message
from ipc.access import StoreAccessDenied
from ipc.aio import AsyncStoreClient
from ipc.client import StoreClient
from ipc.read_results import GetMessageStatus, PullResult
from ipc.reads import ClientReads
from ipc.results import PutMessageStatus, PutResult

__all__ = [
    "AsyncStoreClient",
    "ClientReads",
    "DecodedRecord",
    "GetMessageStatus",
    "Message",
    "PullResult",
    "PutMessageStatus",
    "PutResult",
    "StoreAccessDenied",
    "StoreClient",
]
