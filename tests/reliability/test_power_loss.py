"""Power-loss suite: under mixed sync/async load, cut the power (SIGKILL the whole store
and the producer at a random point), then make the disk from exactly what the store had
made durable (`powerloss.ShadowRecorder` on `engine.fileio`'s sync seam, and
`powerloss.build_image`: synced file content, and only the directory entries a directory
fsync covered), recover on it and check every invariant. Variant `unsynced-pages` also
keeps a random half of the pages that were written but never synced, as a real disk may
have.

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

from mqstore.ipc import control as c
from mqstore.ipc.commit import pid_alive
from tests.reliability.conftest import FIGURES, sized
from tests.reliability.powerloss import build_image, seed_shadow, shadow_env
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
    stats: Counter[str] = Counter()
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
