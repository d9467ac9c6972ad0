"""The scheduler (workers/scheduler.py) in a real store: delayed messages arrive in their
topic once, never before due and at most 200 ms after; its progress survives a stop, and
a restart after a crash between a re-put and its progress write delivers nothing twice;
send_back's retries come back the configured delays apart and end in the DLQ."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from pathlib import Path

import pytest

from mqstore import AsyncStoreClient, PutMessageStatus, PutResult, StoreClient
from mqstore.conf.settings import StoreSettings
from mqstore.engine.consumequeue_files import UNIT
from mqstore.engine.record import SCHEDULE_TOPIC, DecodedRecord
from mqstore.engine.recovery import recover_store
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for
from tests.runtime.scheduling import (
    CONFIG,
    DELAYS_MS,
    LATE_MS,
    Sent,
    collect,
    judge,
    percentile,
    put_delayed,
    scheduler_ready,
    scheduler_waits,
)

OK = PutMessageStatus.PUT_OK


def _offsets(path: Path) -> dict[str, int]:
    table: dict[str, int] = json.loads((path / "config" / "delayOffset.json").read_text())[
        "offsetTable"
    ]
    return table


def test_delayed_messages_arrive_once_when_due(make_store: StoreFactory) -> None:
    st = make_store(CONFIG)
    scheduler_ready(st)
    sent = Sent()
    with scheduler_waits(st) as waits:
        with StoreClient.attach(st.path) as client:
            put_delayed(client, 1000, random.Random(25), sent)
        got = collect(st, sent, 60)
    j = judge(sent, got, waits=waits)
    assert not j.missing and not j.twice, (j.missing[:5], j.twice[:5])
    assert not j.early, j.early[:5]
    # at most LATE_MS after due, past the time the scheduler waited for a CPU meanwhile
    assert not j.late, (j.late[:5], percentile(j.lateness_ms, 0.99))
    # progress: every level's queue consumed, in RocketMQ's delayOffset.json form
    with StoreClient.attach(st.path) as client:
        ends = {str(lv): client.max_offset(SCHEDULE_TOPIC, lv - 1) for lv in range(1, 6)}
    wait_for(lambda: {k: v for k, v in _offsets(st.path).items() if k in ends} == ends, 10,
             "delayOffset.json to cover every delivery")  # fmt: skip


def test_a_restart_after_a_lost_progress_write_delivers_nothing_twice(
    make_store: StoreFactory,
) -> None:
    """The crash window: re-puts done, delayOffset.json not written yet. Rolled back to
    zeros by hand, the restarted scheduler finds the re-puts in the real queues."""
    st = make_store(CONFIG)
    sent = Sent()
    with StoreClient.attach(st.path) as client:
        put_delayed(client, 200, random.Random(7), sent)
    collect(st, sent, 60)
    assert st.stop() == 0
    (st.path / "config" / "delayOffset.json").write_text('{"offsetTable":{1:0,2:0,3:0}}')
    st.start()
    with StoreClient.attach(st.path) as client:  # and new ones still go out
        put_delayed(client, 50, random.Random(8), sent)
    got = collect(st, sent, 60)
    j = judge(sent, got)
    assert not j.missing and not j.twice, (j.missing[:5], j.twice[:5])
    assert "were re-put before the last stop without their progress saved" in st.output()


def test_a_lost_progress_write_finds_every_levels_re_puts_to_a_shared_queue(
    make_store: StoreFactory,
) -> None:
    """Two levels re-put to one queue, the level read first due last: the restarted
    scheduler must look for the queue's re-puts from the earliest due time of any level.
    It looked from the first level's (less 2 s) only, missed level 2's re-put made 4 s
    before that and delivered it again. Levels need not grow ("5s 1s" is a valid
    messageDelayLevel); with growing ones the same happens to a level 1 message put
    more than its level's delay + 2 s after a level 2 one, both in one unsaved window."""
    st = make_store({"message_delay_level": "5s 1s"})
    st.wait_workers_running()  # not scheduler_ready: its level 1 probe, due first, would
    # have the restarted scheduler look back far enough
    with StoreClient.attach(st.path) as client:
        for body, level in ((b"short", 2), (b"long", 1)):
            assert client.put("Mixed", body, queue_id=0, delay_level=level).status is OK
        assert {_await(client, "Mixed", 0).body, _await(client, "Mixed", 1).body} == {
            b"short", b"long",
        }  # fmt: skip
    assert st.stop() == 0
    (st.path / "config" / "delayOffset.json").write_text('{"offsetTable": {"1": 0, "2": 0}}')
    st.start()
    wait_for(lambda: _offsets(st.path) == {"1": 1, "2": 1}, 60, "the recovered progress")
    with StoreClient.attach(st.path) as client:
        got = client.pull("Mixed", 0, 0, 8).messages
    assert sorted(bytes(m.body) for m in got) == [b"long", b"short"], "delivered twice"
    assert "2 delayed messages were re-put before the last stop" in st.output()


