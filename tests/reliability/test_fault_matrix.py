"""Every worker x every syscall kind it uses x EIO and ENOSPC, through the one fault seam
(`MQSTORE_FAULTS`, `engine.fileio`), in real processes on a real store.

Two outcomes, fixed per cell:

* READ_ONLY (every EIO; ENOSPC where no new space is being asked for, and any failed
  sync): the store turns read-only with the worker, syscall and errno in status, puts
  are refused with SERVICE_NOT_AVAILABLE and the reason, the worker is halted (exit
  IO_FAILED, FLUSH_FAILED for the flusher) and no worker is restarted.
* WAITS (ENOSPC where a worker asks for new space, `fileio.SPACE_OPS`: a new segment,
  consume-queue or index file, the cleaner's status file): a full disk is waited out,
  said once in the log; the store stays writable where it can and no worker is
  restarted or halted.

In both, nothing acknowledged is lost: after the stop, every put that returned PUT_OK
and lies below the flushed position the store reported (all of them under SYNC_FLUSH)
reads back intact from the files. Before this, the committer's failed pwrite made it
crash and restart 7 times while every put said PUT_OK; the cleaner and the dispatcher's
topic registration caught their I/O errors and retried forever.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

import pytest

from mqstore import PutMessageStatus, StoreClient
from tests.reliability.conftest import FIGURES
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store, wait_for

READ_ONLY, WAITS = "read-only", "waits"
BODY = b"m" * 12_000  # a few per 1 MiB segment: segments roll and files are created quickly
CONFIG: dict[str, Any] = {
    "consume_queue_file_size_bytes": 20 * 4096,  # new consume-queue files often
    "max_hash_slot_num": 64,
    "max_index_num": 256,  # a new index file every 256 keys
    "heartbeat_timeout_ms": 20_000,  # a busy CI machine is not what this tests
}


@dataclass(frozen=True)
class Cell:
    worker: str
    op: str
    err: str
    outcome: str
    flush: str = "SYNC_FLUSH"
    pool: bool = True

    @property
    def id(self) -> str:
        mode = "" if self.flush == "SYNC_FLUSH" else f"-{self.flush}"
        return f"{self.worker}-{self.op}-{self.err}{mode}{'' if self.pool else '-nopool'}"


def _both(worker: str, op: str, on_enospc: str, **kw: Any) -> list[Cell]:
    return [Cell(worker, op, "EIO", READ_ONLY, **kw), Cell(worker, op, "ENOSPC", on_enospc, **kw)]


ASYNC = {"flush": "ASYNC_FLUSH"}
CELLS: list[Cell] = [
    # committer: the pool's pwrite into the segments, opening and mapping them (ASYNC: under
    # SYNC_FLUSH the flusher commits on demand and the committer seldom has work)
    *_both("committer", "pwrite", READ_ONLY, **ASYNC),
    *_both("committer", "open", READ_ONLY, **ASYNC),
    *_both("committer", "mmap", READ_ONLY, **ASYNC),
    # flusher: its fdatasync (of what the committer wrote, or of the mapping the producers
    # wrote with the pool off), its on-demand commit; ASYNC: its timed flush (fdatasync,
    # flushed_offset's pwrite), C as the sync round is
    *_both("flusher", "fdatasync", READ_ONLY),
    *_both("flusher", "fdatasync", READ_ONLY, pool=False),
    *_both("flusher", "pwrite", READ_ONLY),
    *_both("flusher", "open", READ_ONLY),
    *_both("flusher", "fdatasync", READ_ONLY, **ASYNC),
    *_both("flusher", "fdatasync", READ_ONLY, pool=False, **ASYNC),
    *_both("flusher", "pwrite", READ_ONLY, **ASYNC),
    # allocator: building the next segment file (open .tmp, ftruncate, fallocate, under
    # SYNC_FLUSH its zeros written and forced a chunk at a time, fsync, rename, fsync of
    # the directory)
    *_both("allocator", "open", WAITS),
    *_both("allocator", "ftruncate", WAITS),
    *_both("allocator", "fallocate", WAITS),
    *_both("allocator", "pwrite", WAITS),
    *_both("allocator", "fdatasync", READ_ONLY),
    *_both("allocator", "fsync", READ_ONLY),
    *_both("allocator", "rename", WAITS),
    *_both("allocator", "fsync_dir", READ_ONLY),
    # dispatcher: consume-queue and index files (created, allocated, mapped, flushed),
    # the checkpoint (open at boot, pwrite + fdatasync), topics.json (rename). Its flush
    # thread forces queue and index files and the checkpoint with fdatasync of a dup of
    # their descriptors (msync only where fdatasync would not cover a mapping: not Linux)
    *_both("dispatcher", "fallocate", WAITS),
    *_both("dispatcher", "ftruncate", WAITS),
    *_both("dispatcher", "mmap", READ_ONLY),  # mapping takes no space: its ENOSPC fails
    *_both("dispatcher", "dup", READ_ONLY),
    *_both("dispatcher", "fdatasync", READ_ONLY),
    # files made ahead and the directories they are renamed into, synced by the thread
    *_both("dispatcher", "fsync", READ_ONLY),
    *_both("dispatcher", "fsync_dir", READ_ONLY),
    *_both("dispatcher", "open", READ_ONLY),
    *_both("dispatcher", "rename", WAITS),
    # cleaner: the request file's unlink, the status file (write_file_atomic)
    *_both("cleaner", "unlink", READ_ONLY),
    *_both("cleaner", "open", WAITS),
    *_both("cleaner", "pwrite", WAITS),
    *_both("cleaner", "fsync", READ_ONLY),
    *_both("cleaner", "rename", WAITS),
]
# One cell per worker runs in every pytest run; the rest are marked slow (CI runs them).
_FAST = {"committer-pwrite-EIO-ASYNC_FLUSH", "flusher-fdatasync-EIO", "allocator-fallocate-EIO",
         "dispatcher-fallocate-ENOSPC", "cleaner-unlink-EIO"}  # fmt: skip
PARAMS = [
    pytest.param(cell, id=cell.id, marks=() if cell.id in _FAST else pytest.mark.slow)
    for cell in CELLS
]
# The flusher's cells under SYNC_FLUSH fail in its sync round. Its timed flush commits
# first with the committer's step (Python: the injected message) and must not run: a
# producer preempted between its publish and its request left published bytes that an
# interval's or a wake's flush committed, a flake at load 30+. A timed flush
# (flushCommitLogTimed) with intervals longer than any cell leaves it to the rounds.
_ROUND_ONLY: dict[str, Any] = {
    "flush_timed": True,
    "flush_interval_ms": 600_000,
    "flush_thorough_interval_ms": 600_000,
}
WAIT_LINES = {  # what each worker says while it waits for space (once)
    "allocator": "not creating",
    "dispatcher": "for space on the disk",
    "cleaner": "injected ENOSPC",
}


class Producer:
    """Puts with keys (so the index grows) over three topics, keeping every ack."""

    def __init__(self, client: StoreClient) -> None:
        self.client = client
        self.acked: dict[int, bytes] = {}
        self.n = 0

    def put(self) -> Any:
        i = self.n
        self.n += 1
        body = b"%d:" % i + BODY
        r = self.client.put(f"t{i % 3}", body, keys=f"k{i}", queue_id=0)
        if r.status is PutMessageStatus.PUT_OK:
            self.acked[r.physical_offset] = body
        return r


def _poke_cleaner(st: Store) -> None:
    """What `mqstore clean --now` does: a request file the cleaner takes at its next tick."""
    (st.path / ".mqstore-clean-now").touch()


def _wait_read_only(st: Store, prod: Producer, cell: Cell) -> dict[str, Any]:
    def failed() -> dict[str, Any] | None:
        if cell.worker == "cleaner":
            _poke_cleaner(st)
        r = prod.put()
        doc = st.status()
        if doc.get("read_only"):
            return doc
        assert r.status is PutMessageStatus.PUT_OK or "read-only" in r.reason, r
        return None

    doc: dict[str, Any] = wait_for(failed, 120, f"{cell.id}: the store to turn read-only")
    return doc


def _check_read_only(st: Store, prod: Producer, cell: Cell, doc: dict[str, Any]) -> None:
    ro = doc["read_only"]
    assert (ro["worker"], ro["op"], ro["errno"]) == (cell.worker, cell.op, cell.err), ro
    assert cell.worker in doc["read_only_reason"] and cell.op in doc["read_only_reason"], doc
    assert "read_only" in doc["flags"], doc["flags"]
    r = prod.put()
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "read-only" in r.reason, r
    code = 5 if cell.worker == "flusher" else 6

    def halted() -> dict[str, Any] | None:
        rows = {w["name"]: w for w in st.status()["workers"]}
        return rows if rows[cell.worker]["state"] == "halted" else None

    rows = wait_for(halted, 30, f"{cell.worker} to be halted")
    assert (rows[cell.worker]["restarts"], rows[cell.worker]["last_exit"]) == (0, code), rows
    assert all(w["restarts"] == 0 for w in rows.values()), rows
    assert f"{cell.op}" in st.output() and "not restarting" in st.output()
    if cell.worker == "flusher" and cell.op in ("pwrite", "fdatasync"):
        # the flusher's C flush step (its sync round, its timed flush under ASYNC_FLUSH)
        # failed, through its I/O seam (`fileio.native_seam`): it says the errno's own
        # text, where Python code says the injected message
        strerror = os.strerror(getattr(errno, cell.err))
        assert strerror in ro["message"] and "injected" not in ro["message"], ro
        FIGURES["fault matrix: flusher cells failed in the C flush step"] += 1


def _check_waits(st: Store, prod: Producer, cell: Cell) -> dict[str, Any]:
    line = WAIT_LINES[cell.worker]

    def waiting() -> bool:
        if cell.worker == "cleaner":
            _poke_cleaner(st)
        prod.put()
        return any(cell.worker in ln and line in ln for ln in st.output().splitlines())

    wait_for(waiting, 120, f"{cell.id}: {cell.worker} to say it waits for space")
    for _ in range(20):  # it keeps waiting: no read-only, no restart, said once
        if cell.worker == "cleaner":
            _poke_cleaner(st)
        prod.put()
    doc = st.status()
    assert not doc.get("read_only") and "read_only" not in doc["flags"], doc
    rows = {w["name"]: (w["state"], w["restarts"]) for w in doc["workers"]}
    assert set(rows.values()) == {("running", 0)}, rows
    said = [ln for ln in st.output().splitlines() if cell.worker in ln and line in ln]
    assert 1 <= len(said) <= 3, said
    return doc


@pytest.mark.parametrize("cell", PARAMS)
def test_worker_io_fault(make_store: StoreFactory, cell: Cell) -> None:
    st = make_store(
        {
            **CONFIG,
            "flush_disk_type": cell.flush,
            "transient_store_pool_enable": cell.pool,
            "clean_resource_interval_ms": 200,
            **(_ROUND_ONLY if cell.worker == "flusher" and cell.flush == "SYNC_FLUSH" else {}),
        },
        env={"MQSTORE_FAULTS": f"{cell.op}:{cell.err}", "MQSTORE_FAULTS_FOR": cell.worker},
    )
    # booted, or (a fault at its boot: the dispatcher opens its files there) halted
    wait_for(lambda: {w["state"] for w in st.status()["workers"]} <= {"running", "halted"},
             60, "every worker to be running or halted")  # fmt: skip
    with StoreClient.attach(st.path) as client:
        prod = Producer(client)
        if cell.outcome == READ_ONLY:
            doc = _wait_read_only(st, prod, cell)
            _check_read_only(st, prod, cell, doc)
        else:
            doc = _check_waits(st, prod, cell)
        flushed = st.status()["positions"]["flushed"]
    code = st.stop()
    assert code == (5 if cell.outcome == READ_ONLY else 0), st.output()[-3000:]
    _check_nothing_acked_lost(st, prod, cell, flushed)


def _check_nothing_acked_lost(st: Store, prod: Producer, cell: Cell, flushed: int) -> None:
    """Every acknowledged put below the reported flushed position reads back intact;
    under SYNC_FLUSH an acknowledgement promised exactly that, so it is every put."""
    on_disk = {r.physical_offset: r.body for r in st.read_log()}
    # flushed is always a record boundary: a record starting below it is wholly below it
    durable = {off: b for off, b in prod.acked.items() if off < flushed}
    if cell.flush == "SYNC_FLUSH":
        assert len(durable) == len(prod.acked), (len(durable), len(prod.acked), flushed)
    lost = [off for off, body in durable.items() if on_disk.get(off) != body]
    assert not lost, f"{len(lost)} acknowledged puts lost, first at {lost[0]}"
    FIGURES[f"fault matrix cells: {cell.outcome}"] += 1
    FIGURES["acknowledged messages checked (fault matrix)"] += len(durable)
    FIGURES["acknowledged messages lost (fault matrix)"] += len(lost)
