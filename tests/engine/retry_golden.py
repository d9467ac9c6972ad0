"""Builds the golden records of issue 25 (`tests/data/golden/record-*.bin`): what the store
writes for a message a consumer gives back (`engine.retry.send_back_message`, then the
put's delay rewrite, `schedule_rewrite`), for its re-put when due (`timeup_message`),
and for a dead letter. Checked against RocketMQ's own decoder (tests/data/README.md).
Run as a module to rewrite them after a deliberate format change:

    python -m tests.engine.retry_golden
"""

from __future__ import annotations

from pathlib import Path

from mqstore.engine import record
from mqstore.engine.record import DecodedRecord, Message
from mqstore.engine.retry import schedule_rewrite, send_back_message, timeup_message

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
STORE_HOST = "10.0.0.1:10911"
MAX_LEVEL = 18
FILES = ("record-retry-schedule.bin", "record-retry-timeup.bin", "record-dlq.bin")


def placed(msg: Message, queue_offset: int, phys: int, store_ts: int) -> bytes:
    """`msg`'s record as the store writes it at `phys` with these appender fields."""
    enc = record.encode(msg)
    assert enc.status is record.EncodeStatus.OK, enc.reason
    buf = bytearray(len(enc.data))
    record.patch_append_fields(buf, 0, enc, queue_offset, phys, store_ts)
    return bytes(buf)


def stored(msg: Message, queue_offset: int, phys: int, store_ts: int) -> DecodedRecord:
    return record.decode(placed(msg, queue_offset, phys, store_ts), 0)


def original() -> DecodedRecord:
    """A message of TopicTest as a consumer pulled it (consumed once before: reconsume 1)."""
    msg = Message(
        "TopicTest", b"Hello RocketMQ", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "0A0B0C0D"},
        queue_id=3, flag=7, born_timestamp=1_700_000_000_123, born_host="10.0.0.5:51000",
        store_host=STORE_HOST, reconsume_times=1,
    )  # fmt: skip
    return stored(msg, 42, 8192, 1_700_000_000_456)


def records() -> dict[str, bytes]:
    """The three golden records, by file name."""
    first = original()
    back = send_back_message(first, "GroupA")  # level 3 + 1 = 4, %RETRY%GroupA queue 0
    sched = schedule_rewrite(back.message, MAX_LEVEL)
    sched = Message(**{**_fields(sched), "store_host": STORE_HOST})
    sched_bytes = placed(sched, 0, 16384, 1_700_000_001_000)
    due = record.decode(sched_bytes, 0)
    timeup = timeup_message(due)
    assert timeup is not None
    timeup = Message(**{**_fields(timeup), "store_host": STORE_HOST})
    dead = send_back_message(first, "GroupA", max_reconsume_times=1).message
    dead = Message(**{**_fields(dead), "store_host": STORE_HOST})
    return {
        FILES[0]: sched_bytes,
        FILES[1]: placed(timeup, 0, 20480, 1_700_000_031_001),
        FILES[2]: placed(dead, 0, 24576, 1_700_000_002_000),
    }


def _fields(m: Message) -> dict[str, object]:
    return {f: getattr(m, f) for f in Message.__dataclass_fields__}


if __name__ == "__main__":
    for name, data in records().items():
        (GOLDEN / name).write_bytes(data)
        print(f"wrote {GOLDEN / name}")
