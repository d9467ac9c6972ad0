"""Statuses as exceptions, on request: `PutResult.raise_for_status()` and clients attached
with `raise_on_status=True`, through real puts against a real supervisor."""

from __future__ import annotations

import asyncio

import pytest

import mqstore
from mqstore import (
    AsyncStoreClient,
    FlushError,
    MessageIllegalError,
    PutError,
    PutMessageStatus,
    PutResult,
    ServiceUnavailableError,
    StoreClient,
)
from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import Store

FAMILIES: dict[PutMessageStatus, type[PutError]] = {
    PutMessageStatus.FLUSH_DISK_TIMEOUT: FlushError,
    PutMessageStatus.FLUSH_DISK_FAILED: FlushError,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: FlushError,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: FlushError,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ServiceUnavailableError,
    PutMessageStatus.OS_PAGECACHE_BUSY: ServiceUnavailableError,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ServiceUnavailableError,
    PutMessageStatus.MESSAGE_ILLEGAL: MessageIllegalError,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: MessageIllegalError,
    PutMessageStatus.UNKNOWN_ERROR: PutError,
}


def test_every_status_but_put_ok_raises_exactly_its_family() -> None:
    assert set(FAMILIES) == set(PutMessageStatus) - {PutMessageStatus.PUT_OK}
    ok = PutResult(PutMessageStatus.PUT_OK, msg_id="AB")
    assert ok.raise_for_status() is ok
    for status, family in FAMILIES.items():
        r = PutResult(status, "why it failed")
        with pytest.raises(PutError) as got:
            r.raise_for_status()
        assert type(got.value) is family, status
        assert got.value.result is r and got.value.status is status
        assert str(got.value) == f"{status.value}: why it failed"
    for name in ("PutError", "FlushError", "ServiceUnavailableError", "MessageIllegalError"):
        assert name in mqstore.__all__ and getattr(mqstore, name).__module__.startswith("mqstore")


def test_raise_on_status_raises_for_bad_input_and_writes_nothing(store: Store) -> None:
    with StoreClient.attach(store.path, raise_on_status=True) as client:
        with pytest.raises(MessageIllegalError) as got:
            client.put("", b"x")
        assert got.value.status is PutMessageStatus.MESSAGE_ILLEGAL and got.value.result.reason
        with pytest.raises(MessageIllegalError) as batch:
            client.put_batch([{"topic": "ok", "body": b"1"}, {"topic": "a/b", "body": b"2"}])
        assert len(batch.value.results) == 2
        assert "message 1 of the batch" in batch.value.result.reason
        assert client.positions()["reserved"] == 0  # nothing written
        r = client.put("ok", b"fine")  # PUT_OK returns as before
        assert r.status is PutMessageStatus.PUT_OK and r.msg_id
        rs = client.put_batch([{"topic": "ok", "body": b"a"}, {"topic": "ok", "body": b"b"}])
        assert [x.status for x in rs] == [PutMessageStatus.PUT_OK] * 2
    with StoreClient.attach(store.path) as plain:  # the default still returns statuses
        assert plain.put("", b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
    assert [r.body for r in store.read_log()] == [b"fine", b"a", b"b"]


def test_raise_on_status_raises_flush_and_unavailable_families(make_store: StoreFactory) -> None:
    st = make_store(env={"MQSTORE_FAULTS": "fdatasync:EIO", "MQSTORE_FAULTS_FOR": "flusher"})
    with StoreClient.attach(st.path, raise_on_status=True) as client:
        with pytest.raises(FlushError) as flush:
            client.put("t", b"never durable")
        assert flush.value.status is PutMessageStatus.FLUSH_DISK_FAILED
        assert flush.value.result.msg_id  # the record is in the log: where it went is told
        with pytest.raises(ServiceUnavailableError) as refused:
            client.put("t", b"refused")
        assert "read-only" in refused.value.result.reason
        with pytest.raises(ServiceUnavailableError):
            client.put_batch([{"topic": "t", "body": b"refused"}])
    assert st.stop() == 5


def test_async_client_raise_on_status(make_store: StoreFactory) -> None:
    st = make_store(env={"MQSTORE_FAULTS": "fdatasync:EIO", "MQSTORE_FAULTS_FOR": "flusher"})

    async def main() -> list[type[PutError]]:
        raised: list[type[PutError]] = []
        async with AsyncStoreClient.attach(st.path, raise_on_status=True) as aio:
            for put in (
                lambda: aio.put("", b"x"),
                lambda: aio.put("t", b"never durable", queue_id=0),
                lambda: aio.put_batch([{"topic": "t", "body": b"refused"}]),
            ):
                try:
                    await put()
                except PutError as e:
                    raised.append(type(e))
        return raised

    assert asyncio.run(main()) == [MessageIllegalError, FlushError, ServiceUnavailableError]
    assert st.stop() == 5


def test_until_ok_with_raise_on_status_raises_the_last_try(store: Store) -> None:
    """A status no retry changes ends `put_until_ok` and `put_batch_until_ok` at its first
    try; with `raise_on_status` they raise that try's `PutError` (all of its results), from
    the blocking and the asyncio client alike; without, they return it."""
    bad_batch = [{"topic": "ok", "body": b"1"}, {"topic": "a/b", "body": b"2"}]
    with StoreClient.attach(store.path, raise_on_status=True) as client:
        with pytest.raises(MessageIllegalError) as one:
            client.put_until_ok("", b"x")
        assert one.value.results == (one.value.result,) and one.value.result.reason
        with pytest.raises(MessageIllegalError) as batch:
            client.put_batch_until_ok(bad_batch)
        assert len(batch.value.results) == 2 and batch.value.result is batch.value.results[0]
        assert client.put_until_ok("ok", b"fine").status is PutMessageStatus.PUT_OK
    with StoreClient.attach(store.path) as plain:
        assert plain.put_until_ok("", b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
        got = plain.put_batch_until_ok(bad_batch)
        assert [r.status for r in got] == [PutMessageStatus.MESSAGE_ILLEGAL] * 2

    async def main() -> tuple[PutError, PutError, PutResult]:
        async with AsyncStoreClient.attach(store.path, raise_on_status=True) as aio:
            with pytest.raises(MessageIllegalError) as one:
                await aio.put_until_ok("", b"x")
            with pytest.raises(MessageIllegalError) as batch:
                await aio.put_batch_until_ok(bad_batch)
            return one.value, batch.value, await aio.put_until_ok("ok", b"async")

    one_a, batch_a, ok = asyncio.run(main())
    assert one_a.results == (one_a.result,) and len(batch_a.results) == 2
    assert ok.status is PutMessageStatus.PUT_OK
    assert [r.body for r in store.read_log()] == [b"fine", b"async"]
