"""What RocketMQ writes for delayed, retried and dead-lettered messages: pure functions
from a stored record to the `Message` the store puts next (no processes, no files).

- `send_back_message`: the broker's `consumerSendMsgBack` (4.9.8
  `SendMessageProcessor.asyncConsumerSendMsgBack`; 5.x the same in
  `AbstractSendMessageProcessor`): a consumer gives a message back to its group. Its
  reconsume count grows by one; once the old count has reached `max_reconsume_times` (or
  the caller asks with a negative delay level) it goes to `%DLQ%<group>` queue 0 (one DLQ
  queue per group) with `DELAY` 0; else to `%RETRY%<group>` queue 0 (one retry queue per
  group, RocketMQ's `retryQueueNums`) with delay level `3 + reconsumeTimes` when the
  caller gave 0. `RETRY_TOPIC` (the first topic, kept once set), `ORIGIN_MESSAGE_ID` (the
  first message's offset id, kept once set) and `WAIT` false are set as the broker sets
  them; `RECONSUME_TIME` and `MAX_RECONSUME_TIMES` as the client's fallback send-back sets
  them. Body, flag, sys flag, born time and host, TAGS, KEYS and the other properties are
  kept. The put's delay rewrite (`schedule_rewrite`) then adds `DELAY`, `REAL_TOPIC` and
  `REAL_QID` and sends it to `SCHEDULE_TOPIC_XXXX`.
- `schedule_rewrite`: CommitLog's delay rewrite (spec 1.12), the reference of the C put's
  (`ipc/native/mqs_fields.c`, `delay_rewrite`).
- `timeup_message`: `ScheduleMessageService.messageTimeup`: a due schedule-topic record
  back to its real topic and queue. Its properties are kept as stored, `DELAY`,
  `REAL_TOPIC` and `REAL_QID` included (the broker computes the stored properties
  string before it clears `DELAY` from the map); its reconsume count, flag, sys flag and
  born time and host too.
"""

from __future__ import annotations

from typing import Final, NamedTuple, Protocol

from mqstore.engine.record import COMPRESSION_TYPE_MASK, SCHEDULE_TOPIC, Message, SysFlag

RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
RETRY_TOPIC: Final = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME: Final = "RECONSUME_TIME"
MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
WAIT: Final = "WAIT"
DELAY: Final = "DELAY"
REAL_TOPIC: Final = "REAL_TOPIC"
REAL_QID: Final = "REAL_QID"
DEFAULT_MAX_RECONSUME_TIMES: Final = 16  # SubscriptionGroupConfig.retryMaxTimes
# What the put's delay rewrite sets: a message given back loses its old values first.
DELAY_PROPERTIES: Final = (DELAY, REAL_TOPIC, REAL_QID)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


class StoredMessage(Protocol):
    """What a pull returns (`engine.record.RecordFields`), as far as these read it."""

    @property
    def topic(self) -> str: ...
    @property
    def body(self) -> bytes | memoryview: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @property
    def flag(self) -> int: ...
    @property
    def sys_flag(self) -> int: ...
    @property
    def born_timestamp(self) -> int: ...
    @property
    def born_host(self) -> str: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def msg_id(self) -> str: ...


class SendBack(NamedTuple):
    """Where a message given back goes: `message` (its `delay_level` > 0 for a retry, 0
    for the DLQ) and whether it is dead (`%DLQ%<group>`). A `NamedTuple`: a dataclass's
    decoration is compiled at every producer's import (bench/results/client_start.md)."""

    message: Message
    dead: bool


def send_back_message(
    stored: StoredMessage,
    group: str,
    *,
    delay_level: int = 0,
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
) -> SendBack:
    """The message RocketMQ's `consumerSendMsgBack` puts for `stored`, given back by
    `group` (module docstring)."""
    props = {k: v for k, v in stored.properties.items() if k not in DELAY_PROPERTIES}
    props.setdefault(RETRY_TOPIC, stored.topic)
    props[WAIT] = "false"
    old = stored.reconsume_times
    dead = old >= max_reconsume_times or delay_level < 0
    if dead:
        topic, level = dlq_topic(group), 0
        props[DELAY] = "0"  # msgExt.setDelayTimeLevel(0): stored as given, no delay
    else:
        topic, level = retry_topic(group), delay_level or 3 + old
    props.setdefault(ORIGIN_MESSAGE_ID, stored.msg_id)
    props[RECONSUME_TIME] = str(old + 1)
    props[MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    msg = Message(
        topic,
        bytes(stored.body),
        props,
        queue_id=0,
        flag=stored.flag,
        sys_flag=_as_read(stored),
        born_timestamp=stored.born_timestamp,
        born_host=stored.born_host,
        reconsume_times=old + 1,
        delay_level=level,
    )
    return SendBack(msg, dead)


def schedule_rewrite(msg: Message, max_level: int) -> Message:
    """CommitLog's delay rewrite of `msg` (its `delay_level` > 0, its real queue chosen):
    the level clamped to `max_level`, DELAY, REAL_TOPIC, REAL_QID appended to its
    properties, SCHEDULE_TOPIC_XXXX queue level - 1. `delay_level` stays on the result
    (the encoder does not read it)."""
    import dataclasses  # here: a producer's import does not load it

    level = min(msg.delay_level, max_level)
    props = {
        **msg.properties,
        DELAY: str(level),
        REAL_TOPIC: msg.topic,
        REAL_QID: str(msg.queue_id),
    }
    return dataclasses.replace(
        msg, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=props, delay_level=level
    )


def timeup_message(stored: StoredMessage) -> Message | None:
    """`messageTimeup`: the message a due schedule-topic record is re-put as (module
    docstring), or None when its REAL_TOPIC / REAL_QID are missing or unreadable (the
    broker logs and drops it)."""
    props = stored.properties
    topic, qid = props.get(REAL_TOPIC), props.get(REAL_QID, "")
    if not topic or not (qid.isascii() and qid.isdigit()):
        return None
    return Message(
        topic,
        bytes(stored.body),
        dict(props),
        queue_id=int(qid),
        flag=stored.flag,
        sys_flag=_as_read(stored),
        born_timestamp=stored.born_timestamp,
        born_host=stored.born_host,
        reconsume_times=stored.reconsume_times,
    )


def _as_read(stored: StoredMessage) -> int:
    """`stored`'s sys flag without its compression bits: a read gives the original body
    (`engine.compression.inflate`), so a re-put of it is compressed again, or not, by the
    putting store's own settings; kept, the bits would mark a plain body as compressed."""
    return stored.sys_flag & ~(int(SysFlag.COMPRESSED) | COMPRESSION_TYPE_MASK)
