"""Power-loss suite: under mixed sync/async load, cut the power (SIGKILL the whole store
and the producer at a random point), then make the disk from exactly what the store had
made durable (`powerloss.ShadowRecorder` on `engine.fileio`'s sync seam, and
`powerloss.build_image`: synced file content, and only the directory entries a directory
fsync covered), recover on it and check every invariant. Variant `unsynced-pages` also
keeps a random half of the pages that were written but never synced, as a real disk may
have. The flusher's C flush step (`ipc/native/mqs_round.c`: the SYNC_FLUSH round and
the timed flush) forces the log through the same seam (`fileio.native_seam`): the
recorder counts the commit-log syncs it made, and those of the Python flush step, which
must be none.

Sizes: one cycle per variant by default, 25 per variant (50 in all) under
MQSTORE_RELIABILITY_FULL=1. Each cycle's disk is the next cycle's store, so acknowledged
messages must survive every later power cut too."""

from __future__ import annotations

import os
import random
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest

from mqstore import StoreClient
from mqstore.engine import fileio
from mqstore.engine.checkpoint import CheckpointFields
from mqstore.engine.consumequeue_store import ConsumeQueueStore
from mqstore.engine.indexservice import IndexService
from mqstore.engine.segment import segment_file_name
from mqstore.ipc import control as c
from mqstore.ipc.commit import pid_alive
from tests.native.test_sync_round_diff import SEG, publish, store
from tests.reliability.conftest import FIGURES, sized
from tests.reliability.powerloss import (
    ShadowRecorder,
    build_image,
    log_sync_counts,
    seed_shadow,
    shadow_env,
)
from tests.reliability.test_crash import GroupStore, Producer
from tests.reliability.verify import verify, verify_queues
from tests.reliability.workload import Acks
from tests.runtime.harness import wait_for


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["synced-only", "unsynced-pages"])
def test_power_loss_cycles(tmp_path: Path, variant: str, seed: int) -> None:
    cycles = sized(1, 25)
    rng = random.Random(f"{seed}-{variant}")
    store_dir = tmp_path / "disk0"
    acks: dict[str, Acks] = {}
    # the summary shows this one even at 0, what it must be
    stats: Counter[str] = Counter({"commit-log syncs by the Python flush step": 0})
    for cycle in range(cycles):
        why = f"(variant {variant}, cycle {cycle}, seed {seed})"
        tag = f"pl{cycle}"
        shadow = tmp_path / f"shadow{cycle}"
        st = GroupStore(store_dir)  # writes its config: on disk before the store starts
        seed_shadow(store_dir, shadow)
        st.start(shadow_env(store_dir, shadow))
        prod = Producer(st, tag, rng.randrange(1 << 30))
        try:
            prod.wait_acks(rng.randint(1, 150), f"acks before the power cut {why}")
            st.wait_workers_running()
            workers = [w["pid"] for w in st.status()["workers"]]
            assert st.proc is not None
            os.killpg(st.proc.pid, signal.SIGKILL)  # the power cut
        finally:
            prod.kill()
        st.forget_proc()
        wait_for(
            lambda ws=workers: not any(pid_alive(p) for p in ws),  # type: ignore[misc]
            60,
            f"workers gone {why}",
        )
        c.remove_leftovers(store_dir)  # the machine's memory went with the power
        acks[tag] = prod.acks
        # who forced the log: the flusher's C flush step (its round and its timed
        # flush), the allocator and recovery (Python), never the Python flush step; a
        # cycle cut before its first sync put has none
        synced = log_sync_counts(shadow)
        stats.update({f"commit-log syncs by the {k}": v for k, v in synced.items()})
        disk = tmp_path / f"disk{cycle + 1}"
        build_image(store_dir, shadow, disk, rng if variant == "unsynced-pages" else None, stats)
        shutil.rmtree(store_dir)
        shutil.rmtree(shadow)
        store_dir = disk
        # the machine comes back: recover, stop, and check everything put so far
        after = GroupStore(store_dir)
        after.start()
        after.wait_workers_running()
        code = after.stop()
        assert code == 0, f"supervisor exited {code} {why}: {after.output()[-2000:]}"
        o = verify(after, acks, async_loss_allowed=True)
        assert not o.sync_lost, f"SYNC-acknowledged messages lost {why}: {o.sync_lost[:10]}"
        assert not o.problems, f"{why}: {o.problems[:10]}"
        after.start()
        try:
            queues = verify_queues(after)
            assert not queues, f"{why}: {queues[:10]}"
        finally:
            assert after.stop() == 0
        assert after.shm_leftovers() == []
        FIGURES["power-loss cycles"] += 1
        FIGURES["acknowledged messages checked (power loss, sync)"] += len(acks[tag].sync)
        FIGURES["acknowledged messages checked (power loss, async)"] += len(acks[tag].asyn)
        FIGURES["acknowledged messages lost (power loss, sync)"] += len(o.sync_lost)
        if cycle == cycles - 1:
            FIGURES["async-acknowledged lost to power cuts (allowed)"] += o.async_lost
    for k, v in stats.items():
        FIGURES[f"power loss: {k}"] += v
    synced_acks = sum(len(a.sync) for a in acks.values())
    assert stats["commit-log syncs by the C flush step"] > 0 or not synced_acks, stats
    # production never runs the Python flush step: the suite tests the C that runs
    assert stats["commit-log syncs by the Python flush step"] == 0, stats


