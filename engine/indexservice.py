"""A store's index files: RocketMQ's IndexService (spec §4).

`IndexService` holds every index file of a store (`<store>/index/`, one
`engine.indexfile.IndexFile` each, named by creation time and loaded in name order),
oldest first; the newest takes new keys. It loads them (after an abnormal exit
destroying those newer than the checkpoint's index timestamp, as RocketMQ's load does),
rolls to a new file when the newest fills (a file made ahead of need by another thread
when there is one), indexes records (`build_index`, `build_index_batch`), answers
queries over files newest first, truncates entries past a commit-log offset for
recovery and deletes expired files for the cleaner.

One writer (the dispatcher); readers open the files read-only in their own process
(`refresh` picks up files made since).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Final

from mqstore._native import crash_point
from mqstore.engine import fileio
from mqstore.engine.findings import Finding, Severity
from mqstore.engine.indexfile import IndexFile, KeyBatch, StoreTimeOf, build_key, key_hash
from mqstore.engine.record import transaction_type
from mqstore.engine.segment import ClockMs, now_ms

INDEX_DIR: Final = "index"
PREPARED_NAME: Final = "next.tmp"  # a file made ahead of need (IndexService.prepare_next)
_TX_ROLLBACK: Final = 0xC


@dataclass(frozen=True, slots=True)
class QueryOffsetResult:
    """What `IndexService.query_offsets` found: physical offsets (newest file first,
    newest first within a file) and the newest file's end values."""

    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


