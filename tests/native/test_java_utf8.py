"""A record's text as the JDK decodes it: RocketMQ's `MessageDecoder` reads a topic and the
properties with `new String(bytes, UTF_8)`, and the consume queue's tags code and the
index's key hashes are `String.hashCode` of what that gives. A Java process (the JDK's
own decoder, compiled here with `javac`) answers for Hypothesis-drawn bytes (invalid
UTF-8 among them, encoded surrogates ED A0..BF especially, where Python's "replace"
differs: one U+FFFD per byte against Java's one), and mqstore's readers must agree:
`recordcodes.decode_utf8` and `java_string_hash`, the C scanner's tags code and key
hashes, the C pull's topic and property values.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mqstore.engine import indexfile, pull, record, recordcodes
from mqstore.engine.record import Message
from mqstore.engine.record_decode import RecordFields
from mqstore.engine.scan import scan_records
from tests.engine.scanlog import to_v2

# One hex line of bytes in; the UTF-16 units (hex) of `new String(bytes, UTF_8)` and
# their `hashCode()` out, a line each.
_JAVA = """
import java.io.*;
import java.nio.charset.StandardCharsets;

public class JavaUtf8 {
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), false);
        for (String hex; (hex = in.readLine()) != null; ) {
            byte[] b = new byte[hex.length() / 2];
            for (int i = 0; i < b.length; i++)
                b[i] = (byte) Integer.parseInt(hex.substring(2 * i, 2 * i + 2), 16);
            String s = new String(b, StandardCharsets.UTF_8);
            StringBuilder units = new StringBuilder("u");
            for (int i = 0; i < s.length(); i++)
                units.append(String.format("%04x", (int) s.charAt(i)));
            out.println(units + " " + s.hashCode());
            out.flush();
        }
    }
}
"""


class Jdk:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def decode(self, raw: bytes) -> tuple[str, int]:
        """(the str, its hashCode) as Java has them."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(raw.hex() + "\n")
        self.proc.stdin.flush()
        units, h = self.proc.stdout.readline().split()
        return bytes.fromhex(units[1:]).decode("utf-16-be", "surrogatepass"), int(h)


