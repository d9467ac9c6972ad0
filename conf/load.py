"""Load `StoreSettings` from defaults <- TOML <- broker.conf <- env, with provenance.

`load_settings` is the public entry point; it reads at most two small files.

A `broker.conf` key is read when mqstore implements it (its RocketMQ key, the 4.0-4.2
`maped` spelling, or mqstore's own setting name), listed as ignored when it is one of
RocketMQ's other keys (`conf.rocketmq_keys`), and refused otherwise, with the closest
known keys: a misspelt `flushDiskTyp` must not leave the store on ASYNC_FLUSH unseen. A
missing or unreadable file, bad TOML, an unknown TOML key and a bad value are all
`ConfigError`, which `mqstore start` and `config show` turn into exit 3.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from mqstore.conf.rocketmq_keys import ROCKETMQ_KEYS
from mqstore.conf.settings import INFO, FlushDiskType, StoreSettings, parse_delay_levels

FIELDS = {f.name: f for f in dataclasses.fields(StoreSettings)}
RMQ_TO_FIELD = {i.rocketmq_key: n for n, i in INFO.items() if i.rocketmq_key}
# RocketMQ 4.0-4.2 spelled the size keys "maped"; broker.conf files of that age still do.
for _old, _new in (
    ("mapedFileSizeCommitLog", "mappedFileSizeCommitLog"),
    ("mapedFileSizeConsumeQueue", "mappedFileSizeConsumeQueue"),
):
    if _new in RMQ_TO_FIELD:
        RMQ_TO_FIELD.setdefault(_old, RMQ_TO_FIELD[_new])

_INT32_MAX = 2**31 - 1
# Allowed ranges, inclusive. Fields not named here: by unit suffix (see `_bounds`).
_RANGES: dict[str, tuple[float, float]] = {
    "segment_size_bytes": (1024, _INT32_MAX),
    "consume_queue_file_size_bytes": (20, _INT32_MAX),
    **dict.fromkeys(
        (
            *("max_message_size_bytes", "sync_flush_timeout_ms", "flush_interval_ms"),
            *("commit_interval_ms", "max_hash_slot_num", "max_index_num"),
            *("heartbeat_interval_ms", "heartbeat_timeout_ms"),
        ),
        (1, _INT32_MAX),
    ),
    **dict.fromkeys(("transient_store_pool_size", "default_topic_queue_nums"), (1, 1024)),
    **dict.fromkeys(
        ("disk_space_warning_level_ratio", "disk_space_clean_forcibly_ratio"), (0.01, 1.0)
    ),
    "delete_file_batch_max": (1, 10_000),
    **dict.fromkeys(("max_msgs_num_batch", "default_query_max_num"), (1, 1_000_000)),
    "metrics_port": (0, 65_535),
    "compress_msg_body_over_howmuch_bytes": (0, _INT32_MAX),
    "compress_level": (-7, 22),
    "store_nice": (-20, 19),
    "store_slice_us": (0, 100_000),
    "flusher_rt_priority": (0, 99),
    # 0: no bound, no grace; a backlog never exceeds the pool (at most 1024 x 2 GiB)
    "commit_backlog_max_bytes": (0, 2**41),
    "commit_backlog_grace_ms": (0, _INT32_MAX),
    "commit_backlog_drain_ms": (0, _INT32_MAX),
}
# RocketMQ 5.x also reads the two disk ratios as plain config keys, in percent (90, 85).
RMQ_TO_FIELD.update(
    diskSpaceWarningLevelRatio="disk_space_warning_level_ratio",
    diskSpaceCleanForciblyRatio="disk_space_clean_forcibly_ratio",
)


class ConfigError(ValueError):
    """A setting is unknown or invalid; the message names key, value, source and what is allowed."""


@dataclass(frozen=True)
class LoadedSettings:
    settings: StoreSettings
    sources: Mapping[str, str]
    ignored: tuple[str, ...] = ()

    def source_of(self, name: str) -> str:
        return self.sources.get(name, "default")


def _coerce(name: str, raw: Any, source: str) -> Any:
    f = FIELDS[name]
    default = f.default
    try:
        if isinstance(default, FlushDiskType):
            return FlushDiskType(str(raw).strip())
        if isinstance(default, bool):
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("true", "false"):
                return s == "true"
            raise ValueError
        if isinstance(default, int):
            if isinstance(raw, bool):
                raise ValueError
            return int(str(raw).strip())
        if isinstance(default, float):
            v = float(str(raw).strip())
            if not math.isfinite(v):
                raise ValueError
            return v
        if isinstance(default, tuple):
            items = raw if isinstance(raw, list) else str(raw).split(";")
            hours = tuple(int(str(h).strip()) for h in items if str(h).strip())
            if not hours or any(not 0 <= h <= 23 for h in hours):
                raise ValueError
            return hours
        return str(raw).strip()
    except ValueError:
        allowed = type(default).__name__
        if isinstance(default, FlushDiskType):
            allowed = "ASYNC_FLUSH or SYNC_FLUSH"
        elif isinstance(default, tuple):
            allowed = "hours 0-23 separated by ';'"
        raise ConfigError(f"{name}: bad value {raw!r} from {source}; allowed: {allowed}") from None


def _bounds(name: str) -> tuple[float, float] | None:
    if name in _RANGES:
        return _RANGES[name]
    if isinstance(FIELDS[name].default, bool):
        return None
    if isinstance(FIELDS[name].default, int):
        return (0, 2**63 - 1)  # counts, pages, hours and intervals are never negative
    return None


def _validate(name: str, value: Any, source: str) -> None:
    """Raise ConfigError naming key, value, source and what is allowed."""
    bounds = _bounds(name)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        lo, hi = bounds
        allowed = f">= {lo}" if hi >= 2**62 else f"{lo} to {hi}"
        raise ConfigError(f"{name}: bad value {value!r} from {source}; allowed: {allowed}")
    if name == "store_host":
        host, sep, port = str(value).rpartition(":")
        ok = bool(sep) and port.isdigit() and 0 < int(port) < 65_536
        try:
            ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(
                f"{name}: bad value {value!r} from {source}; allowed: ip:port or [ipv6]:port"
            )

    if name == "message_delay_level":
        try:
            parse_delay_levels(str(value))
        except ValueError as e:
            raise ConfigError(f"{name}: bad value {value!r} from {source}; {e}") from None

    if name == "metrics_host":
        try:
            ipaddress.ip_address(str(value))
        except ValueError:
            raise ConfigError(
                f"{name}: bad value {value!r} from {source}; allowed: an IPv4 or IPv6 address"
            ) from None


def _read_text(path: Path) -> str:
    """The config file's text; a missing or unreadable file is a ConfigError (exit 3 at
    `mqstore start`), not a traceback."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"cannot read the config file {path}: {why}") from None


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.75)
    return f"; did you mean {' or '.join(repr(k) for k in close)}?" if close else ""


