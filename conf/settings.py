"""Every store setting mqstore uses, typed, with units in the names.

Defaults are RocketMQ 4.9.8's `MessageStoreConfig` values, with one deliberate
exception: sizes are small enough for a laptop (commit-log segment 64 MiB
instead of 1 GiB; transient pool 5 buffers of segment size, as RocketMQ; index
500_000 slots x 2_000_000 entries instead of 5_000_000 x 20_000_000).
Each field's metadata carries its RocketMQ key, unit, whether it is
reloadable on SIGHUP, and a description.

Pure data: no I/O. Loading lives in `conf.load`. Anyone may import this.
"""

# ruff: noqa: RUF009  (`_f` returns dataclasses.field with metadata)
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class FlushDiskType(Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


def _f(default: Any, rmq: str | None, unit: str, desc: str, *, reloadable: bool = False) -> Any:
    return field(
        default=default,
        metadata={"rocketmq_key": rmq, "unit": unit, "reloadable": reloadable, "description": desc},
    )


MIB = 1024 * 1024


@dataclass(frozen=True)
class StoreSettings:
    """The effective settings of one store. Frozen; use `replace` to derive."""

    flush_disk_type: FlushDiskType = _f(
        FlushDiskType.ASYNC_FLUSH, "flushDiskType", "enum", "ASYNC_FLUSH or SYNC_FLUSH"
    )
    segment_size_bytes: int = _f(
        64 * MIB,
        "mappedFileSizeCommitLog",
        "bytes",
        "Commit-log segment size. LAPTOP EXCEPTION: RocketMQ default is 1 GiB.",
    )
    consume_queue_file_size_bytes: int = _f(
        300_000 * 20,
        "mappedFileSizeConsumeQueue",
        "bytes",
        "Consume-queue file size, rounded up to a multiple of 20.",
    )
    sync_flush_timeout_ms: int = _f(
        5000, "syncFlushTimeout", "ms", "Sync flush wait", reloadable=True
    )
    flush_interval_ms: int = _f(
        500, "flushIntervalCommitLog", "ms", "Flush period", reloadable=True
    )
    flush_least_pages: int = _f(
        4, "flushCommitLogLeastPages", "pages", "Min dirty pages", reloadable=True
    )
    flush_thorough_interval_ms: int = _f(
        10_000, "flushCommitLogThoroughInterval", "ms", "Forced full flush period", reloadable=True
    )
    flush_timed: bool = _f(False, "flushCommitLogTimed", "bool", "Sleep vs wait", reloadable=True)
    commit_interval_ms: int = _f(
        200, "commitIntervalCommitLog", "ms", "Commit period", reloadable=True
    )
    commit_least_pages: int = _f(
        4, "commitCommitLogLeastPages", "pages", "Min pages", reloadable=True
    )
    commit_thorough_interval_ms: int = _f(
        200, "commitCommitLogThoroughInterval", "ms", "Forced commit period", reloadable=True
    )
    transient_store_pool_enable: bool = _f(
        True,
        "transientStorePoolEnable",
        "bool",
        "Write to pooled buffers then commit. mqstore default True (RocketMQ False).",
    )
    transient_store_pool_size: int = _f(5, "transientStorePoolSize", "buffers", "Pool buffers")
    fast_fail_if_no_buffer_in_store_pool: bool = _f(
        False, "fastFailIfNoBufferInStorePool", "bool", "Reject when pool empty", reloadable=True
    )
    os_page_cache_busy_timeout_ms: int = _f(
        1000, "osPageCacheBusyTimeOutMills", "ms", "Put-lock hold limit", reloadable=True
    )
    warm_mapped_file_enable: bool = _f(False, "warmMapedFileEnable", "bool", "Pre-touch files")
    flush_least_pages_when_warm: int = _f(
        4096, "flushLeastPagesWhenWarmMapedFile", "pages", "Flush stride when warming"
    )
    max_message_size_bytes: int = _f(
        4 * MIB, "maxMessageSize", "bytes", "Max message", reloadable=True
    )
    check_crc_on_recover: bool = _f(
        True, "checkCRCOnRecover", "bool", "Verify body CRC on recovery"
    )
    file_reserved_time_hours: int = _f(
        72, "fileReservedTime", "hours", "Retention", reloadable=True
    )
    delete_when: tuple[int, ...] = _f((4,), "deleteWhen", "hours", "Delete hours", reloadable=True)
    disk_max_used_space_ratio_pct: int = _f(
        75, "diskMaxUsedSpaceRatio", "percent", "Clamped to [10,95]", reloadable=True
    )
    disk_space_warning_level_ratio: float = _f(
        0.90, "rocketmq.broker.diskSpaceWarningLevelRatio", "ratio", "Disk full warning"
    )
    disk_space_clean_forcibly_ratio: float = _f(
        0.85, "rocketmq.broker.diskSpaceCleanForciblyRatio", "ratio", "Forced clean"
    )
    clean_resource_interval_ms: int = _f(10_000, "cleanResourceInterval", "ms", "Clean period")
    delete_commitlog_files_interval_ms: int = _f(
        100, "deleteCommitLogFilesInterval", "ms", "Pause between deletes", reloadable=True
    )
    delete_consume_queue_files_interval_ms: int = _f(
        100, "deleteConsumeQueueFilesInterval", "ms", "Pause between deletes", reloadable=True
    )
    destroy_mapped_file_interval_forcibly_ms: int = _f(
        120_000, "destroyMapedFileIntervalForcibly", "ms", "Forced destroy", reloadable=True
    )
    redelete_hanged_file_interval_ms: int = _f(
        120_000, "redeleteHangedFileInterval", "ms", "Redelete hanged", reloadable=True
    )
    clean_file_forcibly_enable: bool = _f(True, "cleanFileForciblyEnable", "bool", "Forced clean")
    delete_file_batch_max: int = _f(10, "deleteFileBatchMax", "files", "Max per pass")
    flush_consume_queue_interval_ms: int = _f(
        1000, "flushIntervalConsumeQueue", "ms", "CQ flush period", reloadable=True
    )
    flush_consume_queue_least_pages: int = _f(
        2, "flushConsumeQueueLeastPages", "pages", "CQ min pages", reloadable=True
    )
    flush_consume_queue_thorough_interval_ms: int = _f(
        60_000, "flushConsumeQueueThoroughInterval", "ms", "CQ full flush", reloadable=True
    )
    message_index_enable: bool = _f(True, "messageIndexEnable", "bool", "Build index")
    message_index_safe: bool = _f(False, "messageIndexSafe", "bool", "Safe index recovery")
    max_hash_slot_num: int = _f(
        500_000, "maxHashSlotNum", "slots", "Index slots. LAPTOP: RocketMQ 5_000_000"
    )
    max_index_num: int = _f(
        2_000_000, "maxIndexNum", "entries", "Index entries. LAPTOP: RocketMQ 20_000_000"
    )
    max_msgs_num_batch: int = _f(64, "maxMsgsNumBatch", "messages", "Query batch", reloadable=True)
    default_query_max_num: int = _f(32, "defaultQueryMaxNum", "messages", "Query max")
    default_topic_queue_nums: int = _f(4, "defaultTopicQueueNums", "queues", "Queues per topic")
    store_host: str = _f("127.0.0.1:10911", None, "ip:port", "Store host for records/msg ids")
    metrics_port: int = _f(0, "metricsPromExporterPort", "port", "0 = off")
    metrics_host: str = _f(
        "127.0.0.1",
        "metricsPromExporterHost",
        "ip",
        "Metrics bind address: 127.0.0.1 this machine only; 0.0.0.0 or :: every interface",
    )

    ipc_allow_group: bool = _f(
        False,
        None,
        "bool",
        "Let the store directory's group attach (shm, lock, names 0660/0640, dir 02750)",
    )
    heartbeat_interval_ms: int = _f(500, None, "ms", "Worker heartbeat period")
    heartbeat_timeout_ms: int = _f(5000, None, "ms", "Worker presumed dead after this")
    restart_backoff_initial_ms: int = _f(100, None, "ms", "Supervisor first restart delay")
    restart_backoff_max_ms: int = _f(10_000, None, "ms", "Supervisor restart delay cap")

    def replace(self, **changes: Any) -> StoreSettings:
        return dataclasses.replace(self, **changes)


def settings_doc(s: StoreSettings) -> dict[str, Any]:
    """The settings as plain JSON values (enums by value, tuples as lists), named as the
    fields: what `config show --json` prints and what the supervisor sends at attach."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        out[f.name] = v.value if isinstance(v, Enum) else list(v) if isinstance(v, tuple) else v
    return out


def settings_from_doc(doc: dict[str, Any]) -> StoreSettings:
    """The inverse of `settings_doc`, for a client given the settings of a running store.
    Raises KeyError or ValueError for a document that is not one (a newer supervisor's
    extra fields are skipped, so an older client still attaches)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(StoreSettings):
        v = doc[f.name]
        if isinstance(f.default, Enum):
            v = type(f.default)(v)
        elif isinstance(f.default, tuple):
            v = tuple(v)
        values[f.name] = v
    return StoreSettings(**values)


def settings_reference_markdown() -> str:
    """Every setting as a Markdown table, for the generated docs page."""
    lines = [
        "| setting | RocketMQ key | default | unit | reloadable | description |",
        "|---|---|---|---|---|---|",
    ]
    for f in dataclasses.fields(StoreSettings):
        m = f.metadata
        d = f.default.value if isinstance(f.default, Enum) else f.default
        lines.append(
            f"| `{f.name}` | {m['rocketmq_key'] or '-'} | `{d}` | {m['unit']} | "
            f"{'yes' if m['reloadable'] else 'no'} | {m['description']} |"
        )
    return "\n".join(lines) + "\n"
