"""Validation names the key, the value, the source and what is allowed; aliases; the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.conf.load import RMQ_TO_FIELD, ConfigError, load_settings
from mqstore.conf.rocketmq_keys import ROCKETMQ_KEYS

BROKER_CONFS = Path(__file__).resolve().parent.parent / "data" / "broker-conf"


@pytest.mark.parametrize(
    ("var", "raw", "allowed"),
    [
        ("MQSTORE_SEGMENT_SIZE_BYTES", "10", "1024 to"),
        ("MQSTORE_FLUSH_INTERVAL_MS", "0", "1 to"),
        ("MQSTORE_FLUSH_LEAST_PAGES", "-1", ">= 0"),
        ("MQSTORE_TRANSIENT_STORE_POOL_SIZE", "0", "1 to 1024"),
        ("MQSTORE_DISK_SPACE_WARNING_LEVEL_RATIO", "-0.5", "0.01 to 1.0"),
        ("MQSTORE_METRICS_PORT", "70000", "0 to 65535"),
        ("MQSTORE_STORE_HOST", "localhost", "ip:port"),
        ("MQSTORE_STORE_HOST", "10.0.0.1:0", "ip:port"),
    ],
)
def test_out_of_range_values_are_refused_with_key_value_source_and_allowed(
    var: str, raw: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(env={var: raw})
    msg = str(e.value)
    name = var.removeprefix("MQSTORE_").lower()
    assert msg.startswith(f"{name}: bad value")
    assert raw in msg
    assert f"env {var}" in msg
    assert allowed in msg


def test_broker_conf_error_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "broker.conf"
    p.write_text("brokerName=x\nflushDiskType=SOMETIMES\n")
    with pytest.raises(ConfigError, match=r"flush_disk_type.*SOMETIMES.*broker.conf:2.*SYNC_FLUSH"):
        load_settings(config_path=p)


def test_old_maped_spelling_and_the_real_store_geometry_files() -> None:
    s42 = load_settings(config_path=BROKER_CONFS / "broker-4.2-unit-store.conf").settings
    assert s42.segment_size_bytes == 8192
    assert s42.consume_queue_file_size_bytes == 200
    rust = load_settings(config_path=BROKER_CONFS / "rocketmq-rust-0.9-store.conf")
    assert rust.settings.segment_size_bytes == 4096
    assert (rust.settings.max_hash_slot_num, rust.settings.max_index_num) == (32, 128)
    assert rust.source_of("max_index_num").endswith("rocketmq-rust-0.9-store.conf:5")


def test_system_property_names_for_disk_ratios(tmp_path: Path) -> None:
    p = tmp_path / "broker.conf"
    p.write_text(
        "rocketmq.broker.diskSpaceWarningLevelRatio=0.8\n"
        "rocketmq.broker.diskSpaceCleanForciblyRatio=0.7\n"
    )
    s = load_settings(config_path=p).settings
    assert (s.disk_space_warning_level_ratio, s.disk_space_clean_forcibly_ratio) == (0.8, 0.7)


@given(st.integers(min_value=1024, max_value=2**31 - 1))
def test_any_in_range_segment_size_loads_as_given(size: int) -> None:
    loaded = load_settings(env={"MQSTORE_SEGMENT_SIZE_BYTES": str(size)})
    assert loaded.settings.segment_size_bytes == size
    assert loaded.source_of("segment_size_bytes") == "env MQSTORE_SEGMENT_SIZE_BYTES"


@given(st.integers(max_value=1023) | st.integers(min_value=2**31))
def test_any_out_of_range_segment_size_is_refused(size: int) -> None:
    with pytest.raises(ConfigError, match="segment_size_bytes"):
        load_settings(env={"MQSTORE_SEGMENT_SIZE_BYTES": str(size)})


def test_config_show_prints_values_and_sources(tmp_path: Path) -> None:
    conf = BROKER_CONFS / "broker-4.9-commitlog.conf"
    out = subprocess.run(
        [sys.executable, "-m", "mqstore", "config", "show", str(tmp_path), "--config",
         str(conf), "--json"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    assert doc["segment_size_bytes"]["value"] == 8192
    assert doc["segment_size_bytes"]["source"].endswith("broker-4.9-commitlog.conf:2")
    assert doc["flush_interval_ms"] == {"value": 500, "source": "default"}


def test_config_show_refuses_a_bad_file_with_exit_3(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("[store]\nflush_interval_ms = -5\n")
    out = _mqstore("config", "show", str(tmp_path), "--config", str(p))
    assert out.returncode == 3  # ExitCode.CONFIG_ERROR, as `mqstore start`
    assert "flush_interval_ms: bad value -5" in out.stderr


def _mqstore(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", *argv], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("command", ["start", "config"])
def test_a_misspelt_broker_conf_key_stops_start_and_config_show(
    tmp_path: Path, command: str
) -> None:
    """`flushDiskTyp=SYNC_FLUSH` used to run the store as ASYNC_FLUSH without a word."""
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=broker-a\nflushDiskTyp=SYNC_FLUSH\n")
    store = tmp_path / "store"
    store.mkdir()  # `start` refuses a missing directory (exit 4) before it reads the config
    argv = ["start", str(store)] if command == "start" else ["config", "show", str(store)]
    out = _mqstore(*argv, "--config", str(conf))
    said = out.stdout + out.stderr
    assert out.returncode == 3, said
    assert f"flushDiskTyp: unknown key at {conf}:2" in said
    assert "did you mean 'flushDiskType'?" in said
    assert "Traceback" not in said
    assert not (store / "lock").exists()  # refused before the store was touched


def test_a_whole_deployment_broker_conf_is_read_and_the_rest_listed_as_ignored() -> None:
    conf = BROKER_CONFS / "broker-4.9-deployment.conf"
    out = _mqstore("config", "show", "/nonexistent", "--config", str(conf), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["flush_disk_type"]["value"] == "SYNC_FLUSH"
    assert doc["file_reserved_time_hours"]["value"] == 48
    ignored = [entry.split(" ")[0] for entry in doc["ignored"]]
    assert "brokerName" in ignored
    assert "namesrvAddr" in ignored
    assert "storePathConsumeQueue" in ignored
    assert "flushDiskType" not in ignored
    assert len(ignored) == 23  # 26 keys, 3 read (deleteWhen, fileReservedTime, flushDiskType)


def test_mqstore_setting_names_are_read_from_broker_conf(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=a\nstore_host=10.0.0.9:10911\nheartbeat_interval_ms=250\n")
    loaded = load_settings(config_path=conf)
    assert loaded.settings.store_host == "10.0.0.9:10911"
    assert loaded.settings.heartbeat_interval_ms == 250
    assert loaded.source_of("heartbeat_interval_ms") == f"{conf}:3"


def test_an_unknown_toml_setting_suggests_the_closest(tmp_path: Path) -> None:
    conf = tmp_path / "mqstore.toml"
    conf.write_text("[store]\nflush_disk_typ = 'SYNC_FLUSH'\n")
    with pytest.raises(ConfigError, match=r"flush_disk_typ: .*did you mean 'flush_disk_type'"):
        load_settings(config_path=conf)


def test_every_key_mqstore_reads_is_a_known_rocketmq_key() -> None:
    """The table of RocketMQ keys and the settings' keys agree (a typo in either shows)."""
    read = {k for k in RMQ_TO_FIELD if not k.startswith("rocketmq.broker.")}
    assert read - ROCKETMQ_KEYS == set()