def _unknown_key(key: str, src: str) -> ConfigError:
    """A broker.conf key that is neither read by mqstore nor one of RocketMQ's."""
    known = {*RMQ_TO_FIELD, *FIELDS, *ROCKETMQ_KEYS}
    return ConfigError(
        f"{key}: unknown key at {src}: neither an mqstore setting nor a RocketMQ "
        f"broker or store key{_did_you_mean(key, known)}"
    )


# The MQSTORE_ variables that are not settings: fault injection, crash points, the
# flusher's trace and the test and build switches (docs/crash-points.md,
# tests/RELIABILITY.md, workers/flusher.py, the Makefile).
NON_SETTING_ENV: Final = frozenset(
    {
        "MQSTORE_CRASHPOINT",
        "MQSTORE_DURABLE_ROOT",
        "MQSTORE_DURABLE_SHADOW",
        "MQSTORE_FAULTS",
        "MQSTORE_FAULTS_AFTER",
        "MQSTORE_FAULTS_FOR",
        "MQSTORE_FLUSH_TRACE",
        "MQSTORE_LOAD_DIR",
        "MQSTORE_NATIVE_DEBUG",
        "MQSTORE_NATIVE_SO",
        "MQSTORE_REASON_FD",
        "MQSTORE_RELIABILITY_CYCLES",
        "MQSTORE_RELIABILITY_FULL",
        "MQSTORE_RELIABILITY_REPORT",
        "MQSTORE_RELIABILITY_SEED",
        "MQSTORE_SANITIZE",
        "MQSTORE_SYNC_WATCH",
    }
)


def _refuse_unknown_env(env: Mapping[str, str]) -> None:
    """An MQSTORE_ variable nobody reads is a typo that would silently keep a default."""
    known = {f"MQSTORE_{name.upper()}" for name in FIELDS} | NON_SETTING_ENV
    for var in sorted(env):
        if var.startswith("MQSTORE_") and var not in known:
            raise ConfigError(
                f"{var}: unknown environment variable: not an mqstore setting"
                f"{_did_you_mean(var, known)} (the settings are listed in docs/settings.md)"
            )


