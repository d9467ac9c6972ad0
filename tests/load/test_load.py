"""Load: many producers on one shared supervisor (`pytest -n 4 tests/load`).

Every xdist worker attaches as a client; some tests add producers of their own (threads
sharing a client, forked children, spawned processes). Every acknowledgement is written
to the worker's JSON-lines file; the session's controller checks them all against the
log at the end (see conftest.py). Loops are bounded in count.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from mqstore import PutMessageStatus, PutResult, StoreClient

pytestmark = pytest.mark.load

OK = PutMessageStatus.PUT_OK
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "solo")


def _ack_line(key: str, repeat: int, topic: str, r: PutResult) -> str:
    return json.dumps(
        {
            "key": key,
            "repeat": repeat,
            "topic": topic,
            "offset": r.physical_offset,
            "queue_id": r.queue_id,
            "queue_offset": r.queue_offset,
            "msg_id": r.msg_id,
            "uniq_key": r.uniq_key,
        }
    )


def _produce(
    store_dir: Path, acks: Path, tag: str, count: int, *, wait_store: bool, batch: int = 1
) -> list[str]:
    lines: list[str] = []
    topics = [f"load-{i}" for i in range(3)]
    with StoreClient.attach(store_dir) as client:
        i = 0
        while i < count:
            n = min(batch, count - i)
            msgs: list[dict[str, Any]] = []
            for j in range(i, i + n):
                key = f"{tag}-{j}|"
                repeat = 1 + j % 40
                msgs.append({"topic": topics[j % 3], "body": key.encode() * repeat, "keys": key})
            if n == 1:
                results = [client.put(**msgs[0], wait_store=wait_store)]
            else:
                results = client.put_batch(msgs, wait_store=wait_store)
            for m, r in zip(msgs, results, strict=True):
                assert r.status is OK, (r.status, r.reason)
                key = m["keys"]
                lines.append(_ack_line(key, len(m["body"]) // len(key), m["topic"], r))
            i += n
    with open(acks, "a") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def _child(store_dir: str, acks: str, tag: str, count: int) -> None:
    _produce(Path(store_dir), Path(acks), tag, count, wait_store=True)


@pytest.mark.parametrize("round_", range(4))
def test_sync_producer(load_root: Path, round_: int) -> None:
    tag = f"{WORKER}-sync-{round_}"
    _produce(load_root / "store", load_root / "acks" / f"{tag}.jsonl", tag, 1500, wait_store=True)


@pytest.mark.parametrize("round_", range(4))
def test_async_producer(load_root: Path, round_: int) -> None:
    tag = f"{WORKER}-async-{round_}"
    acks = load_root / "acks" / f"{tag}.jsonl"
    _produce(load_root / "store", acks, tag, 5000, wait_store=False)


@pytest.mark.parametrize("round_", range(2))
def test_batch_producer(load_root: Path, round_: int) -> None:
    tag = f"{WORKER}-batch-{round_}"
    acks = load_root / "acks" / f"{tag}.jsonl"
    _produce(load_root / "store", acks, tag, 4000, wait_store=round_ == 0, batch=32)


def test_threads_share_one_client(load_root: Path) -> None:
    tag = f"{WORKER}-threads"
    lines: list[str] = []
    errors: list[BaseException] = []
    with StoreClient.attach(load_root / "store") as client:

        def run(t: int) -> None:
            try:
                for j in range(400):
                    key = f"{tag}-{t}-{j}|"
                    r = client.put("load-threads", key.encode() * 3, wait_store=j % 2 == 0)
                    assert r.status is OK, r.reason
                    lines.append(_ack_line(key, 3, "load-threads", r))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors, errors
    (load_root / "acks" / f"{tag}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_child_processes(load_root: Path, method: str) -> None:
    ctx = multiprocessing.get_context(method)
    procs = []
    for k in range(3):
        tag = f"{WORKER}-{method}-{k}"
        acks = load_root / "acks" / f"{tag}.jsonl"
        procs.append(
            ctx.Process(target=_child, args=(str(load_root / "store"), str(acks), tag, 600))
        )
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0


def test_forked_child_of_an_attached_client(load_root: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    tag = f"{WORKER}-inherit"
    acks = load_root / "acks" / f"{tag}.jsonl"
    client = StoreClient.attach(load_root / "store")
    try:
        r = client.put("load-inherit", f"{tag}-parent|".encode())
        assert r.status is OK
        acks.write_text(_ack_line(f"{tag}-parent|", 1, "load-inherit", r) + "\n")

        def child() -> None:
            got = client.put("load-inherit", f"{tag}-child|".encode())
            assert got.status is OK, got.reason
            with open(acks, "a") as f:
                f.write(_ack_line(f"{tag}-child|", 1, "load-inherit", got) + "\n")
            client.close()

        p = ctx.Process(target=child)
        p.start()
        p.join(120)
        assert p.exitcode == 0
        assert client.put("load-inherit", b"parent again").status is OK
    finally:
        client.close()
