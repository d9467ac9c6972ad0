"""The columns of `spark.read.format("mqstore")`: one row per record.

Every field of `engine.record.DecodedRecord`, with the same names and meanings, plus
`problem`: null for a record that passes its checks, else why it does not (rows with a
problem appear only with `.option("includeCorrupt", "true")`). An unreadable byte range
(no record could be found in it) is one row with `physical_offset` = its start, `size` =
its length, `crc_ok` = false, `problem` set and the record fields null.

| column                      | Spark type          | notes                                   |
|-----------------------------|---------------------|-----------------------------------------|
| physical_offset             | bigint              | commit-log offset of the record         |
| size                        | int                 | TOTALSIZE                               |
| magic                       | bigint              | unsigned magic code (0xDAA320A7 / AB)   |
| body_crc                    | int                 | BODYCRC as stored                       |
| crc_ok                      | boolean             | stored CRC equals the body's            |
| queue_id                    | int                 |                                         |
| flag                        | int                 |                                         |
| queue_offset                | bigint              |                                         |
| sys_flag                    | int                 |                                         |
| born_timestamp              | bigint              | epoch milliseconds                      |
| born_host                   | string              | `ip:port`, IPv6 as `[ip]:port`          |
| store_timestamp             | bigint              | epoch milliseconds                      |
| store_host                  | string              |                                         |
| reconsume_times             | int                 |                                         |
| prepared_transaction_offset | bigint              |                                         |
| topic                       | string              |                                         |
| body                        | binary              | the original bytes (a compressed body   |
|                             |                     | inflated, `engine.compression`)         |
| properties                  | map<string,string>  | RocketMQ's lenient parse                |
| tags                        | string              | properties["TAGS"]                      |
| keys                        | string              | properties["KEYS"] (space separated)    |
| msg_id                      | string              | upper-case hex, as `make_msg_id`        |
| compression                 | string              | codec the body was stored with: zlib,   |
|                             |                     | lz4, zstd; null: stored as given        |
| problem                     | string              | null unless the row is corrupt          |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

COLUMNS: tuple[tuple[str, str], ...] = (
    ("physical_offset", "bigint"),
    ("size", "int"),
    ("magic", "bigint"),
    ("body_crc", "int"),
    ("crc_ok", "boolean"),
    ("queue_id", "int"),
    ("flag", "int"),
    ("queue_offset", "bigint"),
    ("sys_flag", "int"),
    ("born_timestamp", "bigint"),
    ("born_host", "string"),
    ("store_timestamp", "bigint"),
    ("store_host", "string"),
    ("reconsume_times", "int"),
    ("prepared_transaction_offset", "bigint"),
    ("topic", "string"),
    ("body", "binary"),
    ("properties", "map<string,string>"),
    ("tags", "string"),
    ("keys", "string"),
    ("msg_id", "string"),
    ("compression", "string"),
    ("problem", "string"),
)

COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in COLUMNS)
RECORD_FIELDS: tuple[str, ...] = COLUMN_NAMES[:-1]  # those of engine.record.DecodedRecord

DDL = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)

PROPERTIES_TYPE = pa.map_(
    pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=True)
)

_ARROW_OF: dict[str, pa.DataType] = {
    "bigint": pa.int64(),
    "int": pa.int32(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
    "map<string,string>": PROPERTIES_TYPE,
}

ARROW_SCHEMA: pa.Schema = pa.schema([pa.field(n, _ARROW_OF[k], nullable=True) for n, k in COLUMNS])


def arrow_schema(columns: Sequence[str]) -> pa.Schema:
    """The Arrow schema of these columns, in this order (a query reads only some)."""
    if tuple(columns) == COLUMN_NAMES:
        return ARROW_SCHEMA
    return pa.schema([ARROW_SCHEMA.field(c) for c in columns])


def spark_schema() -> Any:
    """The same columns as a `pyspark.sql.types.StructType` (imports pyspark)."""
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(DDL)
