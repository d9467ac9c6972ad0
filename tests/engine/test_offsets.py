"""Consumer offsets (`engine.offsets`) and topic configs (`engine.topics`): RocketMQ's JSON
forms, concurrent commits from several processes, a crash inside a replace."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore.engine import fileio, topics
from mqstore.engine.offsets import NO_OFFSET, ConsumerOffsets, load_consumer_offsets

REPO = Path(__file__).resolve().parent.parent.parent


def test_commit_and_read_back_in_rocketmq_form(tmp_path: Path) -> None:
    offs = ConsumerOffsets(tmp_path)
    assert offs.committed("g", "T", 0) == NO_OFFSET
    offs.commit("g", "T", 0, 12)
    offs.commit("g", "T", 1, 3)
    offs.commit("h", "U", 0, 7)
    assert offs.committed("g", "T", 0) == 12
    assert ConsumerOffsets(tmp_path).committed("g", "T", 1) == 3
    doc = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
    assert doc == {"offsetTable": {"T@g": {"0": 12, "1": 3}, "U@h": {"0": 7}}}
    # the cleaner reads the same file
    assert load_consumer_offsets(tmp_path) == {"g": {("T", 0): 12, ("T", 1): 3}, "h": {("U", 0): 7}}
    assert offs.table() == {"g": {("T", 0): 12, ("T", 1): 3}, "h": {("U", 0): 7}}


def test_reads_fastjson_unquoted_keys_and_keeps_other_keys(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "consumerOffset.json").write_text(
        '{"offsetTable":{"abc@cg":{0:179,1:5}},"dataVersion":{"counter":2}}'
    )
    offs = ConsumerOffsets(tmp_path)
    assert offs.committed("cg", "abc", 0) == 179
    offs.commit("cg", "abc", 1, 6)
    doc = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
    assert doc["offsetTable"]["abc@cg"] == {"0": 179, "1": 6}
    assert doc["dataVersion"] == {"counter": 2}


@pytest.mark.parametrize("bad", [("", "T", 0, 1), ("g@x", "T", 0, 1), ("g", "T", -1, 1)])
def test_bad_entries_are_refused(tmp_path: Path, bad: tuple[str, str, int, int]) -> None:
    with pytest.raises(ValueError):
        ConsumerOffsets(tmp_path).commit(*bad)


def test_a_failed_replace_leaves_the_old_file(tmp_path: Path) -> None:
    offs = ConsumerOffsets(tmp_path)
    offs.commit("g", "T", 0, 1)
    fileio.set_fault("rename", lambda: OSError(errno.EIO, "injected EIO in rename"))
    try:
        with pytest.raises(fileio.StoreIOError):
            offs.commit("g", "T", 0, 2)
    finally:
        fileio.clear_faults()
    assert ConsumerOffsets(tmp_path).committed("g", "T", 0) == 1
    offs.commit("g", "T", 0, 3)
    assert ConsumerOffsets(tmp_path).committed("g", "T", 0) == 3


_CHILD = """
import sys
from mqstore.engine.offsets import ConsumerOffsets
offs = ConsumerOffsets(sys.argv[1])
q = int(sys.argv[2])
for i in range(1, 31):
    offs.commit("g", "T", q, i)
"""


def test_commits_from_several_processes_lose_nothing(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(q)], cwd=REPO)
        for q in range(6)
    ]
    assert [p.wait(120) for p in procs] == [0] * 6
    offs = ConsumerOffsets(tmp_path)
    assert {q: offs.committed("g", "T", q) for q in range(6)} == {q: 30 for q in range(6)}


def test_topics_created_set_and_counted(tmp_path: Path) -> None:
    assert topics.queue_count(tmp_path, "T", default=4) == 4
    cfg = topics.ensure_topic(tmp_path, "T", 4)
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (4, 4, 6)
    assert topics.ensure_topic(tmp_path, "T", 8).write_queue_nums == 4  # exists: unchanged
    topics.set_queue_nums(tmp_path, "T", 2)
    assert topics.queue_count(tmp_path, "T") == 2
    topics.set_queue_nums(tmp_path, "T", 6)
    assert topics.queue_count(tmp_path, "T") == 6  # the cache follows the file
    doc = json.loads((tmp_path / "config" / "topics.json").read_text())
    t = doc["topicConfigTable"]["T"]
    assert (t["topicName"], t["readQueueNums"], t["writeQueueNums"], t["perm"]) == ("T", 6, 6, 6)
    assert doc["dataVersion"]["counter"] == 3
    with pytest.raises(ValueError):
        topics.set_queue_nums(tmp_path, "T", 0)


def test_queue_counts_for_the_hot_path(tmp_path: Path) -> None:
    counts = topics.QueueCounts(tmp_path, recheck_s=0.0)
    assert counts.get("T", 4) == 4
    topics.set_queue_nums(tmp_path, "T", 2)
    assert counts.get("T", 4) == 2
    (tmp_path / "config" / "topics.json").write_text("not json")
    assert counts.get("T", 4) == 2  # a broken file keeps the last good counts
    slow = topics.QueueCounts(tmp_path, recheck_s=3600.0)
    assert slow.get("T", 4) == 4  # first look: the broken file gives nothing
