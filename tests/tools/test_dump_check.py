"""`mqstore dump` and `mqstore check` on the real RocketMQ stores and on stores mqstore wrote.

The real stores are copied first; the tests also prove the tools never write a byte.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mqstore.engine.checkpoint import CheckpointFields
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.record import Message
from mqstore.engine.recordcodes import make_msg_id
from mqstore.ipc.client import StoreClient
from mqstore.workers.cli import main
from tests.runtime.harness import Store

StoreCopy = Callable[[str], Path]
BROKER_CONFS = Path(__file__).resolve().parent.parent / "data" / "broker-conf"
DUMP_KEYS = [
    "physical_offset", "size", "magic", "body_crc", "crc_ok", "queue_id", "flag",
    "queue_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
    "store_host", "reconsume_times", "prepared_transaction_offset", "topic", "body",
    "body_encoding", "compression", "properties", "tags", "keys", "msg_id",
]  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _dump(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    code, out, err = _run(capsys, "dump", *argv)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def _body(r: dict[str, Any]) -> bytes:
    """The body bytes of one printed record, decoded as its `body_encoding` says."""
    enc, text = r["body_encoding"], str(r["body"])
    if enc == "text":
        return text.encode("utf-8")
    return base64.b64decode(text, validate=True) if enc == "base64" else bytes.fromhex(text)


def _fingerprint(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _assert_chain(recs: list[dict[str, Any]], segment_size: int) -> None:
    """Offsets rise; each record starts where the previous ended or at a segment start."""
    for a, b in itertools.pairwise(recs):
        end = int(a["physical_offset"]) + int(a["size"])
        start = int(b["physical_offset"])
        assert start == end or (start % segment_size == 0 and start > end), (a, b)


def test_dump_42_unit_store_every_record_as_rocketmq_reads_it(
    real_store_copy: StoreCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    store = real_store_copy("broker-4.2-unit-store")
    before = _fingerprint(store)
    recs = _dump(capsys, str(store), "--config", str(BROKER_CONFS / "broker-4.2-unit-store.conf"))
    assert _fingerprint(store) == before
    assert len(recs) == 179
    assert all(list(r) == DUMP_KEYS for r in recs)
    assert {r["topic"] for r in recs} == {"abc"}
    assert {r["queue_id"] for r in recs} == {0}
    assert [r["queue_offset"] for r in recs] == list(range(179))
    assert all(r["crc_ok"] and r["magic"] == "0xdaa320a7" for r in recs)
    _assert_chain(recs, 8192)
    # records of the fourth segment start right after the BLANK-ended third
    assert sum(1 for r in recs if int(r["physical_offset"]) >= 3 * 8192) == 38
    for r in recs:
        host, port = str(r["store_host"]).rsplit(":", 1)
        addr = bytes(int(x) for x in host.split("."))
        assert r["msg_id"] == make_msg_id(addr, int(port), int(r["physical_offset"]))
        assert r["body"] and r["body_encoding"] in ("text", "base64")  # bodies are present


def test_dump_49_commitlog_and_rust_store(
    real_store_copy: StoreCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    recs49 = _dump(capsys, str(real_store_copy("broker-4.9-commitlog")))
    assert len(recs49) == 47
    assert {r["size"] for r in recs49} == {172}
    assert recs49[-1]["physical_offset"] == 46 * 172
    rust = real_store_copy("rocketmq-rust-0.9-store")
    recs = _dump(capsys, str(rust), "--config", str(BROKER_CONFS / "rocketmq-rust-0.9-store.conf"))
    assert [(r["physical_offset"], r["size"]) for r in recs] == [(0, 141), (141, 141)]
    assert all(r["topic"] == "V1UpgradeTopic" and r["born_timestamp"] == 0 for r in recs)
    assert recs[0]["keys"] == "v1-upgrade-key"
    assert recs[0]["properties"] == {"KEYS": "v1-upgrade-key"}
    assert recs[0]["store_host"] == "127.0.0.1:10911"


def test_dump_from_offset_and_limit(
    real_store_copy: StoreCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(real_store_copy("broker-4.9-commitlog"))
    recs = _dump(capsys, store, "--from-offset", str(10 * 172), "--limit", "3")
    assert [r["physical_offset"] for r in recs] == [1720, 1892, 2064]
    assert _dump(capsys, store, "--limit", "0") == []
    code, out, err = _run(capsys, "dump", store, "--from-offset", "5")
    assert (code, out) == (1, "")
    assert "no record starts at offset 5" in err
    code, _, err = _run(capsys, "dump", store, "--limit", "-1")
    assert code == 2 and "--limit" in err


def test_check_passes_the_real_stores_and_reports_the_empty_trailing_file(
    real_store_copy: StoreCopy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("broker-4.2-unit-store", "broker-4.9-commitlog", "rocketmq-rust-0.9-store"):
        store = real_store_copy(name)
        before = _fingerprint(store)
        code, out, err = _run(
            capsys, "check", str(store), "--config", str(BROKER_CONFS / f"{name}.conf")
        )
        assert code == 0, out + err
        assert _fingerprint(store) == before
        assert not [line for line in out.splitlines() if line.startswith("ERROR")]
    store42 = str(tmp_path / "broker-4.2-unit-store")
    code, out, _ = _run(capsys, "check", store42, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True
    assert doc["summary"]["records"] == 179
    assert doc["summary"]["segment_size_bytes"] == 8192
    warnings = [f for f in doc["findings"] if f["severity"] == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0]["file"].endswith("commitlog/00000000000000032768")
    assert "empty" in warnings[0]["what"]
    assert any("abort" in f["what"] for f in doc["findings"])
    code, _, _ = _run(capsys, "check", store42, "--strict")
    assert code == 1


def _write_store(root: Path, n: int = 30) -> list[Message]:
    msgs = [
        Message(
            f"T{i % 3}",
            os.urandom(40 + i),
            {"TAGS": f"tag{i % 2}", "KEYS": f"k{i} shared", "UNIQ_KEY": f"U{i:04d}"},
            queue_id=i % 2,
            born_timestamp=1_700_000_000_000 + i,
            born_host="10.1.2.3:4567",
            store_host="10.9.8.7:10911",
        )
        for i in range(n)
    ]
    log = CommitLog.open(root / "commitlog", 2048)
    for m in msgs:
        assert log.append(m).ok
    log.flush(0)
    log.close()
    return msgs


def test_dump_of_a_store_mqstore_wrote_gives_back_every_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    msgs = _write_store(tmp_path)
    recs = _dump(capsys, str(tmp_path))
    assert len(recs) == len(msgs)
    _assert_chain(recs, 2048)
    for m, r in zip(msgs, recs, strict=True):
        assert r["topic"] == m.topic and _body(r) == m.body
        assert r["properties"] == dict(m.properties)
        assert r["tags"] == m.properties["TAGS"] and r["keys"] == m.properties["KEYS"]
        assert r["born_host"] == "10.1.2.3:4567" and r["store_host"] == "10.9.8.7:10911"
    code, out, _ = _run(capsys, "check", str(tmp_path))
    assert code == 0, out
    assert out.splitlines()[-1].startswith(f"ok: {len(msgs)} records")


def test_check_finds_a_flipped_body_byte_and_names_offset_and_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_store(tmp_path)
    recs = _dump(capsys, str(tmp_path))
    victim = recs[5]
    seg = tmp_path / "commitlog" / f"{0:020d}"
    pos = int(victim["physical_offset"]) + int(victim["size"]) - 60
    data = bytearray(seg.read_bytes())
    data[pos] ^= 0xFF
    seg.write_bytes(bytes(data))
    code, out, _ = _run(capsys, "check", str(tmp_path))
    assert code == 1
    errors = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert errors and f"offset {victim['physical_offset']}" in errors[0]
    assert str(seg) in errors[0]
    # dump still prints what it can read, flagging the bad CRC
    again = _dump(capsys, str(tmp_path))
    assert [r["crc_ok"] for r in again].count(False) == 1


def test_check_finds_a_dirty_tail_and_a_checkpoint_ahead_of_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    msgs = _write_store(tmp_path, n=5)
    recs = _dump(capsys, str(tmp_path))
    end = int(recs[-1]["physical_offset"]) + int(recs[-1]["size"])
    seg = tmp_path / "commitlog" / f"{0:020d}"
    with seg.open("r+b") as f:
        f.seek(end)
        f.write(b"\x00\x00\x01\x00garbage")
    last_ts = int(recs[-1]["store_timestamp"])
    (tmp_path / "checkpoint").write_bytes(
        CheckpointFields(physic_msg_timestamp=last_ts + 60_000).to_bytes().ljust(4096, b"\0")
    )
    code, out, _ = _run(capsys, "check", str(tmp_path))
    assert code == 1
    assert f"ERROR   offset {end}" in out
    assert "checkpoint says messages stored up to" in out
    assert len(msgs) == 5


def test_wrong_configured_geometry_and_not_a_store(
    real_store_copy: StoreCopy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = real_store_copy("broker-4.9-commitlog")
    conf = tmp_path / "wrong.conf"
    conf.write_text("mappedFileSizeCommitLog=4096\n")
    code, out, _ = _run(capsys, "check", str(store), "--config", str(conf))
    assert code == 1
    assert "the configured segment size is 4096" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = _run(capsys, "check", str(empty))
    assert code == 2 and "not a store" in err
    code, _, err = _run(capsys, "dump", str(tmp_path / "missing"))
    assert code == 2 and "not a directory" in err


def test_console_script_dump_piped_to_head_exits_cleanly(real_store_copy: StoreCopy) -> None:
    store = real_store_copy("broker-4.2-unit-store")
    proc = subprocess.run(
        f"{sys.executable} -m mqstore dump {store} | head -n 2",
        shell=True, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["queue_offset"] == 1
    assert "Traceback" not in proc.stderr


def test_make_run_engine_demo_writes_a_store_that_checks_out(tmp_path: Path) -> None:
    store = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable, "-m", "mqstore.workers.demo_run", str(store),
            "--engine", "--messages", "500",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wrote 500 messages" in proc.stdout
    assert "ok: 500 records" in proc.stdout
    assert len(list((store / "commitlog").iterdir())) >= 2  # it rolled


def test_check_of_a_running_store_says_it_is_running(store: Store) -> None:
    """It said "the last run did not shut down cleanly" of the running store's `abort`."""
    with StoreClient.attach(store.path) as c:
        assert all(c.put("live", b"m%d" % i).ok for i in range(3))
    pid = store.status()["supervisor_pid"]
    out = subprocess.run(
        [sys.executable, "-m", "mqstore", "check", str(store.path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"the store is running (supervisor pid {pid})" in out.stdout
    assert "did not shut down cleanly" not in out.stdout
    assert "3 records" in out.stdout


def test_dump_prints_null_properties_for_a_record_without_any(tmp_path: Path) -> None:
    """RocketMQ's MessageDecoder leaves the properties of such a record null; dump
    printed `{}`."""
    log = CommitLog.open(tmp_path / "commitlog", 4096)
    for m in (Message("bare", b"no properties"), Message("tagged", b"x", {"TAGS": "a"})):
        assert log.append(m).ok
    log.flush(0)
    log.close()
    out = subprocess.run(
        [sys.executable, "-m", "mqstore", "dump", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    bare, tagged = out.stdout.splitlines()
    assert '"properties": null' in bare
    assert json.loads(bare)["properties"] is None and json.loads(bare)["tags"] is None
    assert json.loads(tagged)["properties"] == {"TAGS": "a"}
