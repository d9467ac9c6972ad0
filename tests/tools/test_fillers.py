"""A stopped store holding fillers, read by everything that reads a log: `mqstore recover`
and the dispatcher (which must build the same queues), `mqstore check`, `mqstore get`,
`StoreReader` and the pipeline's plain reader. None of them may serve a filler as a
message, and all of them must serve a record that merely looks like one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mqstore.conf.load import load_settings
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.filler import FILLER_FLAG, write_filler
from mqstore.engine.reader import Geometry, StoreReader
from mqstore.engine.record import Message
from mqstore.pipeline import plain
from mqstore.workers.cli import main
from tests.engine.storebuild import CQ_FILE, ENTRIES, SEGMENT, SLOTS, message, open_log

CONFIG = f"""[store]
segment_size_bytes = {SEGMENT}
consume_queue_file_size_bytes = {CQ_FILE}
max_hash_slot_num = {SLOTS}
max_index_num = {ENTRIES}
"""


def _fill(store: Path, physical_offset: int, size: int, queue_offset: int, ts: int) -> None:
    """Overwrite a dead put's record with a filler, as the publisher (`ipc.commit`) does."""
    path = store / "commitlog" / f"{0:020d}"
    buf = bytearray(path.read_bytes())
    write_filler(buf, physical_offset, size, "T", 0, queue_offset, physical_offset, ts)
    path.write_bytes(buf)


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """Queue T/0: 0 a message, 1 a filler, 2 a look-alike (filler flag, born time 0, a
    key), 3 a filler too small for its marker property, 4 a message. No queues yet."""
    d = tmp_path / "store"
    d.mkdir()
    (d / "mqstore.toml").write_text(CONFIG)
    log = open_log(d)
    first = log.append(message(0))
    dead = log.append(message(1))
    look_alike = log.append(Message("T", b"real", {"KEYS": "alike"}, flag=FILLER_FLAG))
    dead_small = log.append(Message("T", b""))  # no room for MQSTORE_FILLER=1
    last = log.append(message(4))
    assert all(r.ok for r in (first, dead, look_alike, dead_small, last))
    log.queue.flush_all()
    log.close()
    for r in (dead, dead_small):
        _fill(d, r.wrote_offset, r.wrote_bytes, r.queue_offset, r.store_timestamp)
    offsets = {
        "first": first.wrote_offset,
        "filler": dead.wrote_offset,
        "look_alike": look_alike.wrote_offset,
        "small_filler": dead_small.wrote_offset,
        "last": last.wrote_offset,
        "end": last.wrote_offset + last.wrote_bytes,
    }
    return d, offsets


def _units(store: Path) -> list[tuple[int, int | None]]:
    """Queue T/0 as (queue offset, physical offset or None for a pre-blank)."""
    cqs = ConsumeQueueStore(store, CQ_FILE, read_only=True).load()
    try:
        cq = cqs.get("T", 0)
        assert cq is not None
        return [(qo, None if u.is_pre_blank else u.physical_offset) for qo, u in cq.units(0, 99)]
    finally:
        cqs.close()


def _dispatch(store: Path, end: int) -> None:
    """What the dispatcher process does (`workers.dispatcher.main`), to the end."""
    settings = load_settings(store).settings
    disp = Dispatcher.open(store, Geometry.of(store, settings))
    try:
        res = disp.dispatch(disp.resume_offset(), end)
        assert res.next_offset == end, res
        disp.queues.flush_all()
        assert disp.index is not None
        disp.index.flush()
    finally:
        disp.close()


def test_recovery_and_the_dispatcher_build_the_same_queues(
    store: tuple[Path, dict[str, int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, off = store
    other = tmp_path / "dispatched"
    shutil.copytree(d, other)
    assert main(["recover", str(d)]) == 0
    capsys.readouterr()
    _dispatch(other, off["end"])
    # a filler keeps its queue offset, as a pre-blank; the look-alike is a message
    want = [(0, off["first"]), (1, None), (2, off["look_alike"]), (3, None), (4, off["last"])]
    for built in (d, other):
        assert _units(built) == want
        with StoreReader.open(built, load_settings(built).settings) as r:
            g = r.get_messages("T", 0, 0, 10)
            assert [m.physical_offset for m in g.messages] == [
                off["first"],
                off["look_alike"],
                off["last"],
            ]
            assert [m.physical_offset for m in r.query_by_key("T", "alike")] == [off["look_alike"]]
            assert r.get_by_offset(off["filler"]) is None
            assert r.get_by_offset(off["small_filler"]) is None
            assert r.get_by_offset(off["look_alike"]) is not None


def test_get_serves_no_filler(
    store: tuple[Path, dict[str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    d, off = store
    assert main(["recover", str(d)]) == 0
    capsys.readouterr()
    assert main(["get", str(d), "--physical-offset", str(off["filler"])]) == 1
    assert main(["get", str(d), "--physical-offset", str(off["look_alike"])]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == "alike"
    assert (
        main(["get", str(d), "--topic", "T", "--queue", "0", "--offset", "0", "--limit", "9"]) == 0
    )
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["queue_offset"] for r in got] == [0, 2, 4]


def test_check_counts_fillers_apart(
    store: tuple[Path, dict[str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    d, _off = store
    assert main(["check", str(d), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert (summary["records"], summary["fillers"]) == (5, 2)
    assert main(["check", str(d)]) == 0
    assert "5 records (2 fillers)" in capsys.readouterr().out


def test_the_plain_reader_skips_fillers(store: tuple[Path, dict[str, int]]) -> None:
    d, off = store
    got = [r.physical_offset for r in plain.iter_records(d)]
    assert got == [off["first"], off["look_alike"], off["last"]]
