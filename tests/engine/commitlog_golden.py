"""Builds the small golden commit log (`tests/data/golden/commitlog-small.bin`).

Two 1024-byte segments: three records and a BLANK in the first (the fourth record does
not fit), the fourth record and zeros in the second. Run as a module to rewrite the
golden file after a deliberate format change:

    python -m tests.engine.commitlog_golden
"""

from __future__ import annotations

from pathlib import Path

from mqstore.engine.commitlog import AppendResult, CommitLog
from mqstore.engine.record import Message, SysFlag

SEGMENT_SIZE_BYTES = 1024
GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "commitlog-small.bin"
FIRST_STORE_TS = 1_700_000_000_100


class StepClock:
    """Starts at FIRST_STORE_TS and moves 1 ms per reading."""

    def __init__(self) -> None:
        self.ms = FIRST_STORE_TS - 1

    def __call__(self) -> int:
        self.ms += 1
        return self.ms


def golden_messages() -> list[Message]:
    common = {
        "born_timestamp": 1_700_000_000_000,
        "born_host": "192.168.0.10:50000",
        "store_host": "192.168.0.1:10911",
    }
    return [
        Message("GoldenTopic", b"a" * 150, {"TAGS": "TagA", "KEYS": "k0"}, queue_id=0, **common),  # type: ignore[arg-type]
        Message("GoldenTopic", b"b" * 170, {"TAGS": "TagB"}, queue_id=1, flag=7, **common),  # type: ignore[arg-type]
        Message(
            "GoldenTopic",
            b"c" * 160,
            {"TAGS": "TagA"},
            sys_flag=SysFlag.TRANSACTION_PREPARED,
            **common,  # type: ignore[arg-type]
        ),
        Message("OtherTopic", b"d" * 300, {}, queue_id=0, reconsume_times=2, **common),  # type: ignore[arg-type]
    ]


def build(directory: Path) -> tuple[CommitLog, list[AppendResult]]:
    log = CommitLog.open(directory, SEGMENT_SIZE_BYTES, clock_ms=StepClock())
    results = [log.append(m) for m in golden_messages()]
    return log, results


def segment_bytes(directory: Path) -> bytes:
    files = sorted(p for p in directory.iterdir() if p.name.isdigit())
    return b"".join(p.read_bytes() for p in files)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log, _ = build(Path(tmp))
        log.close()
        GOLDEN.write_bytes(segment_bytes(Path(tmp)))
    print(f"wrote {GOLDEN}")
