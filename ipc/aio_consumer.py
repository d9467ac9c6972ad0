"""`AsyncConsumer`: a consumer-group member for asyncio programs, made by
`AsyncStoreClient.consumer` (`ipc.aio`): the blocking `ipc.consumer.Consumer`, with a
`StoreClient` of its own, its waits off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mqstore.ipc.client import StoreClient
from mqstore.ipc.consumer import ConsumedMessage, Consumer, ConsumerClosed
from mqstore.ipc.results import PutResult


class AsyncConsumer:
    """A consumer-group member for asyncio (`AsyncStoreClient.consumer`): the blocking
    `ipc.consumer.Consumer` (its own `StoreClient`), its waits off the loop.

        async with store.consumer("billing", ["orders"]) as consumer:
            async for msg in consumer:    # the next message acks this one
                await handle(msg.body)    # an exception leaving the loop nacks it

    `poll` and `nack` (a put that may wait for the disk) run on threads of the
    consumer's own; `ack` is a few memory writes and runs on the loop."""

    def __init__(self, consumer: Consumer, client: StoreClient, pool: ThreadPoolExecutor) -> None:
        self._consumer = consumer
        self._client = client
        self._pool = pool
        self._current: ConsumedMessage | None = None

    @property
    def member_id(self) -> str | None:
        return self._consumer.member_id

    @property
    def group(self) -> str:
        return self._consumer.group

    def assignment(self) -> list[tuple[str, int]]:
        return self._consumer.assignment()

    async def poll(self, max_count: int = 32, timeout: float = 1.0) -> list[ConsumedMessage]:
        """`Consumer.poll`, waiting off the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._consumer.poll, max_count, timeout)

    def ack(self, msg: ConsumedMessage) -> bool:
        return self._consumer.ack(msg)

    async def nack(self, msg: ConsumedMessage, delay_level: int = 0) -> PutResult:
        """`Consumer.nack` (the send-back put) off the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._consumer.nack, msg, delay_level)

    async def __aiter__(self) -> AsyncIterator[ConsumedMessage]:
        """Messages one at a time until closed; asking for the next acks the one
        before; an exception leaving the loop inside `async with` nacks it."""
        buffered: deque[ConsumedMessage] = deque()
        while True:
            cur = self._current
            if cur is not None and not cur.done:
                self.ack(cur)
            self._current = None
            if not buffered:
                try:
                    buffered.extend(await self.poll(self._consumer.pull_batch, 0.5))
                except ConsumerClosed:
                    return
                continue
            self._current = buffered.popleft()
            yield self._current

    async def close(self) -> None:
        """Leave the group (`Consumer.close`) and detach."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._consumer.close)
        await loop.run_in_executor(self._pool, self._client.close)
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        cur = self._current
        if cur is not None and not cur.done:
            if exc is not None:
                with contextlib.suppress(Exception):
                    await self.nack(cur)
            else:
                self.ack(cur)
        await self.close()


def open_consumer(
    store_dir: str, timeout_s: float, group: str, topics: str | Sequence[str], **options: Any
) -> AsyncConsumer:
    """`AsyncStoreClient.consumer`'s member, made off the loop: `StoreClient.consumer`
    (`options` are its keywords) on a `StoreClient` of its own."""
    client = StoreClient.attach(store_dir, timeout_s=timeout_s)
    try:
        consumer = client.consumer(group, topics, **options)
    except BaseException:
        client.close()
        raise
    return AsyncConsumer(
        consumer, client, ThreadPoolExecutor(2, thread_name_prefix="mqstore-aio-consumer")
    )
