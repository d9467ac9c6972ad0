"""Helpers of the consuming commands (`query`, `offsets`, `group`): reads of a running store
through a `StoreClient` (bounded by its dispatched and durable positions), or of a
stopped one straight from the files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mqstore.conf.load import ConfigError, load_settings
from mqstore.engine.reader import StoreReader
from mqstore.engine.record_decode import DecodedRecord
from mqstore.ipc.channel import SupervisorUnavailable
from mqstore.ipc.client import StoreClient
from mqstore.ipc.locks import store_lock_holder
from mqstore.ipc.reads import ClientReads, for_client


class Reads:
    """`ClientReads` of the running store, else a `StoreReader` of the stopped one."""

    def __init__(self, store_dir: Path, config: Path | None) -> None:
        self.store_dir = store_dir
        self.client: StoreClient | None = None
        self.live: ClientReads | None = None
        self.offline: StoreReader | None = None
        if store_lock_holder(str(store_dir)) is not None:
            try:
                self.client = StoreClient.attach(store_dir)
            except SupervisorUnavailable:
                self.client = None
        if self.client is not None:
            self.live = for_client(self.client)
        else:
            settings = load_settings(store_dir, config, os.environ).settings
            self.offline = StoreReader.open(store_dir, settings)

    def max_offset(self, topic: str, queue_id: int) -> int:
        if self.live is not None:
            return self.live.max_offset(topic, queue_id)
        assert self.offline is not None
        return self.offline.max_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int) -> int:
        if self.live is not None:
            return self.live.min_offset(topic, queue_id)
        assert self.offline is not None
        return self.offline.min_offset(topic, queue_id)

    def offset_for_time(self, topic: str, queue_id: int, ts_ms: int) -> int:
        if self.live is not None:
            return self.live.offset_for_time(topic, queue_id, ts_ms)
        assert self.offline is not None
        return self.offline.offset_for_time(topic, queue_id, ts_ms)

    def query(
        self, topic: str, key: str, begin_ms: int, end_ms: int | None, max_count: int
    ) -> list[DecodedRecord]:
        if self.live is not None:
            return self.live.query(topic, key, begin_ms, end_ms, max_count)
        assert self.offline is not None
        if end_ms is None:
            return self.offline.query_by_key(topic, key, max_count, begin_ms)
        return self.offline.query_by_key(topic, key, max_count, begin_ms, end_ms)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
        if self.client is not None:
            self.client.close()
        if self.offline is not None:
            self.offline.close()

    def __enter__(self) -> Reads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_reads(cmd: str, store_dir: Path, config: Path | None) -> Reads | None:
    """Reads of the store, or print why not (stderr) and return None."""
    if not os.path.isdir(os.path.join(store_dir, "commitlog")):
        print(f"mqstore {cmd}: {store_dir} is not a store (no commitlog/)", file=sys.stderr)
        return None
    try:
        return Reads(store_dir, config)
    except (ConfigError, OSError, ValueError) as e:
        print(f"mqstore {cmd}: {e}", file=sys.stderr)
        return None
