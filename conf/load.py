"""Load `StoreSettings` from defaults <- TOML <- broker.conf <- env, with provenance.

`load_settings` is the public entry point; it reads at most two small files.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conf.settings import FlushDiskType, StoreSettings

FIELDS = {f.name: f for f in dataclasses.fields(StoreSettings)}
RMQ_TO_FIELD = {
    f.metadata["rocketmq_key"]: n for n, f in FIELDS.items() if f.metadata["rocketmq_key"]
}


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


def _parse_properties(path: Path) -> list[tuple[str, str, int]]:
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
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
    return values


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
            data = tomllib.loads(config_path.read_text(encoding="utf-8"))
            table = data.get("store", data)
            for key, raw in table.items():
                if key not in FIELDS:
                    raise ConfigError(
                        f"{key}: unknown setting in {config_path}; allowed: {sorted(FIELDS)}"
                    )
                values[key] = _coerce(key, raw, str(config_path))
                sources[key] = str(config_path)
        else:
            for key, raw, lineno in _parse_properties(config_path):
                src = f"{config_path}:{lineno}"
                name = RMQ_TO_FIELD.get(key)
                if name is None:
                    ignored.append(f"{key} ({src})")
                    continue
                values[name] = _coerce(name, raw, src)
                sources[name] = src
    for name in FIELDS:
        var = f"MQSTORE_{name.upper()}"
        if env is not None and var in env:
            values[name] = _coerce(name, env[var], f"env {var}")
            sources[name] = f"env {var}"
    settings = StoreSettings(**_normalise(values))
    return LoadedSettings(settings, sources, tuple(ignored))
