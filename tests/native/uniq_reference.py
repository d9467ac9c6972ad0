"""The Python reference of the client message ids and their stamp (`ipc/native/mqs_uniq.c`):
RocketMQ's MessageClientIDSetter (createUniqID, getIPFromID, getNearlyTimeFromID's span),
with the C generator's two rules on top (the time never goes back; at most 65536 ids
per ms), and where a put's UNIQ_KEY goes in its properties. test_uniq_diff.py compares
the C code with it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final

UNIQ: Final = "UNIQ_KEY"


def month_bounds(ms: int) -> tuple[int, int]:
    """setStartTime: the local month's first ms and the next month's."""
    t = time.localtime(ms // 1000)
    start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    year, mon = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    nxt = time.mktime((year, mon, 1, 0, 0, 0, 0, 0, -1))
    return int(start) * 1000, int(nxt) * 1000


@dataclass
class IdsRef:
    ip: bytes
    pid: int
    hash: int
    now_ms: int
    counter: int = 0
    diff: int = -1
    in_diff: int = 0
    start: int = field(init=False)
    next_month: int = field(init=False)

    def __post_init__(self) -> None:
        self._set_start(self.now_ms)

    def _set_start(self, ms: int) -> None:
        self.start, self.next_month = month_bounds(ms)
        self.diff, self.in_diff = -1, 0

    @property
    def producer(self) -> bytes:
        return self.ip + (self.pid & 0xFFFF).to_bytes(2, "big") + self.hash.to_bytes(4, "big")

    def next(self, now_ms: int) -> str:
        if now_ms >= self.next_month:
            self._set_start(now_ms)
        diff = now_ms - self.start
        diff = max(diff, 0)  # the clock went back over the month's start
        diff = max(diff, self.diff)
        if diff == self.diff and self.in_diff >= 65536:
            diff += 1
        if diff != self.diff:
            self.diff, self.in_diff = diff, 0
        self.in_diff += 1
        n = self.counter & 0xFFFF
        self.counter += 1
        raw = self.producer + (diff & 0xFFFFFFFF).to_bytes(4, "big") + n.to_bytes(2, "big")
        return raw.hex().upper()


def parse(key: str) -> tuple[str, int, int, int, int]:
    """(IPv4 as getIPStrFromID, pid short, hash, ms since the month began, counter)."""
    b = bytes.fromhex(key)
    return (
        ".".join(str(x) for x in b[:4]),
        int.from_bytes(b[4:6], "big"),
        int.from_bytes(b[6:10], "big"),
        int.from_bytes(b[10:14], "big"),
        int.from_bytes(b[14:16], "big"),
    )


def stamped(props: dict[str, str], key: str) -> dict[str, str]:
    """The properties a put stores: the caller's UNIQ_KEY kept, else `key` appended last."""
    if UNIQ in props:
        return props
    return {**props, UNIQ: key}


class WindowRef:
    """The idempotence table's answer for a few producers (no row is evicted while fewer
    than 8 put): each remembers its last `window` puts; a retry of one of them answers
    its first result, any other put is stored and remembered."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.rows: dict[str, list[tuple[str, Any]]] = {}

    def put(self, key: str) -> Any | None:
        """The first result of `key` while remembered (a retry), else None."""
        for k, result in self.rows.get(key[:20], []):
            if k == key:
                return result
        return None

    def stored(self, key: str, result: Any) -> None:
        ring = self.rows.setdefault(key[:20], [])
        ring.append((key, result))
        del ring[: -self.window]
