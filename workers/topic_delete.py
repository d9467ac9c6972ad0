"""Deleting a topic while the store runs (issue 25, item 5): the dispatcher's part.

`mqstore topic DIR delete T` on a running store leaves a request in
`config/deleteTopicRequest.json` (`engine.deleted_topics.request`) and waits for it to
be done. The dispatcher, the only writer of consume queues, serves it between two of its
rounds, when no unit is being written and its flush thread has no job out:

1. under the reservation lock (the producers' serialising step; held for two small
   durable writes): the deletion's end offset is the log's reserved end, so every record
   of T reserved before it is below it and every later one at or past it; the end is
   recorded (`config/deletedTopics.json`, durable), T's consume-queue directory renamed
   out of the queues (durable), and T's rows of the queue table set back to queue
   offset 0. The rows stay where they are, so clients that cached them keep writing to
   the right rows: their next put to T takes queue offset 0 of a new queue;
2. the dispatcher forgets T's queues and skips T's records below the end from now on
   (records of T still on their way, reserved before the deletion, never reach a
   queue or the index); T's records at or past the end make the new topic;
3. the renamed files are deleted, T's entry in `config/topics.json` and every group's
   committed offsets of T removed, the request marked done with its result, and the
   control block's `topics_deleted` counter bumped: readers (`ipc.reads`) drop their
   cached queues of deleted topics when it moves, so a reader that had T's old queue
   mapped never serves a deleted message from it.

Nothing else is touched: other topics' queues, the index files (T's keys stay in them;
lookups skip T's records below the end, `engine.reader`), the commit log (T's records
stay until retention removes their segments).

A dispatcher killed in the middle serves the request again when it restarts (each step
is durable and can be done twice; the end is taken again, so a put to T that raced the
unfinished deletion may be deleted with it). A request file that is not one is said
once and left alone.
"""

from __future__ import annotations

import os
from typing import Final

from mqstore import _native
from mqstore.engine import deleted_topics, topics
from mqstore.engine.deleted_topics import DeletedTopic
from mqstore.engine.dispatch import Dispatcher
from mqstore.engine.offsets import ConsumerOffsets
from mqstore.ipc.control_views import DispatchStats, Positions
from mqstore.workers.base import WorkerContext, say

LOCK_TIMEOUT_NS: Final = 200_000_000  # then the next tick tries again
# How often the request file is looked at (one stat): every tick was about 1,200 stats a
# second under sync puts; a request is served at most this much later.
REQUEST_CHECK_S: Final = 0.1


class TopicDeletions:
    """Serves the deletion requests of a running store; `check()` every tick (it looks
    at the request file every REQUEST_CHECK_S)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._path = deleted_topics.request_path(ctx.store_dir)
        self._seen: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) served
        self._bad = ""
        self._next_check = 0.0  # monotonic time of the next look at the request file

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def check(self, disp: Dispatcher, flush_busy: bool, now: float) -> str:
        """Serve a pending request, if any and if the flush thread is idle (else at a
        later look): the topic deleted, "" when none. Looks at most every
        REQUEST_CHECK_S (`now`: monotonic seconds); one stat() when nothing changed."""
        if now < self._next_check:
            return ""
        self._next_check = now + REQUEST_CHECK_S
        stamp = self._stamp()
        if stamp is None or stamp == self._seen or flush_busy:
            return ""
        try:
            req = deleted_topics.read_request(self._ctx.store_dir)
        except ValueError as e:
            if str(e) != self._bad:
                self._bad = str(e)
                say("dispatcher", f"topic deletion request refused: {e}", "WARNING")
            self._seen = stamp
            return ""
        if req is None or req.done:
            self._seen = stamp
            return ""
        try:
            done = self._delete(disp, req.topic)
        except ValueError as e:  # a config file that is not one: said, not retried
            say("dispatcher", f"cannot delete topic {req.topic}: {e}", "WARNING")
            self._seen = stamp
            return ""
        if done is None:
            return ""  # the lock was not free: the next tick tries again
        deleted_topics.finish_request(self._ctx.store_dir, req.id, done)
        DispatchStats(self._ctx.cb).count_topic_deleted()
        self._seen = self._stamp()
        say(
            "dispatcher",
            f"deleted topic {done.topic} while running: {done.queue_files} consume-queue "
            f"file(s), {done.offsets_removed} committed offset(s); its records below log "
            f"offset {done.end_offset} stay out of the queues",
        )
        return done.topic

    def _delete(self, disp: Dispatcher, topic: str) -> DeletedTopic | None:
        cb = self._ctx.cb
        store = self._ctx.store_dir
        app = _native.Appender(cb.buf, cb.pool_buf, os.getpid())
        try:
            if app.lock(LOCK_TIMEOUT_NS) != 0:
                return None
            try:
                end, _seq = Positions(cb).reserved_and_seq()
                deleted_topics.add(store, topic, end)
                trash = deleted_topics.move_queues_aside(store, topic)
                cb.reset_topic_rows(topic.encode())
            finally:
                app.unlock()
        finally:
            app.close()
        disp.forget_topic(topic, end)
        files = 0 if trash is None else deleted_topics.purge(store, trash)
        was_configured = topics.remove_topic(store, topic)
        gone = ConsumerOffsets(store).delete(None, topic)
        return DeletedTopic(topic, end, files, was_configured, gone)
