"""nack -> `%RETRY%<group>` with the next delay level -> `%DLQ%<group>` after
`max_reconsume_times`, end to end on a real supervisor (its scheduler worker delivers
the retries), in the blocking and the asyncio consumer, and the iterator forms."""

from __future__ import annotations

import asyncio
import time

import pytest

from mqstore import StoreClient
from mqstore.ipc.aio import AsyncStoreClient
from mqstore.ipc.consumer import ConsumedMessage
from tests.runtime.harness import Store

# delay levels 3 and 4 (the first two retries: 3 + reconsume times) are 1 s and 2 s
LEVELS = {"message_delay_level": "1s 1s 1s 2s 1s 1s 1s 1s", "default_topic_queue_nums": 2}


def _deliveries(
    consumer: object, body: bytes, want: int, fail: int, timeout_s: float
) -> list[tuple[float, ConsumedMessage]]:
    from mqstore.ipc.consumer import Consumer

    assert isinstance(consumer, Consumer)
    seen: list[tuple[float, ConsumedMessage]] = []
    deadline = time.monotonic() + timeout_s
    while len(seen) < want and time.monotonic() < deadline:
        for m in consumer.poll(8, 0.2):
            assert m.body == body
            seen.append((time.monotonic(), m))
            if m.reconsume_times < fail:
                assert consumer.nack(m).status.name == "PUT_OK"
            else:
                consumer.ack(m)
    return seen


def test_failing_twice_is_seen_three_times_at_the_delays(make_store: object) -> None:
    store: Store = make_store(LEVELS)  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        c = client.consumer("g", "orders")
        r = client.put("orders", b"pay", keys="o-1")
        seen = _deliveries(c, b"pay", 3, 2, 30)
        assert [m.reconsume_times for _t, m in seen] == [0, 1, 2]
        assert [m.topic for _t, m in seen] == ["orders"] * 3  # RETRY_TOPIC, as RocketMQ's client
        assert [m.record.topic for _t, m in seen] == ["orders", "%RETRY%g", "%RETRY%g"]
        first = seen[0][1]
        for _t, m in seen[1:]:
            assert m.properties["ORIGIN_MESSAGE_ID"] == r.msg_id
            assert m.properties["RETRY_TOPIC"] == "orders"
            assert m.keys == "o-1"
        gaps = [seen[i + 1][0] - seen[i][0] for i in range(2)]
        print(f"retry gaps {[round(g, 3) for g in gaps]} s for delays [1, 2] s")
        assert gaps[0] >= 0.95 and gaps[1] >= 1.95, gaps  # never before the delay
        assert gaps[0] < 3.0 and gaps[1] < 4.0, gaps  # (the goal is 200 ms)
        assert first.queue_id in (0, 1)
        assert c.poll(8, 1.5) == []  # acked: not again
        c.close()


def test_always_failing_ends_in_the_dlq(make_store: object) -> None:
    store: Store = make_store(LEVELS)  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        c = client.consumer("g", "orders", max_reconsume_times=2)
        r = client.put("orders", b"bad")
        seen = _deliveries(c, b"bad", 3, 99, 30)
        assert [m.reconsume_times for _t, m in seen] == [0, 1, 2]
        assert c.poll(8, 2.5) == []  # the third nack went to the DLQ, not the retry topic
        dlq = client.pull("%DLQ%g", 0, 0, 8)
        assert [m.body for m in dlq.messages] == [b"bad"]
        props = dlq.messages[0].properties
        assert props["ORIGIN_MESSAGE_ID"] == r.msg_id
        assert props["RETRY_TOPIC"] == "orders"
        assert props["MAX_RECONSUME_TIMES"] == "2"
        assert dlq.messages[0].reconsume_times == 3
        c.close()


def test_iterator_form_nacks_on_an_exception(make_store: object) -> None:
    store: Store = make_store(LEVELS)  # type: ignore[operator]
    with StoreClient.attach(store.path) as client:
        client.put("orders", b"one")
        with pytest.raises(RuntimeError), client.consumer("g", "orders") as c:
            for msg in c:
                assert msg.body == b"one"
                raise RuntimeError("handler failed")
        with client.consumer("g", "orders") as c:
            got = []
            for msg in c:
                got.append((msg.body, msg.reconsume_times, msg.record.topic))
                break
        assert got == [(b"one", 1, "%RETRY%g")]


def test_asyncio_consumer(make_store: object) -> None:
    store: Store = make_store(LEVELS)  # type: ignore[operator]

    async def main() -> list[tuple[bytes, int]]:
        async with AsyncStoreClient.attach(store.path) as s:
            for i in range(10):
                await s.put("orders", b"a%d" % i)
            got: list[tuple[bytes, int]] = []
            async with s.consumer("ag", ["orders"]) as c:
                assert c.member_id
                async for msg in c:
                    got.append((msg.body, msg.reconsume_times))
                    if msg.body == b"a3" and msg.reconsume_times == 0:
                        assert (await c.nack(msg)).status.name == "PUT_OK"
                    if len(got) == 11:
                        break
            c2 = await s.consumer("ag", "orders")
            assert await c2.poll(8, 0.5) == []  # all acked, the retry consumed
            await c2.close()
            return got

    got = asyncio.run(main())
    assert sorted(b for b, _n in got) == sorted([b"a%d" % i for i in range(10)] + [b"a3"])
    assert (b"a3", 1) in got