@pytest.fixture(scope="module")
def jdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jdk]:
    javac, java = shutil.which("javac"), shutil.which("java")
    assert javac and java, "the tests need a JDK (Java 17), as `make test` does"
    d: Path = tmp_path_factory.mktemp("jdk")
    (d / "JavaUtf8.java").write_text(_JAVA)
    subprocess.run([javac, "-d", str(d), str(d / "JavaUtf8.java")], check=True)
    proc = subprocess.Popen(
        [java, "-cp", str(d), "JavaUtf8"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield Jdk(proc)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()


# Pieces around the encoded surrogates (ED A0..BF, a continuation byte or not after it),
# other invalid and valid sequences; joined, and cut anywhere by st.binary.
_pieces = st.sampled_from([
    b"a", b"\xed", b"\xed\xa0", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\x9f\xbf", b"\xed\xb2",
    b"\x80", b"\xa0", b"\xbf", b"\xc2\xa9", b"\xe2\x82\xac", b"\xe2\x82", b"\xf0\x9f\x98\x80",
    b"\xf0\x9f", b"\xf4\x90\x80\x80", b"\xe0\x80", b"\xc0\xaf", b"\xff", b"\xee",
])  # fmt: skip
_values = st.one_of(
    st.lists(_pieces, min_size=1, max_size=8).map(b"".join),
    st.binary(min_size=1, max_size=24),
)


def _record(value: bytes) -> bytes:
    """One V2 record of topic "T" with TAGS and KEYS `value` (raw bytes), placed at 0."""
    props = b"TAGS\x01" + value + b"\x02KEYS\x01" + value + b"\x02"
    data = bytearray(to_v2(record.encode(Message("T", b"", {})).data))
    data[-2:] = struct.pack(">h", len(props)) + props
    struct.pack_into(">i", data, 0, len(data))
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(value=_values)
def test_readers_decode_and_hash_a_records_text_as_the_jdk_does(jdk: Jdk, value: bytes) -> None:
    value = value.replace(b"\x01", b"").replace(b"\x02", b"").replace(b" ", b"") or b"x"
    text, h = jdk.decode(value)
    assert recordcodes.decode_utf8(value) == text
    assert recordcodes.java_string_hash(text) == h
    assert record.decode_properties(b"TAGS\x01" + value) == {"TAGS": text}

    data = _record(value)
    scan = scan_records(data, 0, -1)  # the C scanner: its own hash over the bytes
    assert scan.count == 1 and scan.tags_code[0] == h
    _, key_h = jdk.decode(b"T#" + value)
    want_key = 0 if key_h == -(2**31) else abs(key_h)
    assert list(scan.key_hash) == [indexfile.key_hash(indexfile.build_key("T", text))]
    assert list(scan.key_hash) == [want_key]

    out: list[RecordFields] = []  # the C pull's builder: its own decoding
    unit = struct.pack(">qiq", 0, len(data), 0)
    pull.pull_units(unit, 0, data, 0, len(data), None, None, 1, len(data), 0, False, out)
    assert len(out) == 1
    assert out[0].properties == {"TAGS": text, "KEYS": text}


@settings(max_examples=100, deadline=None)
@given(topic=_values)
def test_a_topic_of_any_bytes_reads_as_the_jdk_decodes_it(jdk: Jdk, topic: bytes) -> None:
    topic = topic[:127]
    text, _ = jdk.decode(topic)
    data = _record(b"x")
    # V2, IPv4 hosts, no body: the 2-byte topic length at 88, then the topic "T"
    v2b = bytearray(data[:88] + struct.pack(">h", len(topic)) + topic + data[91:])
    struct.pack_into(">i", v2b, 0, len(v2b))
    header = record.check_record(bytes(v2b), 0, check_crc=True)
    assert header.topic == text
    out: list[RecordFields] = []
    unit = struct.pack(">qiq", 0, len(v2b), 0)
    pull.pull_units(unit, 0, bytes(v2b), 0, len(v2b), None, None, 1, len(v2b), 0, False, out)
    assert len(out) == 1 and out[0].topic == text


def _string2message_properties(s: str) -> dict[str, str]:
    """RocketMQ's `MessageDecoder.string2messageProperties`, over the str Java decoded."""
    out: dict[str, str] = {}
    index = 0
    while index < len(s):
        new_index = s.find("\x02", index)
        if new_index < 0:
            new_index = len(s)
        if new_index - index >= 3:
            kv = s.find("\x01", index)
            if index < kv < new_index - 1:
                out[s[index:kv]] = s[kv + 1 : new_index]
        index = new_index + 1
    return out


_prop_bytes = st.lists(
    st.one_of(_values, st.sampled_from([b"\x01", b"\x02", b" ", b"TAGS\x01", b"KEYS\x01"])),
    max_size=12,
).map(b"".join)


@settings(max_examples=200, deadline=None)
@given(props=_prop_bytes)
def test_properties_split_after_decoding_as_java_splits_them(jdk: Jdk, props: bytes) -> None:
    """Java decodes the whole properties, then splits on 0x02 and 0x01 (and KEYS on
    spaces); mqstore's readers split the bytes first: the same pairs, keys and hashes.
    Properties ending in a zero byte are left out: check_record takes them for a write
    torn at their end (a RocketMQ 4.9.x value ending in U+0000 reads so too)."""
    assume(not props.endswith(b"\x00"))
    text, _ = jdk.decode(props)
    want = _string2message_properties(text)
    assert record.decode_properties(props) == want
    data = bytearray(to_v2(record.encode(Message("T", b"", {})).data))
    data[-2:] = struct.pack(">h", len(props)) + props
    struct.pack_into(">i", data, 0, len(data))
    out: list[RecordFields] = []
    unit = struct.pack(">qiq", 0, len(data), 0)
    pull.pull_units(unit, 0, bytes(data), 0, len(data), None, None, 1, len(data), 0, False, out)
    assert len(out) == 1 and (out[0].properties or {}) == want
    scan = scan_records(bytes(data), 0, -1)
    assert scan.count == 1
    tags = want.get("TAGS")
    assert scan.tags_code[0] == (recordcodes.java_string_hash(tags) if tags else 0)
    keys = [k for k in want.get("KEYS", "").split(" ") if k]  # Java: keys.split(" ")
    want_hashes = []
    for k in keys:
        _, h = jdk.decode(("T#" + k).encode("utf-8", "surrogatepass"))
        want_hashes.append(0 if h == -(2**31) else abs(h))
    assert list(scan.key_hash) == want_hashes