def test_delivery_goes_on_across_a_stop(make_store: StoreFactory) -> None:
    st = make_store(CONFIG)
    sent = Sent()
    with StoreClient.attach(st.path) as client:
        put_delayed(client, 300, random.Random(9), sent)
    time.sleep(2.0)  # some delivered, some not due yet
    assert st.stop() == 0
    st.start()
    got = collect(st, sent, 60)
    j = judge(sent, got, excused=(0, 2**62))  # the stop makes the ones due meanwhile late
    assert not j.missing and not j.twice and not j.early, (j.missing[:5], j.twice[:5])


def _await(client: StoreClient, topic: str, offset: int, queue_id: int = 0) -> DecodedRecord:
    got: list[DecodedRecord] = []

    def arrived() -> bool:
        res = client.pull(topic, queue_id, offset, 1)
        got[:] = res.messages
        return bool(res.messages)

    wait_for(arrived, 30, f"a message in {topic}")
    return got[0]


def test_send_back_retries_come_back_the_configured_delays_apart_then_go_to_the_dlq(
    make_store: StoreFactory,
) -> None:
    """nack (send_back) twice: back in %RETRY%G after levels 3 and 4 (3 + reconsume
    count), each within 200 ms of its delay; with max_reconsume_times=2 the third
    send_back puts it in %DLQ%G, with the properties RocketMQ writes."""
    st = make_store({"message_delay_level": "1s 1s 1s 2s 1s"})
    scheduler_ready(st)
    with StoreClient.attach(st.path) as client, scheduler_waits(st) as waits:
        r = client.put("Orders", b"pay", tags="t", keys=["o-1"], queue_id=0)
        msg = _await(client, "Orders", r.queue_offset)
        for n, delay_ms in enumerate((1000, 2000)):
            back = client.send_back(msg, "G", max_reconsume_times=2)
            assert back.status is OK and back.queue_id == 2 + n  # level 3 + n
            msg = _await(client, "%RETRY%G", n)
            due = back.store_timestamp + delay_ms
            lag = msg.store_timestamp - due
            # the goal, past the scheduler's wait for a CPU between due and the re-put
            assert 0 <= lag <= LATE_MS + waits.between(due, msg.store_timestamp), lag
            props = msg.properties
            assert msg.reconsume_times == n + 1
            assert props["RETRY_TOPIC"] == "Orders" and props["TAGS"] == "t"
            assert props["ORIGIN_MESSAGE_ID"] == r.msg_id and props["KEYS"] == "o-1"
            assert props["RECONSUME_TIME"] == str(n + 1) and props["MAX_RECONSUME_TIMES"] == "2"
            assert props["DELAY"] == str(3 + n) and props["REAL_TOPIC"] == "%RETRY%G"
        dead = client.send_back(msg, "G", max_reconsume_times=2)
        assert dead.status is OK
        dlq = _await(client, "%DLQ%G", 0)
        assert dlq.reconsume_times == 3 and dlq.body == b"pay"
        assert dlq.properties["DELAY"] == "0" and dlq.properties["ORIGIN_MESSAGE_ID"] == r.msg_id
        assert client.max_offset("%RETRY%G", 0) == 2  # delivered 3 times in all
    assert DELAYS_MS == (1000, 2000, 3000, 4000, 5000)


