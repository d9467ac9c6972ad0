"""The C encoder against the reference (`engine.record.encode`), byte for byte.

Hypothesis draws whole messages: topics of 1 to 127 UTF-8 bytes in any script,
properties that the reference accepts, bodies from empty to large, every flag and
sys-flag bit, IPv4 and IPv6 hosts, and the three appender fields anywhere in range.
"""

from __future__ import annotations

import ipaddress
import random
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import _native
from mqstore.engine import record, recordcodes
from mqstore.engine.record import EncodeStatus, Message

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)


def _utf8_within(limit: int) -> st.SearchStrategy[str]:
    return st.text(min_size=1, max_size=limit).filter(lambda s: 0 < len(s.encode()) <= limit)


_prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=40,
)
_hosts = st.builds(
    lambda ip, port: f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}",
    st.ip_addresses(),
    I32,
)
_bodies = st.one_of(
    st.binary(max_size=2048),
    st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 300_000), st.integers(0, 255)),
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    return Message(
        topic=draw(_utf8_within(127)),
        body=draw(_bodies),
        properties=draw(st.dictionaries(_prop_text, _prop_text, max_size=6)),
        queue_id=draw(st.integers(0, 2**31 - 1)),
        flag=draw(I32),
        sys_flag=draw(I32),
        born_timestamp=draw(I64),
        born_host=draw(_hosts),
        store_host=draw(_hosts),
        reconsume_times=draw(I32),
        prepared_transaction_offset=draw(I64),
    )


def c_encode(msg: Message, qo: int = 0, po: int = 0, sts: int = 0) -> bytes:
    born_addr, born_port, _ = recordcodes.parse_host(msg.born_host)
    store_addr, store_port, _ = recordcodes.parse_host(msg.store_host)
    return _native.encode(
        msg.topic.encode(),
        msg.body,
        record.encode_properties(msg.properties),
        queue_id=msg.queue_id,
        flag=msg.flag,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_addr=born_addr,
        born_port=born_port,
        store_addr=store_addr,
        store_port=store_port,
        reconsume_times=msg.reconsume_times,
        prepared_offset=msg.prepared_transaction_offset,
        queue_offset=qo,
        physical_offset=po,
        store_timestamp=sts,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), I64, I64, I64)
def test_c_encoder_equals_the_reference(msg: Message, qo: int, po: int, sts: int) -> None:
    ref = record.encode(msg, max_message_size=max(len(msg.body), 1))
    if ref.status is not EncodeStatus.OK:  # e.g. properties over 32767 bytes
        assert ref.status is EncodeStatus.PROPERTIES_SIZE_EXCEEDED, ref.reason
        return
    expected = bytearray(len(ref.data))
    record.patch_append_fields(expected, 0, ref, qo, po, sts)
    got = c_encode(msg, qo, po, sts)
    assert got == bytes(expected), f"first difference at byte {_first_diff(got, expected)}"


def _first_diff(a: bytes, b: bytes | bytearray) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_ipv6_hosts_set_the_sys_flag_bits() -> None:
    msg = Message("t", b"x", born_host="[::1]:5", store_host="[2001:db8::7]:10911", sys_flag=0)
    got = c_encode(msg)
    assert got == record.encode(msg).data
    assert int.from_bytes(got[36:40], "big") == 0x30
    assert got[48:64] == ipaddress.ip_address("::1").packed


@given(st.binary(max_size=5000), st.integers(0, 15), st.integers(0, 2**32 - 1))
@settings(max_examples=300, deadline=None)
def test_crc32_equals_zlib_unaligned(data: bytes, skip: int, start: int) -> None:
    view = memoryview(data)[min(skip, len(data)) :]
    assert _native.crc32(view, start) == zlib.crc32(view, start)
    assert _native.crc32_slice8(view) == zlib.crc32(view)


def test_crc32_of_nothing_and_large_inputs() -> None:
    assert _native.crc32(b"") == 0 == zlib.crc32(b"")
    big = bytes(range(256)) * 4099
    assert _native.crc32(big) == zlib.crc32(big)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"queue_id": "1"}, TypeError, "queue_id must be int"),
        ({"queue_id": 2**31}, ValueError, "queue_id is out of the signed 32-bit range"),
        ({"born_addr": b"\x01\x02\x03", "born_port": 1}, ValueError, "born_addr must be 4"),
        ({"store_addr": b"\x7f\0\0\x01"}, TypeError, "store_addr and store_port go together"),
        ({"store_timestamp": 2**63}, ValueError, "store_timestamp is out of the signed 64"),
    ],
)
def test_bad_arguments_name_the_parameter(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        _native.encode(b"t", b"body", b"", **kwargs)  # type: ignore[arg-type]


def test_a_body_that_is_not_bytes_like_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="body must be a bytes-like object"):
        _native.encode(b"t", "text", b"")  # type: ignore[arg-type]


def test_crc32_equals_zlib_at_every_length_around_the_fold_widths() -> None:
    """Every length through the 16-, 64- and 256-byte folds (PCLMULQDQ, VPCLMULQDQ when
    the CPU has it) and their tails, at odd alignments."""
    data = random.Random(12).randbytes(1300)
    for n in range(1200):
        for skip in (0, 3):
            view = memoryview(data)[skip : skip + n]
            assert _native.crc32(view, n) == zlib.crc32(view, n), (n, skip)
