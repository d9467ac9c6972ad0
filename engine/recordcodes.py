"""Values computed from record fields: the tags code, the delivery time of a delayed
message, hosts as strings, and message ids (spec §1.2, §3.2).

The record layout itself is `engine.record`'s; what is here needs nothing of it:

- `decode_utf8` (Java's `new String(bytes, UTF_8)`, which RocketMQ's `MessageDecoder`
  reads a record's topic and properties with), `java_string_hash` (Java's
  `String.hashCode`) and `tags_code`, the consume-queue tag code of a TAGS value;
  `delivery_time_ms`, the schedule topic's tag code;
- `parse_host` / `format_host`: `ip:port` (IPv6 `[ip]:port`) to and from the address
  bytes and port the record stores;
- `make_msg_id` / `parse_msg_id`: RocketMQ's offset message id (store host and
  physical offset, upper-case hex).
"""

from __future__ import annotations

import codecs
import operator
import socket
import struct
from typing import Final

# RocketMQ's default messageDelayLevel, in milliseconds per level 1..18.
DELAY_LEVEL_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip

# 31^k mod 2^32 for k = _POW_N - 1 .. 0: an ASCII hash is one dot product (in C, through
# map and sum) with the last len(s) of them, instead of a Python loop per character.
_POW_N: Final = 256
_POW_DESC: Final = [pow(31, _POW_N - 1 - i, 1 << 32) for i in range(_POW_N)]
_mul: Final = operator.mul


def _java_replace(e: UnicodeError) -> tuple[str, int]:
    """The U+FFFD and where decoding goes on, for one malformed part, as Java's decoder
    does: Python's "replace" and Java agree (one U+FFFD per maximal invalid subpart) but
    on an encoded surrogate, ED A0..BF: Python gives one U+FFFD per byte, Java one for
    the lead, that byte and a continuation byte after them if there is one (JDK 8-21
    `String.decodeUTF8` / `UTF_8.Decoder`: `isSurrogate` after a 3-byte read,
    `malformed3` of 2, or the end of input). The tags code and the index hashes of such a
    value are Java's hash of what Java decodes."""
    if not isinstance(e, UnicodeDecodeError):
        raise e
    b, at = e.object, e.start
    if b[at] == 0xED and at + 1 < len(b) and 0xA0 <= b[at + 1] <= 0xBF:
        return "\ufffd", at + 3 if at + 2 < len(b) and 0x80 <= b[at + 2] <= 0xBF else at + 2
    return "\ufffd", e.end


JAVA_UTF8_ERRORS: Final = "mqstore.java-replace"
codecs.register_error(JAVA_UTF8_ERRORS, _java_replace)


