"""Access control of a running store: owner-only files and shared memory, a group option,
other users refused (a forked child that drops its privileges, where the tests run as
root), and segments the store did not create refused."""

from __future__ import annotations

import json
import os
import stat
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from mqstore import StoreAccessDenied, StoreClient
from mqstore.ipc import access, channel
from mqstore.ipc import control as c
from mqstore.ipc.reservation import LIVE_LOCK
from mqstore.ipc.session import _attach_checked
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store
from tests.runtime.other_user import NOBODY, ROOT_ONLY, as_user


def _mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _names(store: Store) -> dict[str, object]:
    doc: dict[str, object] = json.loads((store.path / access.NAMES_FILE).read_text())
    return doc


def test_what_a_store_creates_is_owner_only(store: Store) -> None:
    store.wait_workers_running()
    assert _mode(store.path) == 0o700
    names = _names(store)
    assert _mode(store.path / access.NAMES_FILE) == 0o600
    for name in (names["ctl"], names["pool"]):
        st = os.stat(Path("/dev/shm") / str(name).lstrip("/"))
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, os.getuid()), name
    for lock in ("lock", LIVE_LOCK):
        assert _mode(store.path / lock) == 0o600, lock
    for seg in (store.path / "commitlog").iterdir():
        assert _mode(seg) == 0o600, seg
    # names carry a random part: two boots of the same store never share one
    first = names["ctl"]
    assert store.stop() == 0
    store.start()
    assert _names(store)["ctl"] != first


def test_the_group_option_shares_with_the_store_directory_group(
    make_store: StoreFactory,
) -> None:
    store = make_store({"ipc_allow_group": True})
    gid = os.stat(store.path).st_gid
    assert _mode(store.path) == 0o2750
    assert _mode(store.path / access.NAMES_FILE) == 0o640
    assert _mode(store.path / LIVE_LOCK) == 0o660
    names = _names(store)
    for name in (names["ctl"], names["pool"]):
        st = os.stat(Path("/dev/shm") / str(name).lstrip("/"))
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, gid), name
    with StoreClient.attach(store.path) as client:
        assert client.put("t", b"x", queue_id=0).ok


@ROOT_ONLY
def test_another_user_is_refused_and_the_store_carries_on(store: Store) -> None:
    store.wait_workers_running()
    path = store.path

    def attach() -> str:
        with StoreClient.attach(path):
            return "attached"

    def stop() -> str:
        return json.dumps(channel.request(path, {"op": "stop"}))

    got = as_user(attach, NOBODY, NOBODY)
    assert got.startswith("SupervisorRefused: "), got
    assert "permission denied" in got, got
    assert as_user(stop, NOBODY, NOBODY).startswith("SupervisorRefused: ")
    # nothing changed: the store runs and takes puts from its owner
    assert store.status()["flags"] == ["running"]
    with StoreClient.attach(path) as client:
        assert client.put("t", b"owner", queue_id=0).ok


@ROOT_ONLY
def test_a_member_of_the_group_attaches_with_the_option(shared_dir: Path) -> None:
    path = shared_dir / "store"
    path.mkdir(mode=0o700)
    os.chown(path, -1, NOBODY)  # the store's group: the child's
    store = Store(path, {"ipc_allow_group": True})
    store.start()
    try:

        def put() -> str:
            with StoreClient.attach(path) as client:
                return client.put("t", b"from the group", queue_id=0).status.name

        assert as_user(put, NOBODY, NOBODY) == "PUT_OK"
    finally:
        assert store.stop() == 0
    assert store.shm_leftovers() == []
    bodies = [r.body for r in store.read_log() if r.topic == "t"]
    assert bodies == [b"from the group"]


@ROOT_ONLY
def test_segments_the_store_did_not_create_are_refused(store: Store) -> None:
    store.wait_workers_running()
    path = str(store.path)
    names = _names(store)
    # the real ones pass
    _attach_checked(path, str(names["ctl"]), str(names["pool"])).close()
    # a segment squatted by another user
    squat = shared_memory.SharedMemory(f"mqs-squat-{os.getpid()}", create=True, size=4096)
    try:
        os.chown(f"/dev/shm/{squat.name.lstrip('/')}", NOBODY, NOBODY)
        with pytest.raises(StoreAccessDenied, match="belongs to uid 65534"):
            access.check_segment(squat.name.lstrip("/"), path)
        os.chown(f"/dev/shm/{squat.name.lstrip('/')}", os.getuid(), os.getgid())
        os.chmod(f"/dev/shm/{squat.name.lstrip('/')}", 0o666)
        with pytest.raises(StoreAccessDenied, match="open to other users"):
            access.check_segment(squat.name.lstrip("/"), path)
    finally:
        squat.close()
        squat.unlink()
    # names the store's names file does not record
    with pytest.raises(StoreAccessDenied, match="names file"):
        _attach_checked(path, "mqs-someone-else-ctl", "")
    # the right names, but a block without the store's nonce
    doc = dict(names)
    doc["nonce"] = int(str(names["nonce"])) + 1
    (store.path / access.NAMES_FILE).write_text(json.dumps(doc))
    with pytest.raises(StoreAccessDenied, match="nonce"):
        _attach_checked(path, str(names["ctl"]), str(names["pool"]))
    (store.path / access.NAMES_FILE).write_text(json.dumps(names))
    assert c.OFF_NONCE == 480  # documented in ipc/control.py's layout table
