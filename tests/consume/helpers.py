"""Helpers of the consume suite: producer processes, pulling a whole queue."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mqstore.engine.record import DecodedRecord
from mqstore.ipc.read_results import GetMessageStatus
from mqstore.ipc.reads import ClientReads
from tests.runtime.harness import REPO


def start_producer(store: Path, topic: str, name: str, n: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.consume.producer", str(store), topic, name, str(n)],
        stdout=subprocess.PIPE, text=True, cwd=str(REPO), env=env,
    )  # fmt: skip
    assert p.stdout is not None
    # Byte by byte from the descriptor: a buffered readline() would also take ack lines
    # printed right after "ready", and communicate(timeout=...) reads the descriptor, not
    # that buffer, so those acks were lost (1-5 of 750, about one run in ten).
    line = b""
    while not line.endswith(b"\n"):
        ch = os.read(p.stdout.fileno(), 1)
        if not ch:
            break
        line += ch
    assert line == b"ready\n", line
    return p


def acked(out: str) -> list[tuple[int, int, int, str]]:
    """(queue_id, queue_offset, physical_offset, body) of every complete ack line."""
    got = []
    for line in out.splitlines(keepends=True):
        parts = line.split()
        if not line.endswith("\n") or len(parts) != 4 or parts[0] == "failed":
            continue
        got.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
    return got


def pull_all(reads: ClientReads, topic: str, queue_id: int, start: int = 0) -> list[DecodedRecord]:
    """Every message of the queue from `start` up to what is pullable now."""
    out: list[DecodedRecord] = []
    offset = start
    while True:
        r = reads.pull(topic, queue_id, offset, 32)
        if r.status is not GetMessageStatus.FOUND:
            assert r.status in (
                GetMessageStatus.OFFSET_OVERFLOW_ONE,
                GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
            ), r
            return out
        out.extend(r.messages)
        offset = r.next_offset
