"""Recovery's progress reporter: the file at once, log lines at a bounded rate with the
rate and ETA, the stop it raises, and what `mqstore status` reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mqstore.engine.recovery_progress import (
    PROGRESS_FILE,
    REDISPATCHING,
    VALIDATING,
    ProgressReporter,
    RecoveryInterrupted,
    Step,
    read_progress,
)

MIB = 1 << 20


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_file_at_once_then_a_line_a_second(tmp_path: Path) -> None:
    clock, lines = _Clock(), list[str]()
    rep = ProgressReporter(str(tmp_path), lines.append, clock=clock)
    rep(Step(VALIDATING, 8 * MIB, 1024 * MIB, 8192))
    assert lines == []  # the file says recovery runs; the log waits
    doc = read_progress(str(tmp_path))
    assert doc is not None and (doc["phase"], doc["done_bytes"]) == (VALIDATING, 8 * MIB)
    for k in range(1, 400):  # 400 chunks over 4 s
        clock.t = 100.0 + k / 100
        rep(Step(VALIDATING, 8 * MIB + k * MIB, 1024 * MIB, 8192 * k))
    assert len(lines) == 3, lines  # one a second, however many chunks
    assert lines[-1] == (  # 300 MiB and 299 chunks since the phase began, in 3 s
        "recovery: validating 308 of 1,024 MiB (30%), 2,457,600 records, "
        "816,469 records/s 105 MB/s, ETA 7 s"
    )
    assert "records/s" in lines[-1] and "ETA" in lines[-1]
    clock.t += 0.5
    rep(Step(REDISPATCHING, 0, 1024 * MIB, 0))  # a new phase: its own rate, no line yet
    clock.t += 1.0
    rep(Step(REDISPATCHING, 512 * MIB, 1024 * MIB, 500_000))
    assert lines[-1] == (
        "recovery: re-dispatching 512 of 1,024 MiB (50%), 500,000 records, "
        "500,000 records/s 537 MB/s, ETA 1 s"
    )
    doc = read_progress(str(tmp_path))
    assert doc is not None and doc["records_per_s"] == 500_000 and doc["eta_s"] == 1.0
    rep.close()
    assert read_progress(str(tmp_path)) is None and not (tmp_path / PROGRESS_FILE).exists()


def test_a_stop_request_interrupts_at_the_next_step(tmp_path: Path) -> None:
    stop = [False]
    rep = ProgressReporter(str(tmp_path), print, lambda: stop[0])
    rep(Step(VALIDATING, 1, 2, 1))
    stop[0] = True
    with pytest.raises(RecoveryInterrupted, match="stopped while validating"):
        rep(Step(VALIDATING, 2, 2, 2))


def test_no_store_dir_writes_no_file(tmp_path: Path) -> None:
    rep = ProgressReporter(None, print)
    rep(Step(VALIDATING, 1, 2, 1))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b'{"phase": "validating"}', json.dumps({"phase": 1}).encode()],
)
def test_a_damaged_progress_file_reads_as_none(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / PROGRESS_FILE).write_bytes(raw)
    assert read_progress(str(tmp_path)) is None


def test_a_progress_file_of_wrong_types_reads_as_none(tmp_path: Path) -> None:
    keys = ("done_bytes", "total_bytes", "records", "pid", "records_per_s", "bytes_per_s")
    doc = {"phase": "validating", **{k: "x" for k in keys}}
    (tmp_path / PROGRESS_FILE).write_text(json.dumps(doc))
    assert read_progress(str(tmp_path)) is None