def _parse_properties(path: Path) -> list[tuple[str, str, int]]:
    out = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        s = line.strip()
        if not s or s[0] in "#!":
            continue
        sep = min((i for i in (s.find("="), s.find(":")) if i >= 0), default=-1)
        key, val = (s[:sep], s[sep + 1 :]) if sep >= 0 else (s, "")
        out.append((key.strip(), val.strip(), lineno))
    return out


def _normalise(values: dict[str, Any]) -> dict[str, Any]:
    if "consume_queue_file_size_bytes" in values:
        v = values["consume_queue_file_size_bytes"]
        values["consume_queue_file_size_bytes"] = -(-v // 20) * 20
    if "disk_max_used_space_ratio_pct" in values:
        values["disk_max_used_space_ratio_pct"] = min(
            95, max(10, values["disk_max_used_space_ratio_pct"])
        )
    for name in ("disk_space_warning_level_ratio", "disk_space_clean_forcibly_ratio"):
        if name in values and values[name] > 1:  # given in percent (5.x config keys)
            values[name] = values[name] / 100
    if "compress_type" in values:  # RocketMQ's CompressionType.of: trimmed, any case
        values["compress_type"] = str(values["compress_type"]).strip().upper()
    return values


COMPRESS_TYPES: Final = ("NONE", "ZLIB", "LZ4", "ZSTD")
# The levels each codec takes (engine.compression.LEVELS, kept here: conf imports nothing).
COMPRESS_LEVELS: Final = {"ZLIB": (-1, 9), "LZ4": (0, 16), "ZSTD": (-7, 22)}


def _validate_compression(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """The codec is one RocketMQ knows and the level one it takes (ConfigError)."""
    kind = values.get("compress_type", "NONE")
    src = sources.get("compress_type", "default")
    if kind not in COMPRESS_TYPES:
        raise ConfigError(
            f"compress_type: bad value {kind!r} from {src}; allowed: {', '.join(COMPRESS_TYPES)}"
        )
    if kind == "NONE":
        return
    level = values.get("compress_level", FIELDS["compress_level"].default)
    lo, hi = COMPRESS_LEVELS[kind]
    if not lo <= level <= hi:
        raise ConfigError(
            f"compress_level: bad value {level!r} from "
            f"{sources.get('compress_level', 'default')}; allowed with {kind}: {lo} to {hi}"
        )


def load_settings(
    store_dir: Path | None = None,
    config_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> LoadedSettings:
    """Effective settings and where each came from. Raises ConfigError."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    ignored: list[str] = []
    if config_path is None and store_dir is not None:
        for cand in ("mqstore.toml", "broker.conf"):
            if (store_dir / cand).is_file():
                config_path = store_dir / cand
                break
    if config_path is not None:
        if config_path.suffix == ".toml":
            try:
                data = tomllib.loads(_read_text(config_path))
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{config_path} is not valid TOML: {e}") from None
            table = data.get("store", data)
            for key, raw in table.items():
                if key not in FIELDS:
                    raise ConfigError(
                        f"{key}: unknown setting in {config_path}{_did_you_mean(key, FIELDS)}"
                        " (the settings are listed in docs/settings.md)"
                    )
                values[key] = _coerce(key, raw, str(config_path))
                sources[key] = str(config_path)
        else:
            for key, raw, lineno in _parse_properties(config_path):
                src = f"{config_path}:{lineno}"
                name = RMQ_TO_FIELD.get(key) or (key if key in FIELDS else None)
                if name is None:
                    if key not in ROCKETMQ_KEYS:
                        raise _unknown_key(key, src)
                    ignored.append(f"{key} ({src})")
                    continue
                values[name] = _coerce(name, raw, src)
                sources[name] = src
    if env is not None:
        _refuse_unknown_env(env)
    for name in FIELDS:
        var = f"MQSTORE_{name.upper()}"
        if env is not None and var in env:
            values[name] = _coerce(name, env[var], f"env {var}")
            sources[name] = f"env {var}"
    values = _normalise(values)
    for name, value in values.items():
        _validate(name, value, sources.get(name, "default"))
    _validate_compression(values, sources)
    settings = StoreSettings(**values)
    return LoadedSettings(settings, sources, tuple(ignored))
