from __future__ import annotations

from pathlib import Path

import pytest

from mqstore.conf.load import ConfigError, load_settings
from mqstore.conf.settings import FlushDiskType, StoreSettings


def test_defaults_match_rocketmq_where_they_should() -> None:
    s = StoreSettings()
    assert s.flush_interval_ms == 500
    assert s.sync_flush_timeout_ms == 5000
    assert s.disk_max_used_space_ratio_pct == 75
    assert s.consume_queue_file_size_bytes == 300_000 * 20
    assert s.segment_size_bytes == 64 * 1024 * 1024  # laptop exception


def test_broker_conf_comments_lists_and_ignored_keys(tmp_path: Path) -> None:
    p = tmp_path / "broker.conf"
    p.write_text(
        "! c\nbrokerName=a\n  flushDiskType = SYNC_FLUSH\n# c\ndeleteWhen=04;16\n"
        "mappedFileSizeConsumeQueue=7\ndiskMaxUsedSpaceRatio=99\n"
    )
    loaded = load_settings(store_dir=tmp_path)
    s = loaded.settings
    assert s.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert s.delete_when == (4, 16)
    assert s.consume_queue_file_size_bytes == 20
    assert s.disk_max_used_space_ratio_pct == 95
    assert loaded.source_of("delete_when").endswith("broker.conf:5")
    assert loaded.ignored and loaded.ignored[0].startswith("brokerName")


def test_env_overrides_toml(tmp_path: Path) -> None:
    p = tmp_path / "x.toml"
    p.write_text("[store]\nflush_interval_ms = 7\n")
    env = {"MQSTORE_FLUSH_INTERVAL_MS": "9"}
    assert load_settings(config_path=p).settings.flush_interval_ms == 7
    assert load_settings(config_path=p, env=env).source_of("flush_interval_ms").startswith("env")


def test_errors_name_key_value_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"flush_interval_ms.*'x'.*MQSTORE_FLUSH_INTERVAL_MS"):
        load_settings(env={"MQSTORE_FLUSH_INTERVAL_MS": "x"})
    p = tmp_path / "x.toml"
    p.write_text("nope = 1\n")
    with pytest.raises(ConfigError, match="nope"):
        load_settings(config_path=p)


def test_heartbeat_timeout_from_broker_conf(tmp_path: Path) -> None:
    """RocketMQ has no such key: broker.conf takes mqstore's own name, as for every
    setting without one (a Spark node may need more than the 5 s default)."""
    (tmp_path / "broker.conf").write_text("flushDiskType=SYNC_FLUSH\nheartbeat_timeout_ms=20000\n")
    loaded = load_settings(store_dir=tmp_path)
    assert loaded.settings.heartbeat_timeout_ms == 20_000
    assert loaded.source_of("heartbeat_timeout_ms").endswith("broker.conf:2")