@dataclass(eq=False)
class IndexService:
    """Every index file of a store, oldest first; the newest takes new keys.

    `on_roll(end_timestamp)` runs after a full file was flushed on a roll (the caller
    stores it as the checkpoint's index timestamp and flushes the checkpoint: RocketMQ's
    IndexService.flush). With `defer_roll_flush` a roll flushes nothing: the full file
    goes to `rolled`, for its owner to flush elsewhere (the dispatcher's flush thread, as
    RocketMQ flushes it in a thread of its own) and only then to advance the checkpoint;
    `on_roll` is not called."""

    store_dir: InitVar[str | os.PathLike[str]]
    hash_slot_num: int
    index_num: int
    _: KW_ONLY
    read_only: bool = False
    max_msgs_num_batch: int = 64
    clock_ms: ClockMs = now_ms
    on_roll: Callable[[int], None] | None = None
    defer_roll_flush: bool = False
    directory: str = field(init=False)  # <store_dir>/index
    files: list[IndexFile] = field(init=False, default_factory=list)
    rolled: list[IndexFile] = field(init=False, default_factory=list)  # not flushed yet
    # A file made ahead of need by another thread (`want_prepared`, `prepare_next`),
    # taken by the next roll; its directory's fsync is then due (`dir_unsynced`).
    prepared: str | None = field(init=False, default=None)
    dir_unsynced: bool = field(init=False, default=False)
    # Rolls (a file after the last) that made their file themselves, allocated, zeroed
    # and fsynced in the writer's thread: none was prepared ahead.
    rolls_in_place: int = field(init=False, default=0)
    min_destroyed_begin_phy: int | None = field(init=False, default=None)  # set by load()

    def __post_init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.directory = os.path.join(os.fspath(store_dir), INDEX_DIR)

    def load(self, *, last_exit_ok: bool = True, index_msg_timestamp: int = 0) -> list[str]:
        """Open every file in name order. After an abnormal exit, destroy files whose
        end timestamp is past the checkpoint's `index_msg_timestamp` (RocketMQ's load)
        and return their names. Raises IndexGeometryError, StoreIOError."""
        destroyed: list[str] = []
        if not os.path.isdir(self.directory):
            return destroyed
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.endswith(".tmp") and not self.read_only and os.path.isfile(path):
                fileio.unlink(path, missing_ok=True)  # a creation or preparation cut short
                continue
            if not name.isdigit() or not os.path.isfile(path):
                continue
            if os.stat(path).st_size == 0:
                continue
            f = IndexFile.open(path, self.hash_slot_num, self.index_num, read_only=self.read_only)
            if (
                not last_exit_ok
                and not self.read_only
                and f.end_timestamp > index_msg_timestamp
                and index_msg_timestamp > 0
            ):
                begin = f.begin_phy_offset
                if self.min_destroyed_begin_phy is None or begin < self.min_destroyed_begin_phy:
                    self.min_destroyed_begin_phy = begin
                f.destroy()
                destroyed.append(name)
                continue
            if not last_exit_ok and not self.read_only:
                f.rechain()  # a power cut may have kept slots the header does not count
            self.files.append(f)
        return destroyed

    def refresh(self) -> None:
        """Read-only: open files another process created since."""
        known = {f.file_name for f in self.files}
        if not os.path.isdir(self.directory):
            return
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name in known or not name.isdigit() or not os.path.isfile(path):
                continue
            if os.stat(path).st_size == 0:
                continue
            self.files.append(
                IndexFile.open(path, self.hash_slot_num, self.index_num, read_only=True)
            )
        self.files.sort(key=lambda f: f.file_name)

    def _last_file(self) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_write_full():
            return last
        if last is not None:
            crash_point("index-roll")  # a test's kill: the full file, no next one yet
        prev_phy = last.end_phy_offset if last is not None else 0
        prev_ts = last.end_timestamp if last is not None else 0
        tmp, self.prepared = self.prepared, None
        if tmp is not None and os.path.exists(tmp):
            # Made ahead by another thread: a rename, no sync here (`dir_unsynced`).
            path = IndexFile.free_name(self.directory, self.clock_ms())
            try:
                fileio.rename(tmp, path)
            except fileio.StoreIOError:
                self.prepared = tmp  # still there: the next try takes it
                raise
            self.dir_unsynced = True
            f = IndexFile(path, self.hash_slot_num, self.index_num)
        else:
            now = self.clock_ms()
            f = IndexFile.create(
                self.directory, self.hash_slot_num, self.index_num, now_ms_value=now
            )
            self.rolls_in_place += last is not None
        f.start_after(prev_phy, prev_ts)
        self.files.append(f)
        if last is not None:
            crash_point("index-roll-made")  # a test's kill: the next file made, empty
        if last is not None and self.defer_roll_flush:
            self.rolled.append(last)
        elif last is not None:
            last.flush()
            if self.on_roll is not None and last.end_timestamp > 0:
                self.on_roll(last.end_timestamp)
        return f

    def file_for_keys(self) -> IndexFile:
        """The file the next key goes into: the last one, or a new one when it is full
        (the roll `build_index_batch` makes). Dispatcher only (its C round's roll).
        Raises StoreIOError."""
        return self._last_file()

    def build_index(
        self,
        topic: str,
        keys: str | None,
        uniq_key: str | None,
        physical_offset: int,
        store_timestamp: int,
        sys_flag: int,
    ) -> int:
        """Index one message (RocketMQ's buildIndex): `topic#UNIQ_KEY`, then
        `topic#key` for every non-empty space-separated KEYS token. Skips ROLLBACK
        messages and messages already indexed (at or before the newest file's end).
        Returns keys written. Dispatcher only. Raises StoreIOError."""
        if transaction_type(sys_flag) == _TX_ROLLBACK:
            return 0
        todo = [uniq_key] if uniq_key else []
        if keys:
            todo.extend(k for k in keys.split(" ") if k)
        hashes = array("i", (key_hash(build_key(topic, k)) for k in todo))
        one = KeyBatch(array("i", [0, len(hashes)]), hashes, array("q", [0]),
                       array("q", [store_timestamp]), physical_offset, 0, 1)  # fmt: skip
        return self.build_index_batch(one)

    def build_index_batch(self, batch: KeyBatch) -> int:
        """Index the records of `batch` in log order, skipping those already indexed
        (at or before the newest file's end) and rolling to a new file when one fills.
        The caller leaves out ROLLBACK messages and fillers. Returns keys written.
        Dispatcher only. Raises StoreIOError."""
        key_first, pos, base, rec_from = batch.key_first, batch.pos, batch.base, batch.rec_from
        end = key_first[batch.rec_to]
        if key_first[rec_from] == end:
            return 0  # no keys: no file is created for them
        f = self._last_file()
        end_phy, has_end = f.end_phy_offset, f.end_timestamp > 0
        while rec_from < batch.rec_to and (
            base + pos[rec_from] < end_phy or (base + pos[rec_from] == end_phy and has_end)
        ):
            rec_from += 1
        if rec_from != batch.rec_from:  # (`_replace` is a fixed cost of every round)
            batch = batch._replace(rec_from=rec_from)
        k = start = key_first[rec_from]
        while k < end:
            k = f.put_hashes(batch, k)
            if k < end:
                f = self._last_file()
        return end - start

    def query_offsets(
        self, topic: str, key: str, max_num: int, begin: int, end: int
    ) -> QueryOffsetResult:
        """RocketMQ's queryOffset (spec §4.5): files newest to oldest, at most
        min(max_num, max_msgs_num_batch) offsets."""
        max_num = min(max_num, self.max_msgs_num_batch)
        out: list[int] = []
        last_ts = last_phy = 0
        full_key = build_key(topic, key)
        for i in range(len(self.files), 0, -1):
            f = self.files[i - 1]
            if i == len(self.files):
                last_ts, last_phy = f.end_timestamp, f.end_phy_offset
            if f.is_time_matched(begin, end):
                out.extend(f.select_phy_offsets(full_key, max_num - len(out), begin, end))
            if f.begin_timestamp < begin or len(out) >= max_num:
                break
        return QueryOffsetResult(out, last_ts, last_phy)

    def truncate_dirty(self, phy_offset: int, store_time_of: StoreTimeOf) -> int:
        """Drop entries at or past commit-log `phy_offset`: newer files whose entries
        all are go, the newest remaining one is truncated (`IndexFile.truncate`: its
        end time is `store_time_of` its last record kept). Returns entries dropped."""
        dropped = 0
        while self.files:
            f = self.files[-1]
            n = f.truncate(phy_offset, store_time_of)
            dropped += n
            if f.index_count <= 1 and (n or len(self.files) > 1):
                self.files.pop()
                f.destroy()
                continue
            if n:
                f.flush()
            break
        if dropped:
            fileio.fsync_dir(self.directory)
        return dropped

    def delete_expired(self, log_min_offset: int) -> int:
        """Cleaner: destroy every file but the newest whose end offset is below
        `log_min_offset`, oldest first, stopping at the first that is not."""
        n = 0
        while len(self.files) > 1 and self.files[0].end_phy_offset < log_min_offset:
            self.files.pop(0).destroy()
            n += 1
        return n

    def flush(self) -> None:
        """Force every file (shutdown, 5.x). Raises StoreIOError."""
        for f in self.files:
            f.flush()

    def want_prepared(self) -> bool:
        """Whether a file should be made ahead of need now (`prepare_next`, in another
        thread): writable, none prepared, and the newest file holding a key (or no file
        yet). Not only once the newest is half full: the index fills one file at a
        time, so the spare costs one file of disk, and half a file left too little time
        at full rate (two keys a message: half of 2M entries in 0.9 s, while the flush
        thread's job waited out the commit log's writeback; the roll then made the
        file in the dispatch loop, `rolls_in_place`)."""
        if self.read_only or self.prepared is not None:
            return False
        last = self.files[-1] if self.files else None
        return last is None or last.index_count > 1

    def prepare_next(self) -> None:
        """Make the next file ahead of need (`IndexFile.prepare` as `PREPARED_NAME`) and
        offer it to the next roll. Any one thread at a time. Raises StoreIOError."""
        self.prepared = IndexFile.prepare(
            self.directory, self.hash_slot_num, self.index_num, PREPARED_NAME
        )

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
        tmp, self.prepared = self.prepared, None
        if tmp is not None:
            fileio.unlink(tmp, missing_ok=True)

    def check(self) -> list[Finding]:
        """Per file: entry numbers in range, chains pointing backwards, offsets in order."""
        out: list[Finding] = []
        for f in self.files:
            count = f.index_count
            if not 1 <= count <= f.index_num:
                out.append(Finding(Severity.ERROR, f"index count {count} out of range", f.path))
                continue
            prev_phy = -1
            for k, _h, phy, _d, prev in f.entries():
                if not 0 <= prev < k:
                    out.append(Finding(Severity.ERROR, f"entry {k} chains to {prev}", f.path))
                if phy < prev_phy:
                    out.append(
                        Finding(Severity.WARNING, f"entry {k} offset {phy} < {prev_phy}", f.path)
                    )
                prev_phy = phy
        return out
