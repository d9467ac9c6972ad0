"""Every store setting mqstore uses, typed, with units in the names.

Defaults are RocketMQ 4.9.8's `MessageStoreConfig` values, with one deliberate
exception: sizes are small enough for a laptop (commit-log segment 64 MiB
instead of 1 GiB; transient pool 5 buffers of segment size, as RocketMQ; index
500_000 slots x 2_000_000 entries instead of 5_000_000 x 20_000_000). Where
MessageStoreConfig writes a default as a product (`1000 * 120` ms), so does `StoreSettings`.
`StoreSettings` gives each setting its type and default; `INFO`, one table, its
RocketMQ key, unit, whether SIGHUP reloads it, and a description.

Pure data: no I/O. Loading lives in `conf.load`. Anyone may import this.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:  # the type checker sees the dataclass that engine.frozen's behaves as
    from dataclasses import dataclass
else:  # no `dataclasses` (and its `inspect`) at a producer's import
    from mqstore.engine.frozen import dataclass


class FlushDiskType(Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


MIB = 1024 * 1024


@dataclass(frozen=True)
class StoreSettings:
    """The effective settings of one store. Frozen; use `replace` to derive. What each
    one means, its RocketMQ key and whether SIGHUP reloads it: `INFO` (the table below)."""

    # the commit log
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    segment_size_bytes: int = 64 * MIB
    consume_queue_file_size_bytes: int = 300_000 * 20

    # flushing (the flusher)
    sync_flush_timeout_ms: int = 1000 * 5
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 1000 * 10
    flush_timed: bool = False

    # committing the write pool (the committer)
    commit_interval_ms: int = 200
    commit_least_pages: int = 4
    commit_thorough_interval_ms: int = 200

    # the write pool and the put path
    transient_store_pool_enable: bool = True
    transient_store_pool_size: int = 5
    fast_fail_if_no_buffer_in_store_pool: bool = False
    os_page_cache_busy_timeout_ms: int = 1000
    warm_mapped_file_enable: bool = False
    flush_least_pages_when_warm: int = 4096
    sync_flush_zero_segments: bool = True
    commit_backlog_max_bytes: int = 32 * MIB
    commit_backlog_grace_ms: int = 1000
    commit_backlog_drain_ms: int = 0
    max_message_size_bytes: int = 4 * MIB
    check_crc_on_recover: bool = True
    compress_type: str = "NONE"
    compress_level: int = 5
    compress_msg_body_over_howmuch_bytes: int = 4 * 1024

    # retention and disk space (the cleaner)
    file_reserved_time_hours: int = 72
    delete_when: tuple[int, ...] = (4,)
    disk_max_used_space_ratio_pct: int = 75
    disk_space_warning_level_ratio: float = 0.90
    disk_space_clean_forcibly_ratio: float = 0.85
    clean_resource_interval_ms: int = 10_000
    delete_commitlog_files_interval_ms: int = 100
    delete_consume_queue_files_interval_ms: int = 100
    destroy_mapped_file_interval_forcibly_ms: int = 1000 * 120
    redelete_hanged_file_interval_ms: int = 1000 * 120
    clean_file_forcibly_enable: bool = True
    delete_file_batch_max: int = 10

    # consume queues and the index (the dispatcher)
    flush_consume_queue_interval_ms: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval_ms: int = 1000 * 60
    message_index_enable: bool = True
    message_index_safe: bool = False
    max_hash_slot_num: int = 500_000
    max_index_num: int = 500_000 * 4  # 4 entries per slot, as RocketMQ's 5_000_000 * 4
    max_msgs_num_batch: int = 64
    default_query_max_num: int = 32
    default_topic_queue_nums: int = 4

    # delayed messages (the scheduler)
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    flush_delay_offset_interval_ms: int = 1000 * 10

    # mqstore's own: addresses, sharing, workers
    store_host: str = "127.0.0.1:10911"
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    ipc_allow_group: bool = False
    heartbeat_interval_ms: int = 500
    heartbeat_timeout_ms: int = 5000
    restart_backoff_initial_ms: int = 100
    restart_backoff_max_ms: int = 10_000
    store_nice: int = -10
    store_slice_us: int = 100
    flusher_rt_priority: int = 0

    def replace(self, **changes: Any) -> StoreSettings:
        import dataclasses

        return dataclasses.replace(self, **changes)


class SettingInfo(NamedTuple):
    """What the table says of a setting besides its type and default (`StoreSettings`).
    A `NamedTuple`: a dataclass's decoration is compiled at every producer's import."""

    rocketmq_key: str | None  # None: mqstore's own
    unit: str
    reloadable: bool  # SIGHUP re-reads it; otherwise it changes at the next start
    description: str


SIGHUP, RESTART = True, False

# fmt: off
_TABLE: tuple[tuple[str, str | None, str, bool, str], ...] = (
    # (setting, RocketMQ key, unit,
    #  SIGHUP or RESTART, description), in the order of the fields of StoreSettings
    ("flush_disk_type", "flushDiskType", "enum",
     RESTART, "ASYNC_FLUSH or SYNC_FLUSH"),
    ("segment_size_bytes", "mappedFileSizeCommitLog", "bytes",
     RESTART, "Commit-log segment size. LAPTOP EXCEPTION: RocketMQ default is 1 GiB."),
    ("consume_queue_file_size_bytes", "mappedFileSizeConsumeQueue", "bytes",
     RESTART, "Consume-queue file size, rounded up to a multiple of 20."),
    ("sync_flush_timeout_ms", "syncFlushTimeout", "ms",
     SIGHUP, "Sync flush wait"),
    ("flush_interval_ms", "flushIntervalCommitLog", "ms",
     SIGHUP, "Flush period"),
    ("flush_least_pages", "flushCommitLogLeastPages", "pages",
     SIGHUP, "Min dirty pages"),
    ("flush_thorough_interval_ms", "flushCommitLogThoroughInterval", "ms",
     SIGHUP, "Forced full flush period"),
    ("flush_timed", "flushCommitLogTimed", "bool",
     SIGHUP, "Sleep vs wait"),
    ("commit_interval_ms", "commitIntervalCommitLog", "ms",
     SIGHUP, "How often at most a commit wakes the flusher. The committer commits as puts "
             "arrive (RocketMQ's put wakes it), the rest at its first tick without new puts"),
    ("commit_least_pages", "commitCommitLogLeastPages", "pages",
     SIGHUP, "Min pages"),
    ("commit_thorough_interval_ms", "commitCommitLogThoroughInterval", "ms",
     SIGHUP, "Forced commit period"),
    ("transient_store_pool_enable", "transientStorePoolEnable", "bool",
     RESTART, "Write to pooled buffers then commit. mqstore default True (RocketMQ False)."),
    ("transient_store_pool_size", "transientStorePoolSize", "buffers",
     RESTART, "Pool buffers"),
    ("fast_fail_if_no_buffer_in_store_pool", "fastFailIfNoBufferInStorePool", "bool",
     SIGHUP, "Reject when pool empty"),
    ("os_page_cache_busy_timeout_ms", "osPageCacheBusyTimeOutMills", "ms",
     SIGHUP, "Put-lock hold limit"),
    ("warm_mapped_file_enable", "warmMapedFileEnable", "bool",
     RESTART, "Pre-touch files"),
    ("flush_least_pages_when_warm", "flushLeastPagesWhenWarmMapedFile", "pages",
     RESTART, "Flush stride when warming"),
    ("sync_flush_zero_segments", None, "bool",
     RESTART, "SYNC_FLUSH: the allocator writes each new commit-log segment with zeros, so "
              "a sync fdatasync converts no unwritten extent (docs/durability.md)"),
    ("commit_backlog_max_bytes", None, "bytes",
     RESTART, "Pool on: once the log reserved ahead of the committed position has been this "
              "many bytes or more for commit_backlog_grace_ms, a put waits until it is under this "
              "again: while the committer moves, up to the longer of sync_flush_timeout_ms and "
              "os_page_cache_busy_timeout_ms; OS_PAGECACHE_BUSY once the committed position "
              "stood still for os_page_cache_busy_timeout_ms. So readers, who follow the "
              "commit, trail producers that outrun the committer by about this much, not by a "
              "pool (docs/tuning.md). 0: no bound"),
    ("commit_backlog_grace_ms", None, "ms",
     RESTART, "How long a commit backlog may stay at commit_backlog_max_bytes before puts "
              "wait for it: a burst shorter than this fills the pool at the producer's speed "
              "(each producer counts from when it saw the bound; the count starts again once "
              "the backlog is under half the bound)"),
    ("commit_backlog_drain_ms", None, "ms",
     SIGHUP, "Pool on, with commit_backlog_max_bytes > 0: the committer publishes the bytes it "
             "commits in this many ms at its recent copy pace, and a put waits at a commit "
             "backlog that large (at least 4 MiB), grace or not, so a committer that slows "
             "down (new page-cache pages that cost a host fault each, late in a run on a VM "
             "that reports free memory) throttles producers and readers trail it by about "
             "this long, not by what a grace let through (docs/tuning.md). 0 (the default: "
             "50 ms cut batch_1m's 1 GB/s burst to a third): no such bound, only "
             "commit_backlog_max_bytes and its grace"),
    ("max_message_size_bytes", "maxMessageSize", "bytes",
     SIGHUP, "Max message"),
    ("check_crc_on_recover", "checkCRCOnRecover", "bool",
     RESTART, "Verify body CRC on recovery"),
    ("compress_type", None, "enum",
     RESTART, "Body compression in the put (RocketMQ's producer: rocketmq.message.compressType): "
              "NONE, ZLIB, LZ4 or ZSTD, in RocketMQ's stream formats and sysFlag bits "
              "(engine/compression.py). mqstore default NONE (RocketMQ's producer: ZLIB). A body "
              "is stored compressed only when that makes it smaller; reads give the original"),
    ("compress_level", None, "level",
     RESTART, "Codec level (the producer's rocketmq.message.compressLevel): ZLIB -1 to 9, LZ4 "
              "0 to 16 (RocketMQ's LZ4 ignores it), ZSTD -7 to 22"),
    ("compress_msg_body_over_howmuch_bytes", None, "bytes",
     RESTART, "Compress bodies of at least this many bytes (the producer's "
              "compressMsgBodyOverHowmuch), with compress_type not NONE"),
    ("file_reserved_time_hours", "fileReservedTime", "hours",
     SIGHUP, "Retention"),
    ("delete_when", "deleteWhen", "hours",
     SIGHUP, "Delete hours"),
    ("disk_max_used_space_ratio_pct", "diskMaxUsedSpaceRatio", "percent",
     SIGHUP, "Clamped to [10,95]"),
    ("disk_space_warning_level_ratio", "rocketmq.broker.diskSpaceWarningLevelRatio", "ratio",
     RESTART, "Disk full warning"),
    ("disk_space_clean_forcibly_ratio", "rocketmq.broker.diskSpaceCleanForciblyRatio", "ratio",
     RESTART, "Forced clean"),
    ("clean_resource_interval_ms", "cleanResourceInterval", "ms",
     RESTART, "Clean period"),
    ("delete_commitlog_files_interval_ms", "deleteCommitLogFilesInterval", "ms",
     SIGHUP, "Pause between deletes"),
    ("delete_consume_queue_files_interval_ms", "deleteConsumeQueueFilesInterval", "ms",
     SIGHUP, "Pause between deletes"),
    ("destroy_mapped_file_interval_forcibly_ms", "destroyMapedFileIntervalForcibly", "ms",
     SIGHUP, "Forced destroy"),
    ("redelete_hanged_file_interval_ms", "redeleteHangedFileInterval", "ms",
     SIGHUP, "Redelete hanged"),
    ("clean_file_forcibly_enable", "cleanFileForciblyEnable", "bool",
     RESTART, "Forced clean"),
    ("delete_file_batch_max", "deleteFileBatchMax", "files",
     RESTART, "Max per pass"),
    ("flush_consume_queue_interval_ms", "flushIntervalConsumeQueue", "ms",
     SIGHUP, "CQ flush period"),
    ("flush_consume_queue_least_pages", "flushConsumeQueueLeastPages", "pages",
     SIGHUP, "CQ min pages"),
    ("flush_consume_queue_thorough_interval_ms", "flushConsumeQueueThoroughInterval", "ms",
     SIGHUP, "CQ full flush"),
    ("message_index_enable", "messageIndexEnable", "bool",
     RESTART, "Build index"),
    ("message_index_safe", "messageIndexSafe", "bool",
     RESTART, "Safe index recovery"),
    ("max_hash_slot_num", "maxHashSlotNum", "slots",
     RESTART, "Index slots. LAPTOP: RocketMQ 5_000_000"),
    ("max_index_num", "maxIndexNum", "entries",
     RESTART, "Index entries. LAPTOP: RocketMQ 20_000_000"),
    ("max_msgs_num_batch", "maxMsgsNumBatch", "messages",
     SIGHUP, "Query batch"),
    ("default_query_max_num", "defaultQueryMaxNum", "messages",
     RESTART, "Query max"),
    ("default_topic_queue_nums", "defaultTopicQueueNums", "queues",
     RESTART, "Queues per topic"),
    ("message_delay_level", "messageDelayLevel", "levels",
     RESTART, "Delay of each delay level 1..N, space separated, each a number and s, m, h "
              "or d (RocketMQ's syntax). The scheduler re-puts a level's messages when due"),
    ("flush_delay_offset_interval_ms", "flushDelayOffsetInterval", "ms",
     RESTART, "Longest time between two writes of config/delayOffset.json (the scheduler "
              "also writes it after every round that delivered)"),
    ("store_host", None, "ip:port",
     RESTART, "Store host for records/msg ids"),
    ("metrics_port", "metricsPromExporterPort", "port",
     RESTART, "0 = off"),
    ("metrics_host", "metricsPromExporterHost", "ip",
     RESTART, "Metrics bind address: 127.0.0.1 this machine only; 0.0.0.0 or :: every interface"),
    ("ipc_allow_group", None, "bool",
     RESTART, "Let the store directory's group attach (shm, lock, names 0660/0640, dir 02750)"),
    ("heartbeat_interval_ms", None, "ms",
     RESTART, "Worker heartbeat period"),
    ("heartbeat_timeout_ms", None, "ms",
     RESTART, "Worker presumed dead after this"),
    ("restart_backoff_initial_ms", None, "ms",
     RESTART, "Supervisor first restart delay"),
    ("restart_backoff_max_ms", None, "ms",
     RESTART, "Supervisor restart delay cap"),
    ("store_nice", None, "nice",
     RESTART, "CPU priority of the supervisor and its workers (and of its session's autogroup "
              "when it leads one): ahead of the producers they serve. Below 0 needs "
              "CAP_SYS_NICE; refused, the store runs at the default (workers/priority.py)"),
    ("store_slice_us", None, "us",
     RESTART, "Scheduler time slice the supervisor and its workers ask for (Linux 6.12+ "
              "EEVDF custom slice): a shorter slice than the producers' lets a woken flusher "
              "run at once instead of after the running producer's slice. 0: the kernel's "
              "default; an older kernel ignores it (workers/priority.py)"),
    ("flusher_rt_priority", None, "priority",
     RESTART, "Under SYNC_FLUSH, the flusher runs SCHED_FIFO at this real-time priority "
              "(1-99), so a woken round never waits for a CPU behind producers; it sleeps "
              "instead of yielding between rounds. 0: off. Needs CAP_SYS_NICE; refused, it "
              "runs as the other workers (workers/priority.py)"),
)
# fmt: on

INFO: Final[Mapping[str, SettingInfo]] = MappingProxyType(
    {name: SettingInfo(key, unit, reload, desc) for name, key, unit, reload, desc in _TABLE}
)
# The settings' names in field order, each one's default a class attribute (as a dataclass
# keeps it): what `dataclasses.fields(StoreSettings)` says, without importing dataclasses.
_NAMES: Final[tuple[str, ...]] = tuple(StoreSettings.__annotations__)
if list(INFO) != list(_NAMES):
    raise RuntimeError("conf.settings: the table and StoreSettings name other settings")


_DELAY_UNITS_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str) -> tuple[int, ...]:
    """`messageDelayLevel` ("1s 5s 10s ... 2h") as the delay of each level 1..N in ms, as
    RocketMQ's `ScheduleMessageService.parseDelayLevel` reads it (split on one space; each
    a whole number and one of s, m, h, d). Raises ValueError naming the bad item."""
    out: list[int] = []
    for item in spec.strip().split(" "):
        unit = _DELAY_UNITS_MS.get(item[-1:])
        num = item[:-1]
        if unit is None or not num.isascii() or not num.isdigit():
            raise ValueError(
                f"delay level {len(out) + 1} {item!r} is not a whole number followed by "
                "s, m, h or d"
            )
        out.append(int(num) * unit)
    if not 1 <= len(out) <= 64:
        raise ValueError(f"{len(out)} delay levels; 1 to 64 are allowed")
    return tuple(out)


def settings_doc(s: StoreSettings) -> dict[str, Any]:
    """The settings as plain JSON values (enums by value, tuples as lists), named as the
    fields: what `config show --json` prints and what the supervisor sends at attach."""
    out: dict[str, Any] = {}
    for name in _NAMES:
        v = getattr(s, name)
        out[name] = v.value if isinstance(v, Enum) else list(v) if isinstance(v, tuple) else v
    return out


def settings_from_doc(doc: dict[str, Any]) -> StoreSettings:
    """The inverse of `settings_doc`, for a client given the settings of a running store.
    Raises KeyError or ValueError for a document that is not one (a newer supervisor's
    extra fields are skipped, so an older client still attaches)."""
    values: dict[str, Any] = {}
    for name in _NAMES:
        v = doc[name]
        default = getattr(StoreSettings, name)
        if isinstance(default, Enum):
            v = type(default)(v)
        elif isinstance(default, tuple):
            v = tuple(v)
        values[name] = v
    return StoreSettings(**values)


def settings_reference_markdown() -> str:
    """Every setting as a Markdown table, for the generated docs page."""
    lines = [
        "| setting | RocketMQ key | default | unit | reloadable | description |",
        "|---|---|---|---|---|---|",
    ]
    for name in _NAMES:
        m = INFO[name]
        default = getattr(StoreSettings, name)
        d = default.value if isinstance(default, Enum) else default
        lines.append(
            f"| `{name}` | {m.rocketmq_key or '-'} | `{d}` | {m.unit} | "
            f"{'yes' if m.reloadable else 'no'} | {m.description} |"
        )
    return "\n".join(lines) + "\n"
