"""The Python twin of `_native.fetch_or` and `fetch_and_not` (`ipc/native/mqs_control_py.c`):
the plain read-modify-write of one int64 word, for the differential test only
(`test_word_bits_diff.py`). In production it is the bug the C fixes: another process's
change between the load and the store is lost (`tests/runtime/test_flags_atomic.py`)."""

from __future__ import annotations

from mqstore.ipc import control as c


def fetch_or_reference(buf: bytearray, offset: int, bits: int) -> int:
    """Set `bits` in the int64 word at `offset`; the word before."""
    was = int(c.I64.unpack_from(buf, offset)[0])
    c.I64.pack_into(buf, offset, was | bits)
    return was


def fetch_and_not_reference(buf: bytearray, offset: int, bits: int) -> int:
    """Clear `bits` in the int64 word at `offset`; the word before."""
    was = int(c.I64.unpack_from(buf, offset)[0])
    c.I64.pack_into(buf, offset, was & ~bits)
    return was
