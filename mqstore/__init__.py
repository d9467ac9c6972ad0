"""mqstore: the public API.

Users write `from mqstore import StoreClient`. This package only re-exports; the
implementation lives in `engine/`, `ipc/` and `workers/`.
"""

from engine.record import DecodedRecord, Message

__all__ = ["DecodedRecord", "Message"]
