"""SIGHUP: the supervisor re-reads mqstore.toml and forwards the signal; the supervisor
and every worker take the reloadable settings and report the others as ignored."""

from __future__ import annotations

import signal

from tests.runtime.conftest import StoreFactory
from tests.runtime.harness import wait_for, write_config

WORKERS = ("allocator", "committer", "flusher", "dispatcher", "cleaner", "scheduler")


def test_sighup_reloads_intervals_and_ignores_the_rest(make_store: StoreFactory) -> None:
    store = make_store()
    store.wait_workers_running()
    assert store.status()["settings"]["flush_interval_ms"] == 500
    write_config(
        store.path,
        {**store.config, "flush_interval_ms": 37, "transient_store_pool_size": 4},
    )
    assert store.proc is not None
    store.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: store.status()["settings"]["flush_interval_ms"] == 37, 60, "the new interval")
    for name in ("start", *WORKERS):
        wait_for(
            lambda name=name: (
                f"mqstore {name}: reloaded settings: flush_interval_ms=37" in store.output()
            ),
            60,
            f"{name} to reload",
        )
        assert (
            f"<4>WARNING mqstore {name}: ignored until restart (not reloadable): "
            "transient_store_pool_size" in store.output()
        )
    st = store.status()
    assert st["pool"]["buffers"] == 3  # not reloadable: unchanged
    assert all(w["state"] == "running" and w["restarts"] == 0 for w in st["workers"])
    assert store.stop() == 0


def test_a_broken_config_on_sighup_keeps_the_settings(make_store: StoreFactory) -> None:
    store = make_store()
    store.wait_workers_running()
    (store.path / "mqstore.toml").write_text("[store]\nflush_interval_ms = -5\n")
    assert store.proc is not None
    store.proc.send_signal(signal.SIGHUP)
    wait_for(
        lambda: "<3>ERROR mqstore start: reload failed, settings kept" in store.output(),
        60,
        "the reload failure",
    )
    assert store.status()["settings"]["flush_interval_ms"] == 500
    assert store.stop() == 0
