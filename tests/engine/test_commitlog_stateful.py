"""A rule-based state machine over the commit log: append, batch, roll, commit, flush,
clean reopen and crash reopen, checked after every step against a simple model (the list
of records the log must hold, and the next queue offset per queue) and `check()`.

Two machines: the mmap path, and the write-buffer path (RocketMQ's transient store pool),
where a crash loses what was appended but not committed.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqstore.engine.commitlog import CommitLog
from mqstore.engine.findings import errors
from mqstore.engine.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    Message,
    record_length,
)
from mqstore.engine.segment import Segment
from mqstore.engine.segment_queue import SegmentQueue

SEGMENT = 2048
TOPICS = ("A", "BB")


@dataclass
class Expected:
    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes


@dataclass
class Model:
    records: list[Expected] = field(default_factory=list)
    end: int = 0  # where the next record goes, before any roll

    def place(self, size: int) -> int:
        """Where a record of `size` bytes lands: here, or at the next segment's start."""
        room = SEGMENT - self.end % SEGMENT
        if size + END_FILE_MIN_BLANK_LENGTH > room:
            return self.end + room
        return self.end

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        got = [r.queue_offset for r in self.records if (r.topic, r.queue_id) == (topic, queue_id)]
        return max(got) + 1 if got else 0

    def keep_below(self, offset: int) -> None:
        self.records = [r for r in self.records if r.offset + r.size <= offset]
        self.end = self.records[-1].offset + self.records[-1].size if self.records else 0


bodies = st.binary(min_size=0, max_size=600)
messages = st.tuples(st.sampled_from(TOPICS), st.integers(0, 2), bodies)


class CommitLogMachine(RuleBasedStateMachine):
    use_buffer = False

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="mq-sm-"))
        self.model = Model()
        self.log = self._open(fresh=True)

    def _alloc(self, start: int) -> Segment:
        return Segment.create(
            self.root, start, SEGMENT, write_buffer=bytearray(SEGMENT), on_buffer_done=None
        )

    def _open(self, *, fresh: bool) -> CommitLog:
        queue = SegmentQueue(self.root, SEGMENT, allocator=self._alloc if self.use_buffer else None)
        if not fresh:
            queue.load()
        log = CommitLog(queue)
        if not fresh:
            log.recover_tail()
        return log

    def _append_expected(self, topic: str, queue_id: int, body: bytes) -> Expected:
        size = record_length(len(body), len(topic.encode()), 0)
        at = self.model.place(size)
        qo = self.model.next_queue_offset(topic, queue_id)
        return Expected(at, size, topic, queue_id, qo, body)

    @rule(m=messages)
    def append(self, m: tuple[str, int, bytes]) -> None:
        topic, queue_id, body = m
        exp = self._append_expected(topic, queue_id, body)
        res = self.log.append(Message(topic, body, queue_id=queue_id))
        assert res.ok, res
        assert (res.wrote_offset, res.wrote_bytes, res.queue_offset) == (
            exp.offset, exp.size, exp.queue_offset,
        )  # fmt: skip
        self.model.records.append(exp)
        self.model.end = exp.offset + exp.size

    @rule(batch=st.lists(messages, min_size=1, max_size=4))
    def append_batch(self, batch: list[tuple[str, int, bytes]]) -> None:
        total = sum(record_length(len(b), len(t.encode()), 0) for t, _q, b in batch)
        if total + END_FILE_MIN_BLANK_LENGTH > SEGMENT:
            return  # a batch never spans segments; too big for one is its own test
        start = self.model.place(total)
        results = self.log.append_batch([Message(t, b, queue_id=q) for t, q, b in batch])
        pos = start
        for (topic, queue_id, body), res in zip(batch, results, strict=True):
            size = record_length(len(body), len(topic.encode()), 0)
            qo = self.model.next_queue_offset(topic, queue_id)
            assert res.ok and (res.wrote_offset, res.wrote_bytes, res.queue_offset) == (
                pos, size, qo,
            )  # fmt: skip
            self.model.records.append(Expected(pos, size, topic, queue_id, qo, body))
            pos += size
        self.model.end = pos

    @rule(least_pages=st.integers(0, 1))
    def commit(self, least_pages: int) -> None:
        before = self.log.queue.committed_where
        self.log.commit(least_pages)
        assert before <= self.log.queue.committed_where <= self.log.queue.max_wrote_offset()

    @rule(least_pages=st.integers(0, 1))
    def flush(self, least_pages: int) -> None:
        before = self.log.queue.flushed_where
        self.log.flush(least_pages)
        assert before <= self.log.queue.flushed_where <= self.log.queue.max_wrote_offset()

    @rule()
    def clean_reopen(self) -> None:
        self.log.queue.commit_all()
        while self.log.flush(0):
            pass
        self.log.close()
        self.log = self._open(fresh=False)

    @precondition(lambda self: self.use_buffer)
    @rule()
    def crash_reopen(self) -> None:
        """The process dies: bytes still only in a write buffer are gone; what reached the
        file's mapping (committed, or written straight into a segment loaded without a
        buffer) is in the page cache and survives."""
        survivors = self._visible()
        self.log.close()
        self.model.keep_below(survivors[-1].offset + survivors[-1].size if survivors else 0)
        self.log = self._open(fresh=False)
        end = self.model.end
        if end % SEGMENT and len(self.log.queue):
            # A roll's BLANK written straight into a segment loaded without a buffer is in
            # the page cache too: the next record then goes to the next segment.
            head = self.log.read_bytes(end, 8)
            if len(head) == 8 and int.from_bytes(head[4:], "big") == BLANK_MAGIC_CODE:
                self.model.end = end + SEGMENT - end % SEGMENT

    def _visible(self) -> list[Expected]:
        """The model's records a reader sees: the prefix lying wholly below the readable
        position (committed with a buffer, wrote without) of its segment."""
        out = []
        for r in self.model.records:
            seg = self.log.queue.find(r.offset)
            if seg is None or r.offset + r.size > seg.start_offset + seg.read_position:
                break
            out.append(r)
        return out

    @invariant()
    def log_matches_model(self) -> None:
        readable = self._visible()
        if not self.use_buffer:
            assert readable == self.model.records
        got = list(self.log.iter_records()) if len(self.log.queue) else []
        assert [(r.physical_offset, r.size, r.topic, r.queue_id, r.queue_offset, r.body)
                for r in got] == [
            (e.offset, e.size, e.topic, e.queue_id, e.queue_offset, e.body) for e in readable
        ]  # fmt: skip
        assert all(r.crc_ok for r in got)
        assert errors(self.log.check()) == []

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


class BufferedCommitLogMachine(CommitLogMachine):
    use_buffer = True


_settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCommitLogMmap = CommitLogMachine.TestCase
TestCommitLogMmap.settings = _settings
TestCommitLogWriteBuffer = BufferedCommitLogMachine.TestCase
TestCommitLogWriteBuffer.settings = _settings
