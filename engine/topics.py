"""Topic configs: RocketMQ's TopicConfigManager, in `<store>/config/topics.json`.

    {"topicConfigTable": {"orders": {"topicName": "orders", "readQueueNums": 4,
      "writeQueueNums": 4, "perm": 6, "topicFilterType": "SINGLE_TAG",
      "topicSysFlag": 0, "order": false}},
     "dataVersion": {"timestamp": 1700000000000, "counter": 3}}

A topic is created on first use with `default_topic_queue_nums` queues (`ensure_topic`);
`set_queue_nums` changes its count (`mqstore topic DIR set T --queues N`). Producers that
spread puts over queues read the count with `queue_count`, which costs one stat while the
file is unchanged. Writes are locked and atomic (`engine.jsonconfig`); reads take no lock.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Final, NamedTuple

from mqstore.engine import jsonconfig
from mqstore.engine.names import check_topic

FILE_NAME = "topics.json"
PERM_READ_WRITE = 6  # PermName.PERM_READ | PermName.PERM_WRITE
MAX_QUEUE_NUMS = 1024
# RocketMQ's TopicConfig fields: ours by name, then those mqstore always writes the same.
_JSON_KEYS: Final = {
    "topic": "topicName",
    "read_queue_nums": "readQueueNums",
    "write_queue_nums": "writeQueueNums",
    "perm": "perm",
}
_JSON_FIXED: Final = {"topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}


class TopicConfig(NamedTuple):
    """One topic's entry. A `NamedTuple`, not a dataclass: the put path imports this
    module (`QueueCounts`), where a dataclass's decoration is compiled at import."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, name) for name, key in _JSON_KEYS.items()} | _JSON_FIXED

    @classmethod
    def from_json(cls, name: str, d: dict[str, Any]) -> TopicConfig:
        return cls(
            str(d.get("topicName", name)),
            int(d.get("readQueueNums", 0)),
            int(d.get("writeQueueNums", 0)),
            int(d.get("perm", PERM_READ_WRITE)),
        )


def topics_path(store_dir: str | os.PathLike[str]) -> str:
    return jsonconfig.config_path(store_dir, FILE_NAME)


def _bump_version(doc: dict[str, Any]) -> None:
    v = doc.setdefault("dataVersion", {})
    v["timestamp"] = int(time.time() * 1000)
    v["counter"] = int(v.get("counter", 0)) + 1


def load_topics(store_dir: str | os.PathLike[str]) -> dict[str, TopicConfig]:
    """Every topic of the file (none when it does not exist). Raises ValueError."""
    table = jsonconfig.read(topics_path(store_dir)).get("topicConfigTable", {})
    return {name: TopicConfig.from_json(name, d) for name, d in table.items()}


def _check(topic: str, queue_nums: int) -> None:
    check_topic(topic)
    if not 1 <= queue_nums <= MAX_QUEUE_NUMS:
        raise ValueError(f"queue count must be in 1..{MAX_QUEUE_NUMS}, not {queue_nums}")


def ensure_topic(store_dir: str | os.PathLike[str], topic: str, default_nums: int) -> TopicConfig:
    """The topic's config, created with `default_nums` queues when it has none."""
    _check(topic, default_nums)
    known = load_topics(store_dir).get(topic)
    if known is not None:
        return known

    def change(doc: dict[str, Any]) -> bool:
        table = doc.setdefault("topicConfigTable", {})
        if topic in table:
            return False
        table[topic] = TopicConfig(topic, default_nums, default_nums).to_json()
        _bump_version(doc)
        return True

    doc = jsonconfig.update(topics_path(store_dir), change)
    return TopicConfig.from_json(topic, doc["topicConfigTable"][topic])


def set_queue_nums(store_dir: str | os.PathLike[str], topic: str, queue_nums: int) -> TopicConfig:
    """Set the topic's read and write queue counts (creating the topic if needed)."""
    _check(topic, queue_nums)
    cfg = TopicConfig(topic, queue_nums, queue_nums)

    def change(doc: dict[str, Any]) -> bool:
        table = doc.setdefault("topicConfigTable", {})
        old = table.get(topic, {})
        new = {**old, **cfg.to_json(), "perm": int(old.get("perm", PERM_READ_WRITE))}
        if old == new:
            return False
        table[topic] = new
        _bump_version(doc)
        return True

    doc = jsonconfig.update(topics_path(store_dir), change)
    return TopicConfig.from_json(topic, doc["topicConfigTable"][topic])


def queue_ids(store_dir: str | os.PathLike[str], topic: str) -> set[int]:
    """The topic's queues: its configured read queues and those under
    `consumequeue/<topic>/` (empty for a topic with neither)."""
    tc = load_topics(store_dir).get(topic)
    ids = set(range(tc.read_queue_nums)) if tc is not None else set()
    from mqstore.engine.consumequeue_files import topic_queue_ids  # the file layer

    return ids | topic_queue_ids(store_dir, topic)


def remove_topic(store_dir: str | os.PathLike[str], topic: str) -> bool:
    """Take the topic out of the file (`mqstore topic DIR delete T`); False when it had
    no config. Raises StoreIOError, ValueError."""

    removed = False

    def change(doc: dict[str, Any]) -> bool:
        nonlocal removed
        removed = doc.get("topicConfigTable", {}).pop(topic, None) is not None
        if removed:
            _bump_version(doc)
        return removed

    jsonconfig.update(topics_path(store_dir), change)
    return removed


_caches: dict[str, jsonconfig.CachedDoc] = {}
_caches_lock = threading.Lock()


def queue_count(store_dir: str | os.PathLike[str], topic: str, default: int = 4) -> int:
    """The topic's write queue count, `default` when the topic is not configured (or the
    file is unreadable). Cost: one stat while the file is unchanged. Thread-safe."""
    path = topics_path(store_dir)
    with _caches_lock:
        cache = _caches.get(path)
        if cache is None:
            cache = _caches[path] = jsonconfig.CachedDoc(path)
        try:
            d = cache.get().get("topicConfigTable", {}).get(topic)
        except ValueError:
            return default
    if not d:
        return default
    n = int(d.get("writeQueueNums", 0))
    return n if n > 0 else default


class QueueCounts:
    """`queue_count` for a producer's hot path: the file is stat'ed at most once every
    `recheck_s` (so a `mqstore topic set` is seen within that time); between checks a
    lookup is one dict access. Not thread-safe (a client calls it under its own lock)."""

    def __init__(self, store_dir: str | os.PathLike[str], recheck_s: float = 0.1) -> None:
        self._doc = jsonconfig.CachedDoc(topics_path(store_dir))
        self._recheck_s = recheck_s
        self._next_check = 0.0
        self._counts: dict[str, int] = {}

    def get(self, topic: str, default: int) -> int:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self._recheck_s
            try:
                table = self._doc.get().get("topicConfigTable", {})
                self._counts = {name: int(d.get("writeQueueNums", 0)) for name, d in table.items()}
            except (ValueError, AttributeError, TypeError):
                pass  # keep the last good counts
        n = self._counts.get(topic, 0)
        return n if n > 0 else default
