"""Deleted topics: `<store>/config/deletedTopics.json` (mqstore's own file).

    {"deletedTopics": {"orders": 7340032}}

`mqstore topic DIR delete T` removes T's consume queues, but the commit log is append
only: T's records stay in it until retention removes their segments. Without a record of
the deletion, the next start would dispatch them again (the dispatcher resumes from the
queues' highest offset, which is lower once T's queues are gone, and abnormal recovery
re-dispatches from the checkpoint) and T's queues would come back, partly. So the
deletion writes T's *end offset*, the log's exact end when it was deleted; the dispatcher
skips every record of T below it (consume queues and index alike) and dispatches T's
records at or past it, those put after the deletion, as a new topic from queue offset 0.

Written while no supervisor runs (`delete_topic`'s caller holds the store lock), or, on
a running store, by its dispatcher (`workers.topic_delete`), which serves the requests
`request` leaves in `config/deleteTopicRequest.json`; read by the dispatcher when it opens
and after each deletion it serves. Locked and atomic as the other config files.

    {"id": 3, "topic": "orders", "done": false}                  (a pending request)
    {"id": 3, "topic": "orders", "done": true, "end_offset": 7340032,
     "queue_files": 4, "offsets_removed": 2, "was_configured": true}
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from mqstore.engine import fileio, jsonconfig, topics
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.consumequeue_files import CONSUME_QUEUE_DIR
from mqstore.engine.logwalk import ScanStop
from mqstore.engine.names import check_topic
from mqstore.engine.offsets import ConsumerOffsets

FILE_NAME = "deletedTopics.json"
REQUEST_FILE = "deleteTopicRequest.json"
TRASH_PREFIX = ".mqstore-deleting-"


def path(store_dir: str | os.PathLike[str]) -> str:
    return jsonconfig.config_path(store_dir, FILE_NAME)


def load(store_dir: str | os.PathLike[str]) -> dict[str, int]:
    """{topic: end offset} of every deleted topic ({} when none). Raises ValueError."""
    table = jsonconfig.read(path(store_dir)).get("deletedTopics", {})
    return {str(t): int(end) for t, end in table.items()}


def add(store_dir: str | os.PathLike[str], topic: str, end_offset: int) -> None:
    """Record that `topic`'s records below `end_offset` are deleted (durable on return;
    a later deletion of the same topic moves its end forward, never back)."""
    if end_offset < 0:
        raise ValueError(f"end offset must be >= 0, not {end_offset}")

    def change(doc: dict[str, Any]) -> bool:
        table = doc.setdefault("deletedTopics", {})
        if int(table.get(topic, -1)) >= end_offset:
            return False
        table[topic] = end_offset
        return True

    jsonconfig.update(path(store_dir), change)


@dataclass(frozen=True, slots=True)
class DeletedTopic:
    topic: str
    end_offset: int  # the log's end: T's records below it stay out of the queues
    queue_files: int  # consume-queue files removed
    was_configured: bool  # it had an entry in config/topics.json
    offsets_removed: int  # (group, queue) committed offsets forgotten


def delete_topic(
    store_dir: str | os.PathLike[str], topic: str, segment_size_bytes: int
) -> DeletedTopic:
    """Delete `topic` from a stopped store: record its end offset, then remove its
    consume queues, its config and every group's offsets of it. The caller holds the
    store lock and has checked that the last run stopped cleanly (no `abort`), so the
    log's end is where the next start appends.

    Each step is durable before the next; a crash in between leaves a state in which the
    topic's queues may still be read, and calling it again finishes the job. Cost: a scan
    of the whole commit log (headers only) to find its end. Raises ValueError (a topic
    that is no safe directory name, a corrupt log), StoreIOError."""
    d = os.fspath(store_dir)
    check_topic(topic)
    log = CommitLog.open(os.path.join(d, "commitlog"), segment_size_bytes, read_only=True)
    try:
        sc = log.scan(check_crc=False, read_body=False)
        for _ in sc:
            pass
    finally:
        log.close()
    if sc.stop is ScanStop.CORRUPT:
        raise ValueError(
            f"the commit log has a corrupt record at {sc.end_offset} ({sc.reason}): "
            "run `mqstore check` and `mqstore recover` first"
        )
    add(d, topic, sc.end_offset)
    files = _remove_queues(d, topic)
    was_configured = topics.remove_topic(d, topic)
    gone = ConsumerOffsets(d).delete(None, topic)
    return DeletedTopic(topic, sc.end_offset, files, was_configured, gone)


def _remove_queues(store_dir: str, topic: str) -> int:
    """Move `consumequeue/<topic>` out of the queues in one rename (readers and the next
    start see all of it or none), then delete it. Returns the files deleted."""
    trash = move_queues_aside(store_dir, topic)
    return 0 if trash is None else purge(store_dir, trash)


def move_queues_aside(store_dir: str | os.PathLike[str], topic: str) -> str | None:
    """Rename `consumequeue/<topic>` out of the queues, durably (one rename: readers and
    the next start see all of it or none); the trash directory, None when it had none."""
    d = os.fspath(store_dir)
    src = os.path.join(d, CONSUME_QUEUE_DIR, topic)
    if not os.path.isdir(src):
        return None
    trash = os.path.join(d, f"{TRASH_PREFIX}{topic}-{time.time_ns()}")
    fileio.rename(src, trash)
    fileio.fsync_dir(os.path.join(d, CONSUME_QUEUE_DIR))
    return trash


def purge(store_dir: str | os.PathLike[str], trash: str) -> int:
    """Delete a directory `move_queues_aside` made; the files deleted."""
    n = 0
    for q in os.listdir(trash):
        qdir = os.path.join(trash, q)
        for name in os.listdir(qdir):
            fileio.unlink(os.path.join(qdir, name))
            n += 1
        os.rmdir(qdir)
    os.rmdir(trash)
    fileio.fsync_dir(store_dir)
    return n


# --- deleting a topic of a running store: a request its dispatcher serves ---------------


def request_path(store_dir: str | os.PathLike[str]) -> str:
    return jsonconfig.config_path(store_dir, REQUEST_FILE)


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    topic: str
    done: bool
    result: DeletedTopic | None  # once done


def read_request(store_dir: str | os.PathLike[str]) -> Request | None:
    """The last request (None when there never was one). Raises ValueError for a file
    that is not one (the dispatcher then serves nothing and says why)."""
    doc = jsonconfig.read(request_path(store_dir))
    if not doc:
        return None
    rid, topic, done = doc.get("id"), doc.get("topic"), doc.get("done")
    if type(rid) is not int or rid < 1 or not isinstance(topic, str) or type(done) is not bool:
        raise ValueError(f"{request_path(store_dir)}: not a topic deletion request: {doc!r:.200}")
    check_topic(topic)
    result = None
    if done:
        fields = ("end_offset", "queue_files", "offsets_removed")
        vals = [doc.get(k) for k in fields]
        ints = [v for v in vals if type(v) is int]
        if len(ints) != len(fields):
            raise ValueError(f"{request_path(store_dir)}: a done request without its result")
        result = DeletedTopic(topic, ints[0], ints[1], bool(doc.get("was_configured")), ints[2])
    return Request(rid, topic, done, result)


def request(store_dir: str | os.PathLike[str], topic: str) -> int:
    """Ask the running store's dispatcher to delete `topic`: the request's id. Raises
    ValueError for a topic that is no safe name, or while another request is pending
    (one at a time)."""
    check_topic(topic)
    got = 0

    def change(doc: dict[str, Any]) -> bool:
        nonlocal got
        if doc and not doc.get("done", True):
            raise ValueError(
                f"the deletion of topic {doc.get('topic')!r} is still in progress; "
                "wait for it, then try again"
            )
        prev = doc.get("id", 0)
        got = (prev if type(prev) is int and prev > 0 else 0) + 1
        doc.clear()
        doc.update(id=got, topic=topic, done=False)
        return True

    jsonconfig.update(request_path(store_dir), change)
    return got


def finish_request(store_dir: str | os.PathLike[str], rid: int, done: DeletedTopic) -> None:
    """Mark request `rid` done with its result (durable)."""

    def change(doc: dict[str, Any]) -> bool:
        if doc.get("id") != rid:
            return False
        doc.update(
            done=True, end_offset=done.end_offset, queue_files=done.queue_files,
            offsets_removed=done.offsets_removed, was_configured=done.was_configured,
        )  # fmt: skip
        return True

    jsonconfig.update(request_path(store_dir), change)
