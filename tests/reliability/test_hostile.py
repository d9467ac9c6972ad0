"""Hostile input: hypothesis-driven puts (extreme topics, properties, sizes, batch shapes,
unicode) are each stored exactly or refused with a clear status and reason, and the store
stays writable; malformed frames on the supervisor's stream socket (random bytes, huge
lengths, half-sent frames, vanishing clients) neither crash nor stall it: other clients
carry on; and no datagram anyone sends can acknowledge a put the flusher did not flush."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import PutMessageStatus, StoreClient
from mqstore.engine.record import PROPERTY_KEYS, PROPERTY_TAGS
from mqstore.ipc import channel
from tests.reliability.conftest import FIGURES, StoreFactory, sized
from tests.runtime.harness import Store

REFUSALS = {
    PutMessageStatus.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
}
MAX_BODY = 64 * 1024
CONFIG = {"max_message_size_bytes": MAX_BODY, "segment_size_bytes": 1 << 20}

text = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", "\x00", "\x01", "\x02", "a\x01b\x02c", " ", "%RETRY%t", "\U0001f600" * 40, "x" * 127,
     "y" * 128, "é" * 64, "KEYS", "TAGS", "UNIQ_KEY", "\ud7ff", "a" * 40000]
)  # fmt: skip
bodies = (
    st.binary(max_size=300)
    | st.sampled_from([b"", b"\0" * 1000])
    | st.builds(
        lambda n: b"b" * n, st.sampled_from([MAX_BODY - 1, MAX_BODY, MAX_BODY + 1, 200_000])
    )
)
message = st.fixed_dictionaries(
    {"topic": text, "body": bodies},
    optional={
        "tags": text,
        "keys": text | st.lists(text, max_size=4),
        "properties": st.dictionaries(text, text, max_size=6),
        "queue_id": st.integers(-3, 70) | st.sampled_from([1 << 31, -(1 << 40)]),
    },
)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store(tmp_path_factory.mktemp("hostile") / "store", CONFIG)
    s.start()
    try:
        yield s
    finally:
        code = s.stop()
        assert s.shm_leftovers() == []
        assert code == 0, s.output()[-2000:]


def _expect_stored(store: Store, m: dict[str, Any], r: Any) -> None:
    from mqstore.engine.commitlog import CommitLog

    cl = CommitLog.open(store.path / "commitlog", CONFIG["segment_size_bytes"], read_only=True)
    try:
        res = cl.read(r.physical_offset)
        rec = res.record
        assert rec is not None, (m, r, res)
    finally:
        cl.close()
    assert rec.topic == m["topic"] and rec.body == m["body"], (m, r)
    assert rec.crc_ok
    for k, v in (m.get("properties") or {}).items():
        if k not in (PROPERTY_KEYS, PROPERTY_TAGS):
            assert rec.properties.get(k) == v, (k, v, rec.properties)
    if m.get("tags") not in (None, ""):
        assert rec.properties.get(PROPERTY_TAGS) == m["tags"], (m, rec.properties)


def _check(store: Store, m: dict[str, Any], r: Any) -> None:
    FIGURES["inputs fuzzed"] += 1
    if r.ok:
        FIGURES["inputs stored exactly"] += 1
        _expect_stored(store, m, r)
    else:
        FIGURES["inputs refused"] += 1
        assert r.status in REFUSALS, (m, r)
        assert r.reason, (m, r)


@settings(
    max_examples=sized(60, 1500), deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)  # fmt: skip
@given(msgs=st.lists(message, min_size=1, max_size=12), batch=st.booleans())
def test_hostile_puts_are_stored_exactly_or_refused(
    running: Store, msgs: list[dict[str, Any]], batch: bool
) -> None:
    with StoreClient.attach(running.path) as client:
        if batch:
            rs = client.put_batch(msgs)
            if not all(r.ok for r in rs):  # all or nothing: one status for all
                assert len({r.status for r in rs}) == 1, rs
            for m, r in zip(msgs, rs, strict=True):
                _check(running, m, r)
        else:
            for m in msgs:
                _check(running, m, client.put(**m))
        assert client.put("still-writable", b"ok").ok


def _sup_alive(store: Store) -> None:
    assert store.proc is not None and store.proc.poll() is None, store.output()[-2000:]
    assert store.status()["flags"] == ["running"]
    with StoreClient.attach(store.path) as c:
        assert c.put("after-frames", b"x").ok


def _send_frames(
    store: Store, frames: list[bytes], rng: random.Random, *, whole: bool = False
) -> None:
    held: list[socket.socket] = []
    try:
        for i, f in enumerate(frames):
            s = channel.connect(store.path, timeout_s=5)
            with contextlib.suppress(OSError):  # the supervisor may drop a bad client
                s.sendall(
                    f if whole or rng.random() < 0.5 else f[: max(1, len(f) // 2)]
                )  # half-sent
            if rng.random() < 0.2:
                held.append(s)  # stays connected, silent
            else:
                s.close()  # vanishes
            FIGURES["frames fuzzed (supervisor)"] += 1
            if i % 10 == 0:
                _sup_alive(store)
        _sup_alive(store)  # while silent half-frame clients are still connected
    finally:
        for s in held:
            s.close()
    _sup_alive(store)


def test_malformed_frames_on_the_supervisor_socket(make_store: StoreFactory, seed: int) -> None:
    rng = random.Random(seed)
    store = make_store(CONFIG)
    frames: list[bytes] = [
        b"", b"\n", b"{}\n", b"{\n", b'{"op": "nope"}\n', b'{"op": 7}\n', b'{"op": "attach"}\n',
        b'{"op": "attach", "pid": -1}\n', b'{"op": "attach", "pid": "x"}\n',
        b'{"op": "status"', b"\xff\xfe\x00\n" * 10,
        json.dumps({"op": "status", "pad": "x" * 100_000}).encode() + b"\n",
        b"{" * 5000 + b"\n",  # deep nesting
        b"x" * (4 << 20),  # a huge line that never ends
    ]  # fmt: skip
    # random bytes; every line starts with 0x80, so none is valid JSON (non-object JSON
    # has its own test below)
    frames += [
        b"\x80" + rng.randbytes(rng.randrange(1, 4096)).replace(b"\n", b"\n\x80")
        for _ in range(sized(40, 1000))
    ]
    _send_frames(store, frames, rng)


@pytest.mark.parametrize("frame", [b"42\n", b"[]\n", b"null\n", b'"op"\n'])
def test_non_object_json_on_the_supervisor_socket(tmp_path: Path, frame: bytes, seed: int) -> None:
    store = Store(tmp_path / "store", CONFIG)
    store.start()
    try:
        _send_frames(store, [frame], random.Random(seed), whole=True)
    finally:
        if store.proc is not None and store.proc.poll() is not None:
            store.proc = None
            store._log.close()
            store.start()  # removes what the crashed run left in /dev/shm
        store.stop()
        assert store.shm_leftovers() == []


def _my_datagram_sockets() -> list[str]:
    """The abstract addresses of this process's Unix sockets (what a local attacker can
    find in /proc/net/unix and send to)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    out = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[6] in inodes and parts[7].startswith("@"):
                out.append("\0" + parts[7][1:])
    return out


