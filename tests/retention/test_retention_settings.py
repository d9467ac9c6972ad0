"""The retention and disk-guard settings, with RocketMQ's names, from broker.conf."""

from __future__ import annotations

from pathlib import Path

from mqstore.conf.load import load_settings
from mqstore.conf.settings import StoreSettings


def test_defaults_are_rocketmq_4_9_8() -> None:
    s = StoreSettings()
    assert s.delete_when == (4,)
    assert s.file_reserved_time_hours == 72
    assert s.clean_resource_interval_ms == 10_000
    assert s.delete_commitlog_files_interval_ms == 100
    assert s.delete_consume_queue_files_interval_ms == 100
    assert s.destroy_mapped_file_interval_forcibly_ms == 120_000
    assert s.redelete_hanged_file_interval_ms == 120_000
    assert s.disk_max_used_space_ratio_pct == 75
    assert s.clean_file_forcibly_enable is True
    assert s.disk_space_warning_level_ratio == 0.90
    assert s.disk_space_clean_forcibly_ratio == 0.85
    assert s.delete_file_batch_max == 10


def test_broker_conf_keys_and_system_property_names(tmp_path: Path) -> None:
    (tmp_path / "broker.conf").write_text(
        "deleteWhen=04;05\nfileReservedTime=48\ncleanResourceInterval=5000\n"
        "deleteCommitLogFilesInterval=10\ndestroyMapedFileIntervalForcibly=1000\n"
        "redeleteHangedFileInterval=2000\ndiskMaxUsedSpaceRatio=70\n"
        "cleanFileForciblyEnable=false\n"
        "rocketmq.broker.diskSpaceWarningLevelRatio=0.95\n"
        "rocketmq.broker.diskSpaceCleanForciblyRatio=0.80\n"
    )
    loaded = load_settings(tmp_path)
    s = loaded.settings
    assert loaded.ignored == ()
    assert s.delete_when == (4, 5)
    assert s.file_reserved_time_hours == 48
    assert s.clean_resource_interval_ms == 5000
    assert s.delete_commitlog_files_interval_ms == 10
    assert s.destroy_mapped_file_interval_forcibly_ms == 1000
    assert s.redelete_hanged_file_interval_ms == 2000
    assert s.disk_max_used_space_ratio_pct == 70
    assert s.clean_file_forcibly_enable is False
    assert s.disk_space_warning_level_ratio == 0.95
    assert s.disk_space_clean_forcibly_ratio == 0.80


def test_5x_config_keys_in_percent(tmp_path: Path) -> None:
    (tmp_path / "broker.conf").write_text(
        "diskSpaceWarningLevelRatio=92\ndiskSpaceCleanForciblyRatio=80\n"
    )
    s = load_settings(tmp_path).settings
    assert s.disk_space_warning_level_ratio == 0.92
    assert s.disk_space_clean_forcibly_ratio == 0.80
