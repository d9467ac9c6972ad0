"""The filler rule (`engine.filler.is_filler`): every filler the publisher can write is one,
decided alike from a decoded record and from a header read without its body (the
dispatcher's view); records that only look like one are messages."""

from __future__ import annotations

import pytest

from mqstore.engine import record as rec
from mqstore.engine.filler import FILLER_FLAG, FILLER_PROPERTY, filler_record, is_filler


def _both(data: bytes) -> tuple[bool, bool]:
    """The verdict on the decoded record and on its header without the body."""
    header = rec.check_record(data, 0, check_crc=False, read_body=False)
    assert header.status is rec.CheckStatus.OK, header.reason
    return is_filler(rec.decode(data, 0)), is_filler(header)


@pytest.mark.parametrize("topic", ["T", "orders", "tópico", "x" * 127])
def test_every_filler_size_is_a_filler_from_the_header_too(topic: str) -> None:
    smallest = rec.record_length(0, len(topic.encode()), 0)
    marker = len(rec.encode_properties({FILLER_PROPERTY: "1"}))
    for size in range(smallest, smallest + marker + 40):
        data = filler_record(size, topic, 3).data
        assert len(data) == size
        assert _both(data) == (True, True), size


def _encoded(**kw: object) -> bytes:
    fields: dict[str, object] = {"topic": "T", "body": b"payload", "queue_id": 0}
    fields.update(kw)
    enc = rec.encode(rec.Message(**fields))  # type: ignore[arg-type]
    assert enc.status is rec.EncodeStatus.OK, enc.reason
    return enc.data


@pytest.mark.parametrize(
    "fields",
    [
        {},  # a plain message
        {"flag": FILLER_FLAG, "born_timestamp": 1_700_000_000_000},  # a producer's clock
        {"flag": FILLER_FLAG, "properties": {"KEYS": "k1"}},
        {"flag": FILLER_FLAG, "properties": {FILLER_PROPERTY: "1", "KEYS": "k1"}},
        {"flag": FILLER_FLAG, "properties": {FILLER_PROPERTY: "yes"}},
        {"flag": FILLER_FLAG + 1, "properties": {FILLER_PROPERTY: "1"}},
    ],
)
def test_records_that_only_look_like_a_filler_are_messages(fields: dict[str, object]) -> None:
    assert _both(_encoded(**fields)) == (False, False)


def test_the_flag_and_born_time_without_properties_is_a_filler_whatever_the_body() -> None:
    # a header carries no body, so the rule cannot look at it: readers and the
    # dispatcher must not disagree about such a record
    assert _both(_encoded(flag=FILLER_FLAG, body=b"not zeros")) == (True, True)