def test_no_datagram_acknowledges_a_put_the_flusher_did_not_flush(
    make_store: StoreFactory,
) -> None:
    """With the flusher stopped, forged acknowledgements (the old reply layout: request id,
    flushed offset, status OK, for every plausible id) sent to every Unix socket the
    producer holds cannot make a sync put PUT_OK: it times out, and succeeds once the
    flusher runs again. Before the futex wait, a forged reply was taken as PUT_OK."""
    store = make_store({"flush_disk_type": "SYNC_FLUSH", "sync_flush_timeout_ms": 1500})
    store.wait_workers_running()
    flusher = next(w for w in store.status()["workers"] if w["name"] == "flusher")["pid"]
    with StoreClient.attach(store.path) as client:
        assert client.put("forge", b"warm").ok
        os.kill(flusher, signal.SIGSTOP)
        try:
            got: list[Any] = []
            t = threading.Thread(target=lambda: got.append(client.put("forge", b"x")))
            t.start()
            forged = [struct.pack("<qqi", rid, 1 << 40, 0) for rid in range(64)]
            deadline = time.monotonic() + 1.0
            sent = 0
            while time.monotonic() < deadline and t.is_alive():
                for addr in _my_datagram_sockets():
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    for d in forged:
                        with contextlib.suppress(OSError):
                            s.sendto(d, addr)
                            sent += 1
                    s.close()
                time.sleep(0.01)
            t.join(30)
            assert got and got[0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT, (got, sent)
        finally:
            os.kill(flusher, signal.SIGCONT)
        r = client.put("forge", b"y")
        assert r.status is PutMessageStatus.PUT_OK, r.reason
