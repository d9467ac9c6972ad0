"""Consumer offsets: RocketMQ's ConsumerOffsetManager, in `<store>/config/consumerOffset.json`.

    {"offsetTable": {"orders@billing": {"0": 12, "1": 3}}}

The key is `topic@group` and the value maps a queue id to the next queue offset the group
will consume (what RocketMQ's consumers commit). The cleaner reads the same file through
`load_consumer_offsets`, which tells a missing or unreadable file (None) from an empty one.

Safe across processes and crashes (`engine.jsonconfig`): every commit takes the file's
lock, re-reads, changes one entry and replaces the file durably (fsync before it returns),
so a commit that returned survives kill -9 and power loss; two processes committing for
different queues never lose each other's entries. Cost of a commit: a few ms (two fsyncs);
commit a batch with `commit_many`. A read is a stat, plus a parse when the file changed.
Thread-safe for commits; one `ConsumerOffsets` per thread for reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from mqstore.engine import jsonconfig
from mqstore.engine.names import check_group, check_topic

FILE_NAME = "consumerOffset.json"
NO_OFFSET = -1  # RocketMQ's queryOffset answer for a queue the group never committed

# group -> (topic, queue id) -> the next queue offset the group will consume
ConsumedOffsets = Mapping[str, Mapping[tuple[str, int], int]]


def table_key(topic: str, group: str) -> str:
    return f"{topic}@{group}"


def group_table(doc: dict[str, Any]) -> dict[str, dict[tuple[str, int], int]]:
    """{group: {(topic, queue_id): offset}} of a parsed file. Raises ValueError,
    AttributeError or TypeError for a table of the wrong shape."""
    out: dict[str, dict[tuple[str, int], int]] = {}
    for key, queues in doc.get("offsetTable", {}).items():
        topic, _, group = str(key).rpartition("@")
        for qid, off in queues.items():
            out.setdefault(group, {})[(topic, int(qid))] = int(off)
    return out


def load_consumer_offsets(store_dir: str | os.PathLike[str]) -> ConsumedOffsets | None:
    """The committed offsets as `ConsumerOffsets.table()` gives them, read once without
    a cache (fastjson's unquoted queue ids accepted). None when the file is missing,
    empty or unreadable; the cleaner then reports unconsumed bytes as unknown."""
    try:
        with open(jsonconfig.config_path(store_dir, FILE_NAME), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    try:
        return group_table(jsonconfig.parse(text)) if text.strip() else None
    except (ValueError, AttributeError, TypeError):
        return None


class ConsumerOffsets:
    """The committed offsets of every group of one store."""

    def __init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.path = jsonconfig.config_path(store_dir, FILE_NAME)
        self._cache = jsonconfig.CachedDoc(self.path)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Persist `offset` as the group's next offset in (topic, queue_id). Raises
        StoreIOError, ValueError (a group or topic outside RocketMQ's name rule,
        `engine.names`; a negative queue id or offset; a file that is not JSON)."""
        self.commit_many(group, [(topic, queue_id, offset)])

    def commit_many(self, group: str, entries: Iterable[tuple[str, int, int]]) -> None:
        """Several (topic, queue_id, offset) of one group in one durable replace."""
        todo = list(entries)
        check_group(group)
        for topic, queue_id, offset in todo:
            check_topic(topic)
            if queue_id < 0 or offset < 0:
                raise ValueError(f"bad offset entry {(topic, queue_id, offset)!r}")

        def change(doc: dict[str, Any]) -> bool:
            table = doc.setdefault("offsetTable", {})
            changed = False
            for topic, queue_id, offset in todo:
                queues = table.setdefault(table_key(topic, group), {})
                if queues.get(str(queue_id)) != offset:
                    queues[str(queue_id)] = int(offset)
                    changed = True
            return changed

        if todo:
            jsonconfig.update(self.path, change)

    def delete(self, group: str | None, topic: str | None = None) -> int:
        """Forget committed offsets, durably: the group's for `topic` (every topic when
        None), or with `group=None` every group's for `topic` (`mqstore topic delete`).
        Returns how many (topic, queue) entries went. Raises StoreIOError, ValueError."""
        if group is None and topic is None:
            raise ValueError("delete needs a group, a topic or both")
        gone = 0

        def change(doc: dict[str, Any]) -> bool:
            nonlocal gone
            table = doc.get("offsetTable", {})
            for key in list(table):
                t, _, g = str(key).rpartition("@")
                if (group is None or g == group) and (topic is None or t == topic):
                    gone += len(table.pop(key))
            return gone > 0

        jsonconfig.update(self.path, change)
        return gone

    def committed(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset in (topic, queue_id); NO_OFFSET (-1) if none."""
        queues = self._cache.get().get("offsetTable", {}).get(table_key(topic, group), {})
        got = queues.get(str(queue_id))
        return NO_OFFSET if got is None else int(got)

    def table(self) -> dict[str, dict[tuple[str, int], int]]:
        """{group: {(topic, queue_id): offset}} for every group."""
        return group_table(self._cache.get())
