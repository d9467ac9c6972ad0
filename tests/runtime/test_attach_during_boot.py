"""A client that attaches while the store's workers are still booting: the supervisor
answers as soon as its socket listens, a second or more before its workers run on a
busy machine. Its puts must not fail for that: before, the put that needed the fourth
segment (the supervisor makes the first three) waited osPageCacheBusyTimeOutMills for
an allocator that was not running yet and got CREATE_MAPPED_FILE_FAILED (the flaky
`test_demo_stops_on_a_signal_it_inherited_ignored`: a demo stopped right after its
first puts). The allocator is held at interpreter start (`boot_gate/sitecustomize.py`)
until the client has attached, so the gap is there every time."""

from __future__ import annotations

import threading
from pathlib import Path

from mqstore import PutMessageStatus, StoreClient
from mqstore.ipc import control as c
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for

GATE_DIR = Path(__file__).parent / "boot_gate"
SEGMENT = 1 << 20  # the harness's segment_size_bytes
_WRITE_PATH = ("allocator", "committer", "flusher")  # a SYNC_FLUSH store's


def _states(client: StoreClient) -> dict[str, str]:
    """The write path's workers' states, as the client's control block has them now."""
    cb = client.live_control_block()
    rows = [cb.worker(i) for i in range(c.MAX_WORKERS)]
    return {r[0]: c.WORKER_STATE_NAMES[r[4]] for r in rows if r[0] in _WRITE_PATH}


def test_puts_after_an_attach_during_boot_wait_for_the_workers(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "allocator-may-boot"
    store = make_store(
        env={"PYTHONPATH": str(GATE_DIR), "MQS_TEST_HOLD_WORKER": f"allocator:{gate}"}
    )
    allocator = next(w for w in store.status()["workers"] if w["name"] == "allocator")
    assert allocator["state"] == "starting"  # held at the gate

    def open_gate_once_attached() -> None:  # the attach request answered: a client row
        wait_for(lambda: store.status()["clients"] >= 1, 60, "the client's attach")
        gate.touch()

    opener = threading.Thread(target=open_gate_once_attached, daemon=True)
    opener.start()
    with StoreClient.attach(store.path, timeout_s=60) as client:
        assert _states(client) == dict.fromkeys(_WRITE_PATH, "running")
        body = b"x" * 256
        statuses: dict[str, int] = {}
        # four segments and more: the fourth and later are the allocator's to make
        while client.positions()["reserved"] < 4 * SEGMENT + SEGMENT // 2:
            r = client.put("boot", body, wait_store=False)
            statuses[r.status.name] = statuses.get(r.status.name, 0) + 1
            assert r.status is PutMessageStatus.PUT_OK, (r.reason, statuses)
    opener.join(60)
    assert not opener.is_alive()