@pytest.mark.parametrize("command", ["start", "config"])
def test_a_missing_config_file_is_one_line_and_exit_3(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "missing.conf"
    store = tmp_path / "store"
    store.mkdir()  # `start` refuses a missing directory (exit 4) before it reads the config
    argv = ["start", str(store)] if command == "start" else ["config", "show", str(store)]
    out = _mqstore(*argv, "--config", str(missing))
    said = (out.stdout + out.stderr).strip()
    assert out.returncode == 3, said
    assert "Traceback" not in said
    assert len(said.splitlines()) == 1, said
    assert f"cannot read the config file {missing}: No such file or directory" in said


def test_a_config_file_that_is_not_toml_is_a_config_error(tmp_path: Path) -> None:
    conf = tmp_path / "mqstore.toml"
    conf.write_text("[store\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings(config_path=conf)


def test_metrics_host_must_be_an_ip_address(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("metricsPromExporterHost=::1\n")
    assert load_settings(tmp_path, conf, {}).settings.metrics_host == "::1"
    conf.write_text("metricsPromExporterHost=metrics.example\n")
    with pytest.raises(ConfigError, match=r"metrics_host: bad value 'metrics\.example'"):
        load_settings(tmp_path, conf, {})


def test_an_unknown_mqstore_environment_variable_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"MQSTORE_FLUSH_INTERVL_MS: unknown environment") as e:
        load_settings(env={"MQSTORE_FLUSH_INTERVL_MS": "100"})
    assert "MQSTORE_FLUSH_INTERVAL_MS" in str(e.value)
    # The fault and test switches are not settings, and are not refused.
    loaded = load_settings(env={"MQSTORE_CRASHPOINT": "copy-half:kill", "OTHER_X": "1"})
    assert loaded.settings == load_settings(env={}).settings


def test_the_commit_backlog_bound_is_validated_and_read_from_every_source(tmp_path: Path) -> None:
    """`commit_backlog_max_bytes` and `commit_backlog_grace_ms` (the put's flow control
    with the pool on): defaults, values from a TOML file and the environment, negative or
    out-of-range values refused naming the key, a misspelling refused with the name."""
    s = load_settings(env={}).settings
    assert (s.commit_backlog_max_bytes, s.commit_backlog_grace_ms) == (32 << 20, 1000)
    conf = tmp_path / "mqstore.toml"
    conf.write_text("[store]\ncommit_backlog_max_bytes = 0\ncommit_backlog_grace_ms = 0\n")
    loaded = load_settings(config_path=conf)
    assert (loaded.settings.commit_backlog_max_bytes, loaded.settings.commit_backlog_grace_ms) == (
        0,
        0,
    )
    env = load_settings(env={"MQSTORE_COMMIT_BACKLOG_MAX_BYTES": "1048576"}).settings
    assert env.commit_backlog_max_bytes == 1 << 20
    for var, raw, allowed in (
        ("MQSTORE_COMMIT_BACKLOG_MAX_BYTES", "-1", "0 to 2199023255552"),
        ("MQSTORE_COMMIT_BACKLOG_MAX_BYTES", str(2**41 + 1), "0 to 2199023255552"),
        ("MQSTORE_COMMIT_BACKLOG_GRACE_MS", "-5", "0 to 2147483647"),
        ("MQSTORE_COMMIT_BACKLOG_GRACE_MS", "soon", "int"),
    ):
        with pytest.raises(ConfigError) as e:
            load_settings(env={var: raw})
        msg = str(e.value)
        assert msg.startswith(f"{var.removeprefix('MQSTORE_').lower()}: bad value"), msg
        assert raw in msg and f"env {var}" in msg and allowed in msg, msg
    conf.write_text("[store]\ncommit_backlog_max_byte = 1\n")
    with pytest.raises(ConfigError, match=r"did you mean 'commit_backlog_max_bytes'"):
        load_settings(config_path=conf)
