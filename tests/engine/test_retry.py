"""engine.retry: what RocketMQ writes for a message given back (retry, dead letter), for
the delay rewrite and for a due message's re-put; pinned by golden records that RocketMQ's
own decoder reads (tests/data/README.md), and `messageDelayLevel`'s syntax."""

from __future__ import annotations

import pytest

from mqstore.conf.settings import parse_delay_levels
from mqstore.engine import record
from mqstore.engine.record import SCHEDULE_TOPIC, Message
from mqstore.engine.retry import schedule_rewrite, send_back_message, timeup_message
from tests.engine.retry_golden import GOLDEN, original, records, stored


@pytest.mark.parametrize("name", sorted(records()))
def test_golden_records(name: str) -> None:
    assert records()[name] == (GOLDEN / name).read_bytes(), (
        f"{name} changed: if deliberate, run `python -m tests.engine.retry_golden`"
    )


def test_a_retry_climbs_the_levels_then_dies_at_the_count() -> None:
    first = original()  # reconsumed once already
    msg = first
    levels = []
    for n in range(4):
        back = send_back_message(msg, "G", max_reconsume_times=4)
        if back.dead:
            break
        levels.append(back.message.delay_level)
        assert back.message.topic == "%RETRY%G" and back.message.queue_id == 0
        sched = schedule_rewrite(back.message, 18)
        due = stored(sched, n, 1000 * (n + 1), 1_700_000_000_000 + n)
        reput = timeup_message(due)
        assert reput is not None and (reput.topic, reput.queue_id) == ("%RETRY%G", 0)
        msg = stored(reput, n, 100_000 * (n + 1), 1_700_000_100_000 + n)
        assert msg.reconsume_times == first.reconsume_times + n + 1
        assert msg.properties["RETRY_TOPIC"] == "TopicTest"  # the first topic, kept
        assert msg.properties["ORIGIN_MESSAGE_ID"] == first.msg_id  # the first id, kept
        assert msg.properties["RECONSUME_TIME"] == str(msg.reconsume_times)
    assert levels == [4, 5, 6]  # 3 + reconsumeTimes
    assert back.dead and back.message.topic == "%DLQ%G" and back.message.delay_level == 0
    assert back.message.properties["DELAY"] == "0" and "REAL_TOPIC" not in back.message.properties
    assert back.message.reconsume_times == 5 and back.message.body == first.body


def test_a_level_given_or_negative() -> None:
    first = original()
    assert send_back_message(first, "G", delay_level=2).message.delay_level == 2
    dead = send_back_message(first, "G", delay_level=-1)
    assert dead.dead and dead.message.topic == "%DLQ%G"


def test_the_delay_rewrite_clamps_and_keeps_the_real_queue() -> None:
    m = Message("T", b"x", {"a": "b"}, queue_id=3, delay_level=40)
    s = schedule_rewrite(m, 18)
    assert (s.topic, s.queue_id, s.delay_level) == (SCHEDULE_TOPIC, 17, 18)
    assert list(s.properties.items()) == [
        ("a", "b"), ("DELAY", "18"), ("REAL_TOPIC", "T"), ("REAL_QID", "3"),
    ]  # fmt: skip


def test_a_schedule_record_without_its_real_queue_is_not_reput() -> None:
    bad = stored(Message(SCHEDULE_TOPIC, b"x", {"DELAY": "1", "REAL_QID": "x"}), 0, 0, 1)
    assert timeup_message(bad) is None


def test_the_tags_code_of_a_schedule_record_is_its_delivery_time() -> None:
    data = records()["record-retry-schedule.bin"]
    h = record.check_record(data, 0)
    assert h.tags_code == 1_700_000_001_000 + 30_000  # level 4 of the default levels: 30 s


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
         (1000, 5000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
          420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)),
        ("1s", (1000,)),
        ("2d 0s", (172_800_000, 0)),
    ],
)  # fmt: skip
def test_message_delay_level_syntax(spec: str, want: tuple[int, ...]) -> None:
    assert parse_delay_levels(spec) == want


@pytest.mark.parametrize("spec", ["", "1s  2s", "1x", "s", "1.5s", "-1s", "1s,2s", "٣s"])
def test_message_delay_level_refusals(spec: str) -> None:
    with pytest.raises(ValueError, match=r"delay level|levels"):
        parse_delay_levels(spec)
