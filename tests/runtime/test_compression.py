"""Body compression through a real supervisor (issue 26, item 3): bodies of at least
`compress_msg_body_over_howmuch_bytes` are stored compressed with the store's codec and
the sysFlag bits RocketMQ 5.x's producer sets; every read (pull, zero-copy pull, get,
query, `mqstore get`, `dump`, `check`) gives the original bytes and says how it was
stored; batches too; bad settings stop the start with exit 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore import PutMessageStatus, StoreClient
from mqstore.engine import compression
from mqstore.engine.record import Message
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import REPO, Store, wait_for

OK = PutMessageStatus.PUT_OK
FLAGS = {"ZLIB": 0x301, "LZ4": 0x101, "ZSTD": 0x201}


def json_body(i: int, size: int = 16 * 1024) -> bytes:
    """A compressible JSON document of `size` bytes (padded with spaces)."""
    rows = []
    n = 0
    while True:
        row = {"id": i * 1000 + n, "user": f"user-{n % 97}", "event": "page_view", "ok": True}
        rows.append(row)
        n += 1
        doc = json.dumps({"batch": i, "rows": rows}).encode()
        if len(doc) >= size - 100:
            return doc + b" " * (size - len(doc))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("codec", ["ZLIB", "LZ4", "ZSTD"])
def test_bodies_over_the_threshold_are_stored_compressed_and_read_back_whole(
    make_store: StoreFactory, codec: str
) -> None:
    st = make_store({"compress_type": codec, "compress_level": 5})
    small = b"s" * 100
    big = json_body(1)
    with StoreClient.attach(st.path) as client:
        r_small = client.put("c", small, queue_id=0)
        r_big = client.put("c", big, queue_id=0, keys="big-one")
        got = client.put_batch([
            {"topic": "c", "body": json_body(2), "queue_id": 0},
            Message("c", json_body(3), queue_id=0),
            Message("c", json_body(4), queue_id=0, sys_flag=0x1),  # the caller's own flag
            {"topic": "c", "body": small, "queue_id": 0},
        ])  # fmt: skip
        assert [r.status for r in (r_small, r_big, *got)] == [OK] * 6
        assert r_big.size < len(big) // 3  # 16 KiB of JSON: at least 3x smaller
        want = [small, big, json_body(2), json_body(3), json_body(4), small]
        wait_for(lambda: client.max_offset("c", 0) == 6, what="the records dispatched")
        pulled = client.pull("c", 0, 0, 32)
        assert [m.body for m in pulled.messages] == want
        assert [m.compression for m in pulled.messages] == [
            None, codec.lower(), codec.lower(), codec.lower(), "zlib", None,
        ]  # fmt: skip
        with client.pull("c", 0, 0, 32, zero_copy=True) as views:
            assert [bytes(m.body) for m in views.messages] == want
        rec = client.get(r_big.physical_offset)
        assert rec is not None and rec.body == big and rec.sys_flag == FLAGS[codec]
        assert [m.body for m in client.query("c", "big-one")] == [big]
    assert st.stop() == 0
    raw = st.read_log()  # the records as stored
    assert [r.sys_flag for r in raw] == [0, FLAGS[codec], FLAGS[codec], FLAGS[codec], 0x1, 0]
    assert raw[1].body != big and compression.decompress(raw[1].body, raw[1].sys_flag) == big
    assert raw[4].body == json_body(4)  # flagged by its caller: stored as given

    out = cli("get", str(st.path), "--physical-offset", str(r_big.physical_offset))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["body"].encode(), doc["compression"]) == (big, codec.lower())
    out = cli("dump", str(st.path))
    assert out.returncode == 0, out.stderr
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [d["body"].encode() for d in docs] == want
    out = cli("check", str(st.path), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["summary"]["compressed"] == 4


def test_compression_off_stores_bodies_as_given(store: Store) -> None:
    big = json_body(7)
    with StoreClient.attach(store.path) as client:
        r = client.put("c", big)
        assert r.status is OK and r.size > len(big)
    assert store.stop() == 0
    (rec,) = store.read_log()
    assert (rec.body, rec.sys_flag) == (big, 0)


def test_threshold_is_inclusive_and_incompressible_bodies_stay_as_given(
    make_store: StoreFactory,
) -> None:
    st = make_store({"compress_type": "ZLIB", "compress_msg_body_over_howmuch_bytes": 1000})
    noise = os.urandom(5000)  # incompressible: zlib makes it larger
    with StoreClient.attach(st.path) as client:
        assert client.put("c", b"a" * 999, queue_id=0).status is OK
        assert client.put("c", b"a" * 1000, queue_id=0).status is OK
        assert (
            client.put("c", compression.compressor(compression.Codec.ZLIB, 9)(noise)).status is OK
        )
    assert st.stop() == 0
    flags = [r.sys_flag for r in st.read_log()]
    assert flags == [0, 0x301, 0]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"compress_type": "GZIP"}, "compress_type: bad value 'GZIP'"),
        ({"compress_type": "ZLIB", "compress_level": 12}, "allowed with ZLIB: -1 to 9"),
        ({"compress_level": 99}, "compress_level: bad value 99"),
        ({"compress_msg_body_over_howmuch_bytes": -1}, "compress_msg_body_over_howmuch_bytes"),
        ({"compress_typ": "ZLIB"}, "unknown setting"),
    ],
)
def test_bad_compression_settings_stop_the_start(
    tmp_path: Path, config: dict[str, object], words: str
) -> None:
    st = Store(tmp_path / "s", config)
    out = cli("start", str(st.path))
    assert out.returncode == 3, out.stdout + out.stderr
    assert words in out.stdout + out.stderr


def test_records_compressed_by_rocketmq_read_back_as_the_original(
    make_store: StoreFactory,
) -> None:
    """Bodies RocketMQ's own compressors wrote (golden files), put with the sysFlag its
    producer sets: stored as given (whatever the store's codec), read back inflated."""
    golden = REPO / "tests" / "data" / "golden"
    original = (golden / "body-16k.json").read_bytes()
    st = make_store({"compress_type": "LZ4"})
    msgs = [
        Message("rmq", (golden / f"body-16k.rocketmq-{c.lower()}.bin").read_bytes(), queue_id=0,
                sys_flag=flag)
        for c, flag in FLAGS.items()
    ]  # fmt: skip
    with StoreClient.attach(st.path) as client:
        assert [r.status for r in client.put_batch(msgs)] == [OK] * 3
        got = wait_for(lambda: client.pull("rmq", 0, 0).messages, what="the records dispatched")
        assert [m.body for m in got] == [original] * 3
        assert [m.compression for m in got] == ["zlib", "lz4", "zstd"]
    assert st.stop() == 0
    assert [r.body for r in st.read_log()] == [m.body for m in msgs]