def test_the_asyncio_client_delays_and_sends_back(make_store: StoreFactory) -> None:
    st = make_store({"message_delay_level": "1s 1s 1s 1s"})

    async def run() -> None:
        async with AsyncStoreClient.attach(st.path) as aio:
            r = await aio.put("AioT", b"a", delay_level=1, queue_id=1)
            assert (r.status, r.queue_id) == (OK, 0)
            with pytest.raises(TypeError, match="delay_level"):
                await aio.put("AioT", b"a", delay_level="1")  # type: ignore[arg-type]
            bad = await aio.put("AioT", b"a", delay_level=-2)
            assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL and "negative" in bad.reason

    asyncio.run(run())
    with StoreClient.attach(st.path) as client:
        msg = _await(client, "AioT", 0, queue_id=1)  # delivered to its REAL_QID
        assert msg.queue_id == 1 and msg.properties["REAL_QID"] == "1"

        async def back() -> PutResult:
            async with AsyncStoreClient.attach(st.path) as aio:
                return await aio.send_back(msg, "AG", delay_level=-1)

        dead = asyncio.run(back())
        assert dead.status is OK
        dlq = _await(client, "%DLQ%AG", 0)
        assert dlq.body == b"a" and dlq.properties["RETRY_TOPIC"] == "AioT"
        with pytest.raises(TypeError, match="message"):
            client.send_back(b"x", "AG")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="group"):
            client.send_back(msg, "bad group")


def test_send_back_by_the_client_that_produced_the_message_is_stored_each_time(
    make_store: StoreFactory,
) -> None:
    """The seam of idempotent puts and send-back: a retry keeps the original's UNIQ_KEY,
    which carries the producer id of the client that put it. The same client's
    send_back (twice, of the same pulled message, and once more of the retry it got
    back) must store every re-put, not answer the first put's result from the
    idempotence table; the scheduler's re-puts (the UNIQ_KEY again) are stored too."""
    st = make_store({"message_delay_level": "1s 1s 1s 1s 1s"})
    scheduler_ready(st)
    with StoreClient.attach(st.path) as client:
        r = client.put("Seam", b"nack me", queue_id=0)
        msg = _await(client, "Seam", r.queue_offset)
        assert msg.properties["UNIQ_KEY"] == r.uniq_key
        assert r.uniq_key.startswith(client.producer_id)  # a key the table would answer
        backs = [client.send_back(msg, "SG", delay_level=1) for _ in range(2)]
        for b in backs:
            assert b.status is OK and b.queue_id == 0, b  # SCHEDULE_TOPIC_XXXX level 1
        assert len({r.physical_offset, *(b.physical_offset for b in backs)}) == 3
        first, second = _await(client, "%RETRY%SG", 0), _await(client, "%RETRY%SG", 1)
        for got in (first, second):
            assert got.body == b"nack me" and got.reconsume_times == 1
            assert got.properties["UNIQ_KEY"] == r.uniq_key
        again = client.send_back(first, "SG", delay_level=1)
        assert again.status is OK
        assert again.physical_offset not in {r.physical_offset, *(b.physical_offset for b in backs)}
        third = _await(client, "%RETRY%SG", 2)
        assert third.reconsume_times == 2 and third.properties["UNIQ_KEY"] == r.uniq_key
        # a retry of the first put by hand is still answered from the table, not stored
        dup = client.put("Seam", b"nack me", properties={"UNIQ_KEY": r.uniq_key}, queue_id=0)
        assert (dup.status, dup.physical_offset) == (OK, r.physical_offset)
        assert client.max_offset("Seam", 0) == r.queue_offset + 1


def test_after_a_restart_a_retry_is_answered_the_first_put_not_its_redelivery(
    make_store: StoreFactory,
) -> None:
    """The table rebuilt from the log at a start meets the original record and then its
    send-back copies (same UNIQ_KEY, in SCHEDULE_TOPIC_XXXX and %RETRY%); a retry of the
    first put must still answer the first put, as the live table does."""
    st = make_store({"message_delay_level": "1s 1s"})
    scheduler_ready(st)
    with StoreClient.attach(st.path) as client:
        r = client.put("Again", b"first", queue_id=0)
        msg = _await(client, "Again", r.queue_offset)
        assert client.send_back(msg, "RG", delay_level=1).status is OK
        _await(client, "%RETRY%RG", 0)
        assert st.stop() == 0
        st.start()
        again = client.put_until_ok(
            "Again", b"first", properties={"UNIQ_KEY": r.uniq_key}, queue_id=0
        )
        assert again.reason.startswith("duplicate"), again
        assert (again.physical_offset, again.queue_id, again.queue_offset) == (
            r.physical_offset, r.queue_id, r.queue_offset,
        )  # fmt: skip


