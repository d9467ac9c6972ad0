"""Locking a mapping's pages in RAM (mlock / munlock through libc), for the warm-up.

Python's `mmap` offers no mlock; this calls libc's through ctypes. A refusal
(RLIMIT_MEMLOCK, often 8 MiB) is an expected outcome, returned as a reason, never
raised: a warmed segment that stays unlocked still works. Caller: `Segment.warm`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os


def set_locked(mm: mmap.mmap, length: int, *, locked: bool) -> str:
    """mlock (`locked`) or munlock the first `length` bytes of `mm`; "" when done, else
    why not. O(length) for mlock (it faults every page in)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return "no libc"
    libc = ctypes.CDLL(libc_name, use_errno=True)
    cbuf = (ctypes.c_char * length).from_buffer(mm)
    addr = ctypes.addressof(cbuf)
    del cbuf  # drop the export at once, or the mapping could not be closed
    fn = libc.mlock if locked else libc.munlock
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    if fn(ctypes.c_void_p(addr), ctypes.c_size_t(length)) != 0:
        return f"{'mlock' if locked else 'munlock'} failed: {os.strerror(ctypes.get_errno())}"
    return ""
