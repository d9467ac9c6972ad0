"""Rows of the data source next to the plain reader's records, for comparisons."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mqstore.engine import record as rec
from mqstore.pipeline.schema import RECORD_FIELDS


def plain_row(d: rec.DecodedRecord) -> dict[str, Any]:
    """A decoded record (`engine.record.decode`) as a row of record fields."""
    return {name: getattr(d, name) for name in RECORD_FIELDS}


def normalise(row: Mapping[str, Any]) -> dict[str, Any]:
    """A data-source row (Arrow `to_pylist` or Spark `asDict`) as a row of record fields:
    properties as a dict, bodies as bytes."""
    out = {name: row[name] for name in RECORD_FIELDS}
    props = out["properties"]
    out["properties"] = dict(props) if props is not None else None
    if isinstance(out["body"], bytearray | memoryview):
        out["body"] = bytes(out["body"])
    return out


def by_offset(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return sorted((normalise(r) for r in rows), key=lambda r: int(r["physical_offset"]))
