"""The supervisor: `mqstore start DIR` runs one in the foreground.

Boot, in order (any failure halts with a message and a non-zero exit, never a loop, and
removes the shared memory and socket it made):
1. load the settings (CONFIG_ERROR on a bad one, or on file sizes other than those the
   store records or its files have: `engine.geometry`);
2. take `<store>/lock` exclusively (a second supervisor is refused, naming the holder);
3. write `abort`; recover (`engine.recovery`: normal, or abnormal when `abort` was
   already there): validate the tail with CRC, cut it where valid data ends, truncate
   and re-dispatch consume queues and index; the report goes to `recovery.json`, and the
   next queue offsets come from the consume queues; a store without a geometry record
   gets one;
4. remove shared memory left by a crashed run of this store, create the control block
   and the pool, seed positions and queue offsets, make the first files ready;
5. listen on the supervisor socket (`ipc.channel`: a socket file in the store
   directory, removed at the stop) and spawn one process per
   `WORKERS` spec.

Then it loops: accept attaches and status requests, watch worker exits and heartbeats,
restart a crashed worker with exponential backoff, halt on a worker's CONFIG_ERROR or
BOOT_ERROR, and never restart into false durability (READ_ONLY stays once set).

An attach is answered once the store's write path is up (`_write_path_down`): the
allocator and committer, and the flusher under SYNC_FLUSH, are running. Until then it
waits, up to the `wait_ms` the client asked for (its timeout), and is then answered with
an error naming each worker not up and why (`ipc.channel.WorkersNotUp` in the client):
a put needing the next segment or a pool buffer before they run failed
(CREATE_MAPPED_FILE_FAILED), though the store was only starting. A worker that was
running and crashed does not hold attaches while it comes back (`COMING_BACK_S`): the
segments and buffers it made ahead carry the puts meanwhile, and a put that needs more
waits osPageCacheBusyTimeOutMills like any other. One that stays down longer (a crash
loop, a restart stuck at boot) holds them as at boot. A halted one (read-only store)
does not: the attach is answered and puts say why they are refused.

On SIGTERM / SIGINT during recovery: recovery stops within a chunk of records and the
supervisor exits 0, `abort` left (the next start recovers again); recovery's progress
is logged about once a second and kept for `mqstore status` (`engine.recovery_progress`).

On SIGTERM / SIGINT (or `mqstore stop`): refuse writes, fence the reservation lock,
stop the workers (each drains), then its own final drain with bounded retries (fillers
for reservations nobody finished, commit, flush), the checkpoint, `abort` removed only
if everything reserved is on disk, shared memory unlinked. Exit 0, or FLUSH_FAILED (5)
when something could not be flushed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from mqstore import _native
from mqstore.conf.load import ConfigError, LoadedSettings, load_settings
from mqstore.conf.settings import FlushDiskType, settings_doc
from mqstore.engine import fileio, geometry, jsonconfig
from mqstore.engine.checkpoint import StoreCheckpoint
from mqstore.engine.fileio import StoreIOError
from mqstore.engine.indexfile import IndexGeometryError
from mqstore.engine.recovery import recover_store, write_report
from mqstore.engine.recovery_progress import ProgressReporter, RecoveryInterrupted
from mqstore.engine.segment import SegmentNameError, SegmentSizeError
from mqstore.engine.storedir import ABORT_FILE
from mqstore.ipc import access, idem
from mqstore.ipc import control as c
from mqstore.ipc.commit import LogFiles
from mqstore.ipc.control_views import Flags, Positions, Reservation
from mqstore.ipc.fence import (
    StoreInUse,
    fence,
    fresh_inodes,
    quiesce_leftovers,
    retire_leftovers,
)
from mqstore.ipc.locks import StoreLockHeld, take_store_lock
from mqstore.ipc.reservation import live_lock_path
from mqstore.workers import priority, sdnotify, stats
from mqstore.workers.allocator import ensure_segments
from mqstore.workers.base import (
    REASON_FD_ENV,
    WORKER_EXITED,
    WORKER_HALTED,
    WORKER_RUNNING,
    WORKER_STARTING,
    ExitCode,
    describe_exit,
    install_signal_flags,
    reload_settings,
    say,
    say_reload,
    setup_logging,
)
from mqstore.workers.control_socket import Conn, ControlServer
from mqstore.workers.group_coord import Coordinator
from mqstore.workers.heartbeat import HeartbeatJudge
from mqstore.workers.metrics import MetricsServer, StoreCollector
from mqstore.workers.sampling import PutSampling
from mqstore.workers.service import parse_reason

log = logging.getLogger("mqstore.supervisor")


@dataclass(frozen=True)
class StopBudget:
    """What a stop (`Supervisor.shutdown`) may take, step by step."""

    # A put holds the reservation lock for microseconds: a stopped (SIGSTOP) producer
    # that holds it this long is gone on without; a running one gets `worker_s`.
    fence_s: float = 1.0
    worker_s: float = 10.0  # from SIGTERM to every worker's exit, then SIGKILL
    drain_s: float = 3.0  # filling the reservations nobody finished
    flush_retries: int = 3  # the final commit and flush


STOP: Final = StopBudget()
TICK_S: Final = 0.05  # the main loop's longest wait
# A write-path worker that was running and crashed: how long its restart may take before
# attaches wait for it again (a single restart is the backoff's first 100 ms and a boot of
# 0.2-3 s; a crash loop's backoff grows to restart_backoff_max_ms).
COMING_BACK_S: Final = 5.0
# Fault injection for tests: with MQSTORE_FAULTS_FOR="flusher", the MQSTORE_FAULTS of the
# environment apply to the named workers only (not to the supervisor or the others).
FAULTS_FOR_ENV: Final = "MQSTORE_FAULTS_FOR"


@dataclass(frozen=True)
class WorkerSpec:
    """One service process: its name and `module:function` target (`main(ctx) -> int`)."""

    name: str
    target: str


# The services, one process each.
WORKERS: list[WorkerSpec] = [
    WorkerSpec("allocator", "mqstore.workers.allocator:main"),
    WorkerSpec("committer", "mqstore.workers.committer:main"),
    WorkerSpec("flusher", "mqstore.workers.flusher:main"),
    WorkerSpec("dispatcher", "mqstore.workers.dispatcher:main"),
    WorkerSpec("cleaner", "mqstore.workers.cleaner:main"),
    WorkerSpec("scheduler", "mqstore.workers.scheduler:main"),
]


@dataclass
class _Worker:
    spec: WorkerSpec
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    restart_at: float = 0.0
    last_exit: int | None = None
    halted: bool = False
    reason_fd: int = -1  # read end of the pipe the worker explains an IO_FAILED on
    judge: HeartbeatJudge | None = None
    # When it last stopped running (monotonic); -inf: it has not run yet (boot)
    down_since: float = float("-inf")


class BootError(Exception):
    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Supervisor:
    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        config: Path | None = None,
        metrics_port: int | None = None,
        create: bool = False,
    ) -> None:
        self.store_dir = os.path.realpath(os.fspath(store_dir))
        self.create = create
        self.config = config
        self.metrics_port = metrics_port
        self.metrics: MetricsServer | None = None
        self.reload_requested = False
        self.stopping = False
        self.exit_code: int = ExitCode.OK
        self.cb: c.ControlBlock | None = None
        self.workers: list[_Worker] = []
        self.puts = PutSampling()
        self.server = ControlServer(
            self.store_dir,
            lambda: self.settings.ipc_allow_group,
            self._handle,
            self._on_close,
            self._say,
        )
        self.groups = Coordinator(
            self.store_dir,
            self._say,
            lambda: self.settings.default_topic_queue_nums,
            lambda: 0o660 if jsonconfig.group_shared(self.store_dir) else 0o600,
        )
        self._lock_fd = -1
        self._ready_sent = False
        # Why the store turned read-only (`service.read_only_reason`), for status and
        # metrics: the first worker's reason; later ones are logged only.
        self.read_only: dict[str, str] | None = None

    # --- boot ---------------------------------------------------------------------------

    def _say(self, msg: str, level: str = "INFO") -> None:
        say("start", msg, level)

    def boot(self) -> None:
        if not self.create and not os.path.isdir(self.store_dir):
            # A mistyped path must not become a new, empty store beside the real one.
            raise BootError(
                ExitCode.BOOT_ERROR,
                f"{self.store_dir} does not exist: give --create to make a new store there",
            )
        try:
            loaded = load_settings(Path(self.store_dir), self.config, os.environ)
        except ConfigError as e:
            raise BootError(ExitCode.CONFIG_ERROR, f"configuration error: {e}") from e
        self.settings = s = loaded.settings
        if s.segment_size_bytes % 4096:
            raise BootError(ExitCode.CONFIG_ERROR, "segment_size_bytes must be a multiple of 4096")
        recorded = self._check_geometry(loaded)
        fileio.makedirs(self.store_dir)
        share = s.ipc_allow_group
        os.chmod(self.store_dir, access.modes(share)[1])  # 0700, or 02750 for the group
        try:
            self._lock_fd = take_store_lock(self.store_dir)
        except StoreLockHeld as e:
            raise BootError(ExitCode.BOOT_ERROR, str(e)) from e
        except OSError as e:  # a lock file that is a symbolic link (ELOOP), say
            raise BootError(ExitCode.BOOT_ERROR, f"cannot take the store lock: {e}") from e
        self._quiesce_old_generation()
        abort = os.path.join(self.store_dir, ABORT_FILE)
        was_dirty = os.path.exists(abort)
        fileio.write_file_atomic(abort, b"")
        end, offsets = self._recover(was_dirty)
        if not recorded:  # the store's first start: from now on it owns its geometry
            geometry.write_record(self.store_dir, self.geometry)
        if share:  # its members' clients read the topics and commit offsets there
            jsonconfig.share_config_dir(self.store_dir)
        pool_n = s.transient_store_pool_size if s.transient_store_pool_enable else 0
        self._retire_old_generation(end, was_dirty and pool_n == 0)
        generation = time.time_ns() // 1000 % 10**12
        geo = c.Geometry(s.segment_size_bytes, pool_n)
        nonce = secrets.randbits(62) + 1
        try:
            cb = c.ControlBlock.create(
                self.store_dir,
                generation,
                geo,
                token=secrets.token_hex(8),
                nonce=nonce,
                share_group=share,
            )
        except OSError as e:
            raise BootError(ExitCode.BOOT_ERROR, str(e)) from e
        self.cb = cb
        access.write_names(
            self.store_dir,
            {"ctl": cb.ctl_name, "pool": cb.pool_name, "nonce": nonce, "pid": os.getpid()},
            share,
        )
        # The producers' liveness bytes (ipc.reservation): every client opens this file.
        live = os.open(live_lock_path(self.store_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if share:
                access.share_with_group(live_lock_path(self.store_dir), self.store_dir, live)
            else:
                os.fchmod(live, 0o600)
        finally:
            os.close(live)
        Positions(cb).seed_positions(end)
        t0 = time.monotonic()
        noted = idem.rebuild(self.store_dir, cb, end, s.segment_size_bytes)
        if noted:
            self._say(
                f"{noted} recent puts' UNIQ_KEYs noted from the log for retries "
                f"({time.monotonic() - t0:.2f} s)"
            )
        for (topic, qid), nxt in offsets.items():
            row = cb.find_or_add_queue(topic.encode("utf-8"), qid)
            if row < 0:
                raise BootError(ExitCode.BOOT_ERROR, "too many queues for the control block")
            cb.set(cb.qrow_off(row) + 8, nxt)
        ensure_segments(self.store_dir, cb, s)
        files = LogFiles(self.store_dir, cb, s.store_host)
        files.write_flushed_offset(end)
        files.close()
        try:
            self.server.listen()
        except OSError as e:
            raise BootError(ExitCode.BOOT_ERROR, f"cannot bind the supervisor socket: {e}") from e
        Flags(cb).mark_running()
        for line in priority.apply(s.store_nice) + priority.apply_slice(s.store_slice_us):
            self._say(line)  # the workers inherit both
        self.workers = [_Worker(spec, i) for i, spec in enumerate(WORKERS)]
        for w in self.workers:
            self._spawn(w)
        port = self.metrics_port if self.metrics_port is not None else s.metrics_port
        if port:
            collector = StoreCollector(
                self.store_dir,
                lambda: self.cb,
                lambda: self.puts.scrape_totals(self.cb),
                lambda: self.read_only,
                sync_flush=s.flush_disk_type is FlushDiskType.SYNC_FLUSH,
            )
            try:
                self.metrics = MetricsServer(s.metrics_host, port, collector)
            except OSError as e:
                where = f"{s.metrics_host}:{port}"
                raise BootError(ExitCode.BOOT_ERROR, f"cannot serve metrics on {where}: {e}") from e
            self._say(f"metrics on {self.metrics.url}")
        self._say(
            f"pid {os.getpid()} serving {self.store_dir} from offset {end} "
            f"({s.flush_disk_type.value}, pool {'off' if not pool_n else f'{pool_n} buffers'})"
        )

    def _quiesce_old_generation(self) -> None:
        """Before recovery: a crashed run's blocks are fenced and its orphaned workers
        given `STOP.worker_s` to finish their drain (`ipc.fence.quiesce_leftovers`), so
        recovery reads files nobody writes any more. A supervisor that still maps its
        block (the directory was renamed or replaced under it) is refused, whatever
        lock the directory holds."""
        try:
            left = quiesce_leftovers(self.store_dir, STOP.worker_s)
        except StoreInUse as e:
            raise BootError(ExitCode.BOOT_ERROR, f"{e}; stop it first") from e
        if left:
            self._say(
                f"workers of a crashed run (pids {left}) did not finish their drain in "
                f"{STOP.worker_s:.0f} s; recovering anyway",
                "WARNING",
            )

    def _retire_old_generation(self, end: int, fresh_files: bool) -> None:
        """Fence every control block a crashed run left (`ipc.fence.retire_leftovers`:
        a producer of it that sleeps through this restart is told its put failed) and
        remove them; with the pool off after an unclean stop, give the files from the
        recovered end (or from where its orphaned committer filled a reservation whose
        producer may live) on new inodes, which no stale mapping of theirs reaches. The
        store is locked (its directory: nobody else runs it), so they are a crashed
        run's whatever files were deleted."""
        names, stale = retire_leftovers(self.store_dir)
        for name in names:
            self._say(f"fenced and removed shared memory left by a crashed run: {name}", "WARNING")
        if fresh_files:
            first = min(end, stale) if stale >= 0 else end
            done = fresh_inodes(self.store_dir, self.settings.segment_size_bytes, first, end)
            if done:
                self._say(f"gave {len(done)} commit-log file(s) from offset {first} new inodes")

    def _check_geometry(self, loaded: LoadedSettings) -> bool:
        """Refuse settings that give the store other file sizes than it has
        (`engine.geometry`); True when the store has its geometry record."""
        if not os.path.isdir(self.store_dir):
            return False
        try:
            recorded = geometry.check_settings(self.store_dir, loaded.settings, loaded.source_of)
        except geometry.GeometryMismatch as e:
            raise BootError(ExitCode.CONFIG_ERROR, f"configuration error: {e}") from e
        except geometry.GeometryRecordError as e:
            raise BootError(ExitCode.BOOT_ERROR, str(e)) from e
        return recorded is not None

    def _recover(self, was_dirty: bool) -> tuple[int, dict[tuple[str, int], int]]:
        """RocketMQ's recovery (`engine.recovery`): abnormal when `abort` was there before
        this boot wrote its own. Returns the log's end and the next queue offsets."""
        # The file sizes this run uses: those of the files already there, else the
        # settings' (the dispatcher decides the same way); clients get them at attach.
        self.geometry = geometry.Geometry.of(self.store_dir, self.settings)
        # progress in the log and for `mqstore status`; SIGTERM / SIGINT stop it
        progress = ProgressReporter(self.store_dir, self._say, lambda: self.stopping)
        try:
            report = recover_store(
                self.store_dir,
                self.settings,
                geometry=self.geometry,
                abnormal=was_dirty,
                progress=progress,
            )
            write_report(self.store_dir, report)
        except RecoveryInterrupted as e:
            raise BootError(ExitCode.OK, str(e)) from e
        except (SegmentSizeError, SegmentNameError, IndexGeometryError, StoreIOError) as e:
            raise BootError(ExitCode.BOOT_ERROR, f"cannot recover the store: {e}") from e
        finally:
            progress.close()
        self._say(f"recovery: {report.summary()}")
        return report.end_offset, report.queue_offset_table()

    # --- workers ------------------------------------------------------------------------

    def _spawn(self, w: _Worker) -> None:
        cb = self.cb
        assert cb is not None
        argv = [
            sys.executable, "-m", "mqstore.workers.worker_main", w.spec.name, str(w.index),
            self.store_dir, cb.ctl_name, cb.pool_name, w.spec.target,
            str(self.config) if self.config else "",
        ]  # fmt: skip
        env = dict(os.environ)
        faults_for = env.get(FAULTS_FOR_ENV)
        if faults_for is not None and w.spec.name not in faults_for.split(","):
            env.pop("MQSTORE_FAULTS", None)
        self._close_reason(w)
        w.reason_fd, reason_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        env[REASON_FD_ENV] = str(reason_w)
        try:
            w.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, close_fds=True, env=env, pass_fds=(reason_w,)
            )
        finally:
            os.close(reason_w)
        w.started = time.monotonic()
        if w.judge is not None:
            w.judge.close()  # the last process's /proc files
        w.judge = HeartbeatJudge(w.proc.pid, started_ms=c.heartbeat_clock_ms())
        cb.set_worker(w.index, w.spec.name, w.proc.pid, w.restarts, WORKER_STARTING)
        cb.beat(w.index)

    @staticmethod
    def _close_reason(w: _Worker) -> None:
        if w.reason_fd >= 0:
            os.close(w.reason_fd)
            w.reason_fd = -1

    def _reason(self, w: _Worker) -> dict[str, str]:
        """What a worker that failed closed wrote about why, or a stand-in."""
        try:
            got = os.read(w.reason_fd, 4096)
        except OSError:
            got = b""
        self._close_reason(w)
        return parse_reason(got, w.spec.name)

    @property
    def read_only_reason(self) -> str:
        return self.read_only["message"] if self.read_only else ""

    def _watch_workers(self) -> None:
        cb = self.cb
        assert cb is not None
        now = time.monotonic()
        hb_timeout = self.settings.heartbeat_timeout_ms / 1000
        for w in self.workers:
            if w.halted:
                continue
            if w.proc is None:
                if now >= w.restart_at and not self.stopping:
                    self._spawn(w)
                continue
            code = w.proc.poll()
            if code is None:
                self._judge_heartbeat(w, now, hb_timeout)
                continue
            if cb.worker(w.index)[4] == WORKER_RUNNING:  # it was up until now
                w.down_since = now
            w.proc = None
            w.last_exit = code
            if code in (ExitCode.CONFIG_ERROR, ExitCode.BOOT_ERROR):
                self._say(f"{w.spec.name} cannot start (exit {code}); halting", "ERROR")
                w.halted = True
                cb.set_worker(w.index, w.spec.name, 0, w.restarts, WORKER_HALTED)
                self.exit_code = ExitCode.BOOT_ERROR
                self.stopping = True
                continue
            if code in (ExitCode.IO_FAILED, ExitCode.FLUSH_FAILED):
                # Fail closed: the store stays up, read-only, and the worker is not
                # restarted into the same failure (a restart cannot undo a lost write).
                Flags(cb).mark_read_only()
                reason = self._reason(w)
                self.read_only = self.read_only or reason
                w.halted = True
                cb.set_worker(w.index, w.spec.name, 0, w.restarts, WORKER_HALTED)
                self._say(
                    f"{w.spec.name} {describe_exit(code)}; the store is read-only, not "
                    f"restarting it: {reason['message']}",
                    "ERROR",
                )
                continue
            w.restarts += 1
            s = self.settings
            delay = min(
                s.restart_backoff_initial_ms * 2 ** (w.restarts - 1), s.restart_backoff_max_ms
            )
            w.restart_at = now + delay / 1000
            cb.set_worker(w.index, w.spec.name, 0, w.restarts, WORKER_EXITED)
            self._say(
                f"{w.spec.name} {describe_exit(code)}; restart {w.restarts} in {delay} ms",
                "WARNING",
            )

    def _check_block(self, cb: c.ControlBlock) -> None:
        """Every tick: a control block whose geometry or positions were overwritten
        (`ControlBlock.damage`) makes the store read-only, with the reason in status,
        before a worker acts on it (commits past the log, divides by a zero)."""
        why = "" if self.read_only else cb.damage()
        if not why:
            return
        Flags(cb).mark_read_only()
        _native.flushed_wake_all(cb.buf)
        message = f"supervisor: the control block was overwritten ({why})"
        self.read_only = {
            "worker": "supervisor", "op": "control block", "errno": "", "path": cb.ctl_name,
            "message": message,
        }  # fmt: skip
        self._say(f"{message}; the store is read-only: restart it", "ERROR")

    def _judge_heartbeat(self, w: _Worker, now: float, hb_timeout: float) -> None:
        """SIGKILL a worker silent for longer than `heartbeat_timeout_ms` of the time it
        could run (`workers.heartbeat`: waiting for a CPU or blocked on I/O is not held
        against it)."""
        cb = self.cb
        assert cb is not None and w.proc is not None and w.judge is not None
        _name, _pid, hb, _r, _st = cb.worker(w.index)
        if w.judge.killed:  # said once; its exit is seen by a later loop
            return
        silent, excused = w.judge.silence(hb, c.heartbeat_clock_ms())
        if now - w.started <= hb_timeout or silent <= hb_timeout * 1000:
            return
        self._say(
            f"{w.spec.name} (pid {w.proc.pid}) sent no heartbeat for {silent + excused} ms, "
            f"{silent} ms of it watched and neither waiting for a CPU nor blocked on I/O "
            f"(heartbeat_timeout_ms {self.settings.heartbeat_timeout_ms}); killing it with SIGKILL",
            "WARNING",
        )
        w.proc.kill()
        w.judge.killed = True

    # --- clients (the socket itself: `workers.control_socket.ControlServer`) -----------

    def _on_close(self, conn: Conn) -> None:
        """A connection closed: free the client row its attach holds, end the group
        membership it carries."""
        if conn.row >= 0 and self.cb is not None:
            self.puts.retire(self.cb, conn.row)
        self.groups.on_close(conn)

    def _write_path_down(self) -> dict[str, str]:
        """The workers a put waits on (allocator, committer; the flusher under
        SYNC_FLUSH) that are not up, each with why: booting, or waiting for a restart.
        Not a halted one (the store is read-only or halting), nor one that was running
        and crashed less than COMING_BACK_S ago (it is coming back; puts go on)."""
        cb = self.cb
        assert cb is not None
        names: tuple[str, ...] = ("allocator", "committer")
        if self.settings.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            names += ("flusher",)
        now = time.monotonic()
        down = {}
        for w in self.workers:
            if w.spec.name not in names or w.halted or now - w.down_since < COMING_BACK_S:
                continue
            _n, pid, _hb, restarts, state = cb.worker(w.index)
            if state == WORKER_RUNNING and w.proc is not None:
                continue
            last = f"; last {describe_exit(w.last_exit)}" if w.last_exit is not None else ""
            tries = f" (restarted {restarts} times{last})" if restarts else ""
            if w.proc is not None:
                why = f"booting for {now - w.started:.1f} s, pid {pid}{tries}"
            else:
                why = f"restart {restarts} in {max(0.0, w.restart_at - now):.1f} s{last}"
            if w.down_since > float("-inf"):
                why += f"; last running {now - w.down_since:.1f} s ago"
            down[w.spec.name] = why
        return down

    def _handle(self, req: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        """The reply to a valid request (`control_socket.parse_request`); None for an
        attach that waits for the write path (asked again at the next tick)."""
        cb = self.cb
        assert cb is not None
        op = req["op"]
        if op == "attach":
            if self.stopping:
                return {"error": "the supervisor is stopping"}
            if conn.row >= 0:
                return {"error": f"this connection is already attached as client {conn.row}"}
            down = self._write_path_down()
            if down:
                if time.monotonic() < conn.asked + req["wait_ms"] / 1000:
                    return None
                said = "; ".join(f"{name} {why}" for name, why in down.items())
                return {"error": f"the store's write path is not up: {said}", "not_up": down}
            row = self.puts.free_row()
            if row is None:
                return {"error": f"too many clients attached (max {c.MAX_CLIENTS})"}
            self.puts.attach(cb, row, req["pid"])
            conn.row = row
            s = self.settings
            return {
                "ctl": cb.ctl_name,
                "pool": cb.pool_name,
                "generation": cb.generation,
                "client_index": row,
                # Everything a client must know, so it never guesses from defaults or
                # from the files present (its put path, `ipc.reads.AttachedStore`).
                "settings": settings_doc(s),
                "geometry": dataclasses.asdict(self.geometry),
            }
        if op == "status":
            return self.status()
        if op.startswith("group_"):
            if self.stopping and op != "group_info":
                return {"error": "the supervisor is stopping"}
            return self.groups.handle(req, conn)
        assert op == "stop", op
        self.stopping = True
        return {"ok": True, "pid": os.getpid()}

    def status(self) -> dict[str, Any]:
        assert self.cb is not None
        ws = [(w.index, w.spec.name, w.last_exit) for w in self.workers]
        doc = self.puts.status_doc(self.cb, self.store_dir, ws, self.settings)
        doc["attaches_waiting"] = len(self.server.waiting)  # for the write path
        if self.read_only:
            doc["read_only_reason"] = self.read_only["message"]
            doc["read_only"] = dict(self.read_only)
        return doc

    def _reload(self) -> None:
        """SIGHUP: re-read the settings (the reloadable ones take effect, the others are
        reported as ignored until a restart) and forward SIGHUP to the running workers,
        which do the same for their own loops."""
        try:
            self.settings, applied, ignored = reload_settings(
                self.settings, self.store_dir, self.config
            )
        except ConfigError as e:
            self._say(f"reload failed, settings kept: {e}", "ERROR")
            return
        say_reload("start", applied, ignored)
        cb = self.cb
        assert cb is not None
        for w in self.workers:
            _n, pid, _hb, _r, state = cb.worker(w.index)
            # a worker installs its SIGHUP handler before it reports itself running
            if w.proc is not None and pid == w.proc.pid and state == WORKER_RUNNING:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGHUP)

    # --- main loop ----------------------------------------------------------------------

    def run(self) -> int:
        wake_r, wake_w, old_wakeup = install_signal_flags(self)
        if os.environ.get(FAULTS_FOR_ENV) is not None:
            fileio.clear_faults()
        try:
            try:
                self.boot()
            except BootError as e:
                self._say(str(e), "ERROR" if e.code else "INFO")
                self._teardown_after_boot_failure()
                return int(e.code)
            except OSError as e:  # StoreIOError, or a store file that cannot be opened
                what = "I/O error" if isinstance(e, StoreIOError) else "cannot open a store file"
                self._say(f"{what} at boot: {e}", "ERROR")
                self._teardown_after_boot_failure()
                return int(ExitCode.BOOT_ERROR)
            except BaseException:  # a bug: its traceback, but nothing left behind
                self._teardown_after_boot_failure()
                raise
            sel = selectors.DefaultSelector()
            self.server.register(sel)
            self.groups.attach_selector(sel)
            sel.register(wake_r, selectors.EVENT_READ)
            while not self.stopping:
                for key, mask in sel.select(TICK_S):
                    if key.fd == wake_r:
                        try:
                            while os.read(wake_r, 512):
                                pass
                        except BlockingIOError:
                            pass
                    elif not self.groups.on_ready(key):
                        self.server.on_ready(sel, key, mask)
                self.server.drop_stalled(sel)
                self.groups.tick()
                if self.reload_requested:
                    self.reload_requested = False
                    self._reload()
                self._watch_workers()
                self.server.answer_waiting(sel)
                self._notify_ready()
                assert self.cb is not None
                self._check_block(self.cb)
                self.puts.tick(self.cb)
            self.server.answer_waiting(sel)  # the waiting attaches: "stopping"
            self._notify("STOPPING=1", "STATUS=draining")
            code = self.shutdown()
            self.groups.close()
            self.server.drop_all(sel)
            sel.close()
            final = code if self.exit_code == ExitCode.OK else int(self.exit_code)
            self._say(f"stopped (exit {final})")
            return final
        finally:
            signal.set_wakeup_fd(old_wakeup)
            os.close(wake_r)
            os.close(wake_w)

    def _notify(self, *fields: str) -> None:
        try:
            sdnotify.notify(*fields)
        except OSError as e:
            self._say(f"sd_notify {fields[0]} failed: {e}", "WARNING")

    def _notify_ready(self) -> None:
        """READY=1 for systemd (Type=notify), once: recovery is done (boot returned) and
        every worker has reported itself running."""
        if self._ready_sent or self.cb is None:
            return
        states = [self.cb.worker(w.index)[4] for w in self.workers]
        if all(st == WORKER_RUNNING for st in states):
            self._ready_sent = True
            self._notify("READY=1", f"STATUS=serving {self.store_dir}", f"MAINPID={os.getpid()}")

    def _teardown_after_boot_failure(self) -> None:
        for w in self.workers:
            if w.proc is not None:
                w.proc.kill()
                w.proc.wait()
            if w.judge is not None:
                w.judge.close()
        self.server.close_listener()
        self._stop_metrics()
        if self.cb is not None:
            self.cb.close()
            self.cb = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _stop_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    @staticmethod
    def _fence_reservations(cb: c.ControlBlock) -> bool:
        """Take and release the reservation lock: True when no producer is inside the
        reservation step any more. A holder that is stopped (SIGSTOP, a debugger) is
        given `STOP.fence_s`, a running one (maybe only starved) up to `STOP.worker_s`."""
        if _native.reserve_fence(cb.buf, int(STOP.fence_s * 1e9)) == 0:
            return True
        holder = stats.reservation_holder(cb)
        if holder is not None and holder["state"] in ("stopped", "traced"):
            return False
        return _native.reserve_fence(cb.buf, int((STOP.worker_s - STOP.fence_s) * 1e9)) == 0

    def shutdown(self) -> int:
        """Refuse writes, stop workers, drain, checkpoint, clean up. Returns the exit code."""
        cb = self.cb
        assert cb is not None
        s = self.settings
        Flags(cb).mark_refusing_writes()
        # No producer is inside the reservation step after this (one that is stopped in
        # it does not hold the stop up: its reservation is past the fence, never
        # published, and its put fails).
        pos = Positions(cb)
        stale_from = -1  # where a producer that sleeps through the stop may still write
        if not self._fence_reservations(cb):
            holder = stats.reservation_holder(cb)
            who = f"producer pid {holder['pid']} ({holder['state']})" if holder else "a producer"
            self._say(
                f"{who} holds the reservation lock; stopping without it (its put fails: "
                "the generation is fenced)",
                "WARNING",
            )
            stale_from = pos.reserved
        fence_seq = fence(cb)
        for w in self.workers:
            if w.proc is not None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP.worker_s
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                code = w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._say(f"{w.spec.name} did not stop in time; killing it", "WARNING")
                w.proc.kill()
                code = w.proc.wait()
            if code in (ExitCode.IO_FAILED, ExitCode.FLUSH_FAILED):  # in its drain
                Flags(cb).mark_read_only()
                self.read_only = self.read_only or self._reason(w)
            cb.set_worker(w.index, w.spec.name, 0, w.restarts, WORKER_EXITED)
            w.proc = None
        for w in self.workers:
            self._close_reason(w)
            if w.judge is not None:
                w.judge.close()
        code = int(ExitCode.OK)
        files = LogFiles(self.store_dir, cb, s.store_host)
        try:
            deadline = time.monotonic() + STOP.drain_s
            while True:
                files.publish_locked()
                if pos.published_seq >= fence_seq:
                    break
                if time.monotonic() >= deadline:
                    n = files.publish_locked(force=True)
                    self._say(
                        f"filled {n} reservations nobody finished (none acknowledged)", "WARNING"
                    )
                    break
                time.sleep(0.005)
            clean = False
            if Flags(cb).word & c.FLAG_READ_ONLY:
                why = self.read_only_reason or "a worker's I/O failed"
                self._say(f"the store is read-only ({why}); not flushing", "ERROR")
            else:
                for attempt in range(STOP.flush_retries):
                    try:
                        files.commit(0)
                        files.flush(0)
                        # everything below the fence, the generation's last reservation
                        clean = pos.published_seq >= fence_seq and pos.flushed >= pos.published
                        break
                    except StoreIOError as e:
                        self._say(f"final flush failed (attempt {attempt + 1}): {e}", "ERROR")
            filled = Reservation(cb).stale_from  # for a producer that may wake and write
            if filled >= 0:
                stale_from = filled if stale_from < 0 else min(stale_from, filled)
            if clean and stale_from >= 0 and not files.pool:
                files.close()  # its mappings of the files being replaced
                fresh_inodes(self.store_dir, cb.segment_size, stale_from, pos.flushed)
            if not clean:
                code = int(ExitCode.FLUSH_FAILED)
            else:
                cp = StoreCheckpoint.open_in(self.store_dir)
                try:
                    ts = pos.flushed_ts
                    if ts:
                        cp.physic_msg_timestamp = ts
                    cp.flush()
                finally:
                    cp.close()
                fileio.unlink(os.path.join(self.store_dir, ABORT_FILE), missing_ok=True)
                fileio.fsync_dir(self.store_dir)
        except StoreIOError as e:
            self._say(f"shutdown I/O error: {e}", "ERROR")
            code = int(ExitCode.FLUSH_FAILED)
        finally:
            files.close()
            Flags(cb).mark_stopped()
            self.server.close_listener()
            self._stop_metrics()
            cb.close()
            self.cb = None
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
        return code


def run_supervisor(
    store_dir: str | os.PathLike[str],
    config: Path | None = None,
    metrics_port: int | None = None,
    create: bool = False,
) -> int:
    setup_logging("start")
    return Supervisor(store_dir, config, metrics_port, create).run()
