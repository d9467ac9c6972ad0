"""The Python twins of the idle workers' futex words (`ipc/native/mqs_futex.c`:
`mqs_idle_sleep`, `mqs_idle_wake`, `mqs_wait_flushed_past`), for one process whose
waits all run out: what each leaves in the control block and what it answers. The
tests compare them with the C on the same bytes (`test_idle_wait_diff.py`); the
wake-ups across threads and processes are `tests/runtime/test_control.py`'s."""

from __future__ import annotations

import struct

from mqstore.ipc import control as c

_U32 = struct.Struct("<I")


def u32(buf: bytearray, off: int) -> int:
    return int(_U32.unpack_from(buf, off)[0])


def idle_sleep_reference(buf: bytearray, pos: int) -> bool:
    """Say it sleeps (IDLE_SLEEPS 1); then whether published_pos is past `pos`."""
    _U32.pack_into(buf, c.OFF_IDLE_SLEEPS, 1)
    return int(c.I64.unpack_from(buf, c.OFF_PUBLISHED)[0]) > pos


def idle_wake_reference(buf: bytearray) -> None:
    """Someone sleeps: take the flag back to 0 and bump IDLE_WAKE (modulo 2^32)."""
    if u32(buf, c.OFF_IDLE_SLEEPS):
        _U32.pack_into(buf, c.OFF_IDLE_SLEEPS, 0)
        _U32.pack_into(buf, c.OFF_IDLE_WAKE, (u32(buf, c.OFF_IDLE_WAKE) + 1) & 0xFFFFFFFF)


def wait_flushed_past_reference(buf: bytearray, pos: int) -> bool:
    """Whether flushed_pos is past `pos`; nothing written (no request, no wake)."""
    return int(c.I64.unpack_from(buf, c.OFF_FLUSHED)[0]) > pos
