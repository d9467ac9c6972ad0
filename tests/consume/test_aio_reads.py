"""`AsyncStoreClient.pull` goes through `ipc.reads.ClientReads` when the store runs a
dispatcher: tags and long polling on the loop's read thread."""

from __future__ import annotations

import asyncio

from mqstore.ipc.aio import AsyncStoreClient
from mqstore.ipc.read_results import GetMessageStatus, PullResult
from tests.runtime.harness import Store


def test_async_pull_tags_and_long_poll(store: Store) -> None:
    store.wait_workers_running()

    async def main() -> None:
        async with AsyncStoreClient.attach(store.path) as aio:
            for i, t in enumerate(["a", "b", "a"]):
                assert (await aio.put("ap", b"m%d" % i, tags=t, queue_id=0)).ok
            got = await aio.pull("ap", 0, 0, 32, tags="a", wait_ms=30_000)
            while len(got.messages) < 2:  # the dispatcher may have done only part of it
                nxt = await aio.pull("ap", 0, got.next_offset, 32, tags="a", wait_ms=30_000)
                got.messages += nxt.messages
                got.next_offset = nxt.next_offset
            assert isinstance(got, PullResult)
            assert [m.body for m in got.messages] == [b"m0", b"m2"]
            waiting = asyncio.ensure_future(aio.pull("ap", 0, 3, 32, wait_ms=60_000))
            await asyncio.sleep(0)
            assert (await aio.put("ap", b"late", tags="b", queue_id=0)).ok
            late = await waiting
            assert late.status is GetMessageStatus.FOUND and late.messages[0].body == b"late"

    asyncio.run(main())
