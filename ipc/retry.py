"""The client's retry helper: a put retried until `PUT_OK`, stored once.

`StoreClient.put_until_ok` / `put_batch_until_ok` give each message its UNIQ_KEY before
the first try (the caller's, or the client's next id) and put it again, with the same key,
while the answer is one a retry can change: `FLUSH_DISK_TIMEOUT` (the record may be in
the log), `SERVICE_NOT_AVAILABLE` (stopping, a dead or restarting supervisor, a put of
the same key still in progress), `OS_PAGECACHE_BUSY`, `CREATE_MAPPED_FILE_FAILED`. Each
try re-attaches when the supervisor changed (`ipc.session`). Because the key stays the
same, a try after one that was stored answers the first put's result and stores nothing
(the idempotence table, `ipc/native/mqs_uniq.h`): the message is stored once, whatever
the tries in between answered, as long as the retry comes within the window
(docs/durability.md). Any other status (`MESSAGE_ILLEGAL`, `FLUSH_DISK_FAILED`, ...)
is returned at once, as is the last answer when `timeout_s` has passed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from mqstore import _native
from mqstore.engine.record import PROPERTY_UNIQ_KEY, Message
from mqstore.ipc.results import PutMessageStatus, PutResult

RETRIABLE: Final = frozenset(
    {
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.SERVICE_NOT_AVAILABLE,
        PutMessageStatus.OS_PAGECACHE_BUSY,
        PutMessageStatus.CREATE_MAPPED_FILE_FAILED,
    }
)
_FIRST_PAUSE_S: Final = 0.01
_MAX_PAUSE_S: Final = 0.5


def with_key(properties: Mapping[str, str] | None, new_key: Callable[[], str]) -> dict[str, str]:
    """`properties` with a UNIQ_KEY: the caller's, else a new one."""
    props = dict(properties or {})
    if PROPERTY_UNIQ_KEY not in props:
        props[PROPERTY_UNIQ_KEY] = new_key()
    return props


def keyed_batch(
    messages: Iterable[Mapping[str, Any] | Message], new_key: Callable[[], str]
) -> list[Any]:
    """A batch whose every message has its UNIQ_KEY (a dict's `properties`, a Message's).
    ValueError for more than `_native.IDEM_WINDOW` messages: the store remembers that
    many puts of a producer, so a retry of a longer batch would find its first keys
    gone and store the whole batch again."""
    import dataclasses  # here: a producer's import does not load it

    out: list[Any] = []
    for m in messages:
        if isinstance(m, Message):
            out.append(dataclasses.replace(m, properties=with_key(m.properties, new_key)))
        else:
            d = dict(m)
            d["properties"] = with_key(d.get("properties"), new_key)
            out.append(d)
        if len(out) > _native.IDEM_WINDOW:
            raise ValueError(
                f"a batch retried until PUT_OK holds at most {_native.IDEM_WINDOW} messages "
                "(the puts of a producer the store remembers): a retry of a longer one "
                "would store it again; split it"
            )
    return out


def _final(got: Sequence[PutResult], deadline: float | None, pause: float) -> bool:
    """Whether `got` is the answer to return: all PUT_OK, one not retriable, or no time
    left for another pause."""
    if all(r.status is PutMessageStatus.PUT_OK for r in got):
        return True
    if any(r.status not in RETRIABLE for r in got):
        return True
    return deadline is not None and time.monotonic() + pause > deadline


def retry(
    attempt: Callable[[], Sequence[PutResult]], timeout_s: float | None
) -> Sequence[PutResult]:
    """Call `attempt` until its results are all PUT_OK, one is not retriable, or
    `timeout_s` (None: no limit) has passed; pauses 10 ms doubling to 0.5 s."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause = _FIRST_PAUSE_S
    while True:
        got = attempt()
        if _final(got, deadline, pause):
            return got
        time.sleep(pause)
        pause = min(pause * 2, _MAX_PAUSE_S)


async def retry_async(
    attempt: Callable[[], Awaitable[Sequence[PutResult]]], timeout_s: float | None
) -> Sequence[PutResult]:
    """`retry` for the asyncio client: the pauses are `asyncio.sleep`, the loop runs on."""
    import asyncio  # here: a producer that imports StoreClient does not load asyncio

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause = _FIRST_PAUSE_S
    while True:
        got = await attempt()
        if _final(got, deadline, pause):
            return got
        await asyncio.sleep(pause)
        pause = min(pause * 2, _MAX_PAUSE_S)