def test_put_until_ok_delays_and_a_retry_of_a_delayed_put_is_stored_once(
    make_store: StoreFactory,
) -> None:
    """put_until_ok(delay_level=) (blocking and asyncio) puts into SCHEDULE_TOPIC_XXXX; its
    retry (same UNIQ_KEY) answers that record, and the scheduler delivers it once."""
    st = make_store({"message_delay_level": "1s 1s"})
    scheduler_ready(st)
    with StoreClient.attach(st.path) as client:
        r = client.put_until_ok("Later", b"once", queue_id=0, delay_level=2)
        assert (r.status, r.queue_id) == (OK, 1) and r.reason == ""
        again = client.put_until_ok(
            "Later", b"once", properties={"UNIQ_KEY": r.uniq_key}, queue_id=0, delay_level=2
        )
        assert again.reason.startswith("duplicate") and again.physical_offset == r.physical_offset

        async def aio_put() -> PutResult:
            async with AsyncStoreClient.attach(st.path) as aio:
                return await aio.put_until_ok("Later", b"aio", queue_id=0, delay_level=1)

        a = asyncio.run(aio_put())
        assert (a.status, a.queue_id) == (OK, 0)
        got = {_await(client, "Later", 0).body, _await(client, "Later", 1).body}
        assert got == {b"once", b"aio"}
        wait_for(lambda: _offsets(st.path).get("2", 0) >= 1, 30, "level 2's progress")
        assert client.max_offset("Later", 0) == 2  # nothing twice
        assert client.max_offset(SCHEDULE_TOPIC, 1) == 1  # the retry stored nothing


def test_compressed_messages_are_delayed_and_sent_back_whole(make_store: StoreFactory) -> None:
    """A read gives a compressed body's original bytes: the scheduler's re-put and
    send_back put those bytes without the compression bits, and the store compresses them
    again (kept, the bits would have marked a plain body as compressed)."""
    st = make_store({"message_delay_level": "1s 1s 1s", "compress_type": "ZLIB"})
    scheduler_ready(st)
    body = b'{"order": 17, "lines": [' + b'{"sku": "a-1", "qty": 2}, ' * 400 + b"{}]}"
    with StoreClient.attach(st.path) as client:
        r = client.put("Orders", body, queue_id=0, delay_level=1)
        assert r.status is OK and r.size < len(body) // 3
        msg = _await(client, "Orders", 0)
        assert msg.body == body and msg.compression == "zlib" and msg.size < len(body) // 3
        back = client.send_back(msg, "G")
        assert back.status is OK
        retry = _await(client, "%RETRY%G", 0)
        assert retry.body == body and retry.compression == "zlib" and retry.size < len(body) // 3
        assert retry.reconsume_times == 1


def _schedule_tags_codes(path: Path, level: int) -> list[int]:
    """The tags codes of SCHEDULE_TOPIC_XXXX queue level-1, from its consume-queue file."""
    qdir = path / "consumequeue" / SCHEDULE_TOPIC / str(level - 1)
    data = b"".join(f.read_bytes() for f in sorted(qdir.iterdir()))
    units = [UNIT.unpack_from(data, i) for i in range(0, len(data), UNIT.size)]
    return [tags for phys, size, tags in units if size > 0]


def test_the_schedule_topics_tags_code_is_the_delivery_time_by_the_configured_levels(
    make_store: StoreFactory,
) -> None:
    """RocketMQ's checkMessageAndReturnSize times a schedule-topic unit with the store's
    own messageDelayLevel (ScheduleMessageService.computeDeliverTimestamp), in the
    dispatcher and in recovery's re-dispatch alike; a level past the last is the last's."""
    levels = "3s 7s"  # RocketMQ's default would say 1s and 5s
    st = make_store({"message_delay_level": levels})
    with StoreClient.attach(st.path) as client:
        r1 = client.put("Late", b"a", delay_level=1)
        r2 = client.put("Late", b"b", delay_level=2)
        assert r1.status is OK and r2.status is OK
        wait_for(
            lambda: [client.max_offset(SCHEDULE_TOPIC, q) for q in (0, 1)] == [1, 1],
            30,
            "the schedule queues' units",
        )
    expected = {1: [r1.store_timestamp + 3000], 2: [r2.store_timestamp + 7000]}
    assert st.stop() == 0  # before anything is due: the queues hold just these
    assert {lv: _schedule_tags_codes(st.path, lv) for lv in (1, 2)} == expected
    # recovery's re-dispatch writes the same codes into rebuilt queues
    shutil.rmtree(st.path / "consumequeue" / SCHEDULE_TOPIC)
    recover_store(st.path, StoreSettings(message_delay_level=levels))
    assert {lv: _schedule_tags_codes(st.path, lv) for lv in (1, 2)} == expected