CQ_FILE_BYTES = 20 * 256  # a new queue file every 256 messages
CQ_CONFIG: dict[str, object] = {
    "flush_disk_type": "ASYNC_FLUSH",
    "consume_queue_file_size_bytes": CQ_FILE_BYTES,
    "max_hash_slot_num": 64,
    "max_index_num": 256,  # an index roll every 127 messages (two keys each)
    # a thorough flush (the checkpoint) every second; in between, queue files are forced
    # only once full or two pages ahead, so units wait up to a second to be durable
    "flush_consume_queue_interval_ms": 250,
    "flush_consume_queue_thorough_interval_ms": 1000,
}


def test_checkpoint_is_never_ahead_of_the_durable_queues(tmp_path: Path) -> None:
    """The dispatcher's flush thread writes the checkpoint's logics time only for units it
    forced, and its index time only for a rolled index file it forced (spec §5). Cut the
    power while it runs (the durability seam: only what was synced survives), then on
    that disk: every record stored at or before the logics time has its unit in the
    consume queues (of an earlier ms: store times are in ms), and the index file that
    ended at the index time is there, full.
    Before the flush thread, an index roll wrote the in-memory logics time, ahead of
    the queues' last flush."""
    store_dir = tmp_path / "store"
    shadow = tmp_path / "shadow"
    st = GroupStore(store_dir, CQ_CONFIG)
    seed_shadow(store_dir, shadow)
    st.start(shadow_env(store_dir, shadow))
    try:
        st.wait_workers_running()
        with StoreClient.attach(store_dir) as client:
            n = 0

            def thorough_flushes_seen() -> bool:
                nonlocal n
                for _ in range(50):
                    r = client.put("cp", b"%d" % n, keys=[f"k{n}"], queue_id=n % 3)
                    assert r.ok, r
                    n += 1
                cp = CheckpointFields.from_bytes((store_dir / "checkpoint").read_bytes())
                return n >= 2000 and cp.logics_msg_timestamp > 0 and cp.index_msg_timestamp > 0

            wait_for(thorough_flushes_seen, 120, "checkpoints written while puts go on")
            workers = [w["pid"] for w in st.status()["workers"]]
            assert st.proc is not None
            os.killpg(st.proc.pid, signal.SIGKILL)  # the power cut, puts still coming
    finally:
        if st.proc is not None and st.proc.poll() is None:
            os.killpg(st.proc.pid, signal.SIGKILL)
    st.forget_proc()
    wait_for(lambda: not any(pid_alive(p) for p in workers), 60, "workers gone")
    records = st.read_log()  # every record written (the page cache survived here)
    c.remove_leftovers(store_dir)
    disk = tmp_path / "disk"
    build_image(store_dir, shadow, disk, None, Counter())
    cp = CheckpointFields.from_bytes((disk / "checkpoint").read_bytes())
    assert cp.logics_msg_timestamp > 0 and cp.index_msg_timestamp > 0, cp
    # store times rise with the log (taken under the reservation lock) in ms: a record
    # of the logics time's own ms may have been dispatched after the flush was planned
    covered = [r for r in records if r.store_timestamp < cp.logics_msg_timestamp]
    assert covered, "the checkpoint covers no record"
    cqs = ConsumeQueueStore(disk, CQ_FILE_BYTES, read_only=True).load()
    try:
        missing = []
        for r in covered:
            cq = cqs.get(r.topic, r.queue_id)
            u = None if cq is None else cq.get(r.queue_offset)
            if u is None or u.physical_offset != r.physical_offset:
                missing.append((r.topic, r.queue_id, r.queue_offset))
        assert not missing, f"{len(missing)} of {len(covered)} covered units not durable"
    finally:
        cqs.close()
    index = IndexService(disk, 64, 256, read_only=True)
    try:
        index.load()
        ends = [f.end_timestamp for f in index.files]
        assert cp.index_msg_timestamp in ends, (cp.index_msg_timestamp, ends)
        full = index.files[ends.index(cp.index_msg_timestamp)]  # forced before it counted
        assert full.is_write_full(), full
    finally:
        index.close()
    FIGURES["checkpoint checked after a power cut: covered units"] += len(covered)


def test_the_recorder_tells_the_c_flush_step_from_the_python_one(tmp_path: Path) -> None:
    """`log_sync_counts`' keys, on real files: a sync by the C flush step, by its Python
    reference (`ipc/commit.py`: what production must never run) and by other Python code
    are told apart, so the suite's "Python flush step: 0" can fail."""
    with store(pool=True) as (d, cb, files):
        shadow = tmp_path / "shadow"
        shadow.mkdir()
        fileio.set_sync_watch(ShadowRecorder(str(shadow), str(d)))
        try:
            publish(d, cb, [1000], fill=1)
            files.commit(0)
            assert files.flush_and_wake(0) is not None  # C
            publish(d, cb, [1000, 2000], fill=2)
            files.commit(0)
            assert files.flush_and_wake_py(0) is not None  # Python, ipc/commit.py
            first = str(d / "commitlog" / segment_file_name(0))
            fd = fileio.open_file(first, create=False)
            fileio.fdatasync(fd, first)  # other Python code
            fileio.close(fd)
        finally:
            fileio.set_sync_watch(None)
        assert cb.get(c.OFF_FLUSHED) == 4000 < SEG
    assert log_sync_counts(shadow) == Counter(
        {"C flush step": 1, "Python flush step": 1, "allocator and recovery": 1}
    )