def decode_utf8(raw: bytes) -> str:
    """Java's `new String(raw, UTF_8)`: `raw.decode("utf-8", "replace")` but for an
    encoded surrogate (`_java_replace`). Costs nothing more on valid UTF-8 (the handler
    runs only at a malformed part)."""
    return raw.decode("utf-8", JAVA_UTF8_ERRORS)


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode()` as a signed 32-bit int (over UTF-16 code units)."""
    h = 0
    if s.isascii():
        data = s.encode("ascii")
        n = len(data)
        if n <= _POW_N:
            h = sum(map(_mul, data, _POW_DESC[_POW_N - n :])) & 0xFFFFFFFF
        else:
            for ch in data:
                h = (31 * h + ch) & 0xFFFFFFFF
    else:
        units = s.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def tags_code(tags: str | None) -> int:
    """The consume-queue tag code of a `TAGS` value: its Java hash, 0 when absent or empty."""
    if not tags:
        return 0
    code = _TAG_CODES.get(tags)
    if code is None:
        code = java_string_hash(tags)
        if len(_TAG_CODES) >= 4096:
            _TAG_CODES.clear()
        _TAG_CODES[tags] = code
    return code


_TAG_CODES: dict[str, int] = {}  # tags repeat: their codes, cached (bounded)


def delivery_time_ms(
    store_timestamp: int, delay_level: int, delay_ms: tuple[int, ...] = DELAY_LEVEL_MS
) -> int:
    """The schedule topic's tag code: store time plus the level's delay (spec §3.2) by
    the store's delay table `delay_ms` (its `message_delay_level`, ms per level 1..N),
    the level capped at N: `ScheduleMessageService.computeDeliverTimestamp` after
    `checkMessageAndReturnSize`'s cap at `getMaxDelayLevel`."""
    level = min(delay_level, len(delay_ms))
    if 1 <= level <= len(delay_ms):
        return store_timestamp + delay_ms[level - 1]
    return store_timestamp + 1000


def parse_host(host: str) -> tuple[bytes, int, bool]:
    """`"1.2.3.4:10911"` or `"[::1]:10911"` -> (address bytes, port, is_v6).

    Raises ValueError naming what is wrong.
    """
    if host.startswith("["):
        end = host.find("]")
        if end < 0 or host[end + 1 : end + 2] != ":":
            raise ValueError(f"bad host {host!r}: expected [ipv6]:port")
        addr_s, port_s = host[1:end], host[end + 2 :]
    else:
        addr_s, sep, port_s = host.rpartition(":")
        if not sep:
            raise ValueError(f"bad host {host!r}: expected ip:port")
    try:
        packed, v6 = _ip_packed(addr_s)
        port = int(port_s)
    except ValueError as e:
        raise ValueError(f"bad host {host!r}: {e}") from None
    if not -(2**31) <= port < 2**31:
        raise ValueError(f"bad host {host!r}: port out of range")
    return packed, port, v6


def _ip_packed(addr_s: str) -> tuple[bytes, bool]:
    """(address bytes, is_v6) of `addr_s`, as `ipaddress.ip_address(addr_s)` gives them.

    An address written as `inet_ntop` writes it back is read by `inet_pton`: that spelling
    is one `ipaddress` reads to the same bytes. Any other (a zone, leading zeros, an
    error to word) goes to `ipaddress`, imported only then: its import was ~7M
    instructions of every producer's start, which parses the store's own host at attach
    (bench/results/client_start.md)."""
    family = socket.AF_INET6 if ":" in addr_s else socket.AF_INET
    try:
        packed = socket.inet_pton(family, addr_s)
    except (OSError, ValueError):  # ValueError: an embedded NUL
        packed = b""
    if packed and socket.inet_ntop(family, packed) == addr_s:
        return packed, family == socket.AF_INET6
    import ipaddress

    addr = ipaddress.ip_address(addr_s)
    return addr.packed, addr.version == 6


def format_host(addr: bytes, port: int) -> str:
    """Inverse of `parse_host`: `ip:port`, IPv6 as `[ip]:port` (`ipaddress`'s spelling;
    an IPv4 address's is `inet_ntop`'s)."""
    if len(addr) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, bytes(addr))}:{port}"
    import ipaddress

    ip = ipaddress.ip_address(bytes(addr))
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def make_msg_id(store_addr: bytes, store_port: int, physical_offset: int) -> str:
    """RocketMQ's message id: hex of store address, port (int) and physical offset (long)."""
    return (bytes(store_addr) + struct.pack(">iq", store_port, physical_offset)).hex().upper()


def parse_msg_id(msg_id: str) -> tuple[bytes, int, int]:
    """Inverse of `make_msg_id` -> (store address, port, physical offset). Raises
    ValueError saying what a message id looks like."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raw = b""
    if len(raw) not in (16, 28) or len(msg_id) != 2 * len(raw):
        raise ValueError(
            f"bad message id {msg_id!r}: a message id is 32 hex digits (the store host's "
            "IPv4 address, port and the record's commit-log offset, as "
            f"{make_msg_id(bytes([10, 0, 0, 1]), 10911, 172)}), or 56 for an IPv6 store host"
        )
    port, offset = struct.unpack_from(">iq", raw, len(raw) - 12)
    return raw[:-12], port, offset
