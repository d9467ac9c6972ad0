"""`mqstore recover` and `mqstore get`: offline recovery under the store lock, its report,
and reads by queue offset, id, physical offset, key and time, printed as dump prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mqstore.engine.recovery import read_report
from mqstore.ipc.locks import take_store_lock
from mqstore.workers.cli import main

StoreCopy = Callable[[str], Path]


def _lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_recover_then_get(real_store_copy: StoreCopy, capsys: pytest.CaptureFixture[str]) -> None:
    d = real_store_copy("broker-4.2-unit-store")
    assert main(["recover", str(d), "--dry-run"]) == 0
    assert "dry run" in capsys.readouterr().out
    assert (d / "abort").exists() and not (d / "recovery.json").exists()
    assert main(["recover", str(d), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "abnormal" and report["records_redispatched"] == 123
    assert not (d / "abort").exists()
    kept = read_report(d)
    assert kept is not None and kept.queue_offsets == {"abc/0": 179}

    assert (
        main(["get", str(d), "--topic", "abc", "--queue", "0", "--offset", "170", "--limit", "5"])
        == 0
    )
    got = _lines(capsys.readouterr().out)
    assert [r["queue_offset"] for r in got] == [170, 171, 172, 173, 174]
    msg_id = str(got[0]["msg_id"])
    assert main(["get", str(d), "--msg-id", msg_id]) == 0
    assert _lines(capsys.readouterr().out)[0]["queue_offset"] == 170
    assert main(["get", str(d), "--physical-offset", str(got[1]["physical_offset"])]) == 0
    assert _lines(capsys.readouterr().out)[0]["queue_offset"] == 171
    ts = got[2]["store_timestamp"]
    assert main(["get", str(d), "--topic", "abc", "--queue", "0", "--time", str(ts)]) == 0
    assert _lines(capsys.readouterr().out)[0]["store_timestamp"] == ts
    assert main(["get", str(d), "--topic", "abc", "--queue", "0", "--offset", "179"]) == 1
    assert "OFFSET_OVERFLOW_ONE" in capsys.readouterr().err
    assert main(["get", str(d), "--topic", "abc"]) == 2


def test_get_by_key_on_the_rust_store(
    real_store_copy: StoreCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    d = real_store_copy("rocketmq-rust-0.9-store")
    args = ["get", str(d), "--topic", "V1UpgradeTopic", "--key", "v1-upgrade-key", "--limit", "9"]
    assert main(args) == 0
    assert [r["physical_offset"] for r in _lines(capsys.readouterr().out)] == [0, 141]
    assert main(["get", str(d), "--topic", "V1UpgradeTopic", "--key", "nope"]) == 1


def test_recover_refuses_a_locked_store(
    real_store_copy: StoreCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    d = real_store_copy("rocketmq-rust-0.9-store")
    fd = take_store_lock(str(d))
    try:
        assert main(["recover", str(d)]) == 2
        assert "locked" in capsys.readouterr().err
        assert main(["recover", str(d), "--dry-run"]) == 2
    finally:
        os.close(fd)
    assert main(["recover", str(d)]) == 0


def test_recover_rejects_a_non_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recover", str(tmp_path)]) == 2
    assert "not a store" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["ZZZ", "0A00", "0A 00 00 01 00 00 2A 9F 00 00 00 00 00 00 00 AC"])
def test_get_by_a_malformed_msg_id_says_what_an_id_looks_like(
    real_store_copy: StoreCopy, bad: str
) -> None:
    """It printed Python's own `fromhex()` error ("non-hexadecimal number found ...")."""
    d = real_store_copy("broker-4.2-unit-store")
    out = subprocess.run(
        [sys.executable, "-m", "mqstore", "get", str(d), "--msg-id", bad],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.startswith(f"mqstore get: bad message id {bad!r}: a message id is 32 hex")
    assert "0A00000100002A9F00000000000000AC" in out.stderr  # an example
    assert "fromhex" not in out.stderr and "non-hexadecimal" not in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_get_by_time_alone_says_it_needs_a_topic_and_queue(
    real_store_copy: StoreCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal listed `--time` as enough on its own; a time is looked up in one queue."""
    d = real_store_copy("broker-4.2-unit-store")
    assert main(["get", str(d), "--time", "1700000000000"]) == 2
    err = capsys.readouterr().err
    assert "or --topic and --queue with --offset or --time" in err, err
    assert "--uniq-key, --time or" not in err
