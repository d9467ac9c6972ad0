"""What every worker process shares: exit codes, its context, and the loop's shape.

A worker is started by the supervisor as `python -m mqstore.workers.worker_main NAME INDEX DIR
CTL POOL [CONFIG]`; `worker_main` loads the settings, maps the control block, builds a
`WorkerContext` and calls the spec's target `main(ctx) -> int`. Exit codes are the
protocol back to the supervisor (gunicorn's arbiter style):

| code | meaning                                   | supervisor does                    |
| ---- | ----------------------------------------- | ---------------------------------- |
| 0    | stopped when asked                        | nothing                            |
| 3    | CONFIG_ERROR: settings cannot be used     | halts (no restart loop)            |
| 4    | BOOT_ERROR: cannot start at all           | halts                              |
| 5    | FLUSH_FAILED: the flusher's I/O failed    | keeps the store read-only, no restart |
| 6    | IO_FAILED: another worker's I/O failed    | keeps the store read-only, no restart |
| else | a crash                                   | restarts with backoff              |

Every loop: beat, wait (interval or wakeup), tick; after the loop, a bounded drain
(`workers.service.run`, which also fails the store closed on a StoreIOError). Signal
handlers only record (SIGTERM/SIGINT set `stopping` and poke the wakeup fd).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import logging
import os
import select
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol

from mqstore.conf.load import ConfigError, load_settings
from mqstore.conf.settings import INFO, StoreSettings
from mqstore.ipc.control import ControlBlock

# Log lines of `mqstore start` and its workers on stderr: one line per event, led by a
# syslog priority that journald reads (`SyslogLevelPrefix=`, on by default) and by the level
# in words for other shippers: `<6>INFO mqstore start: pid 42 serving /srv/mq ...`.
SYSLOG_PRIORITY: dict[str, int] = {"ERROR": 3, "WARNING": 4, "INFO": 6, "DEBUG": 7}


def log_line(component: str, msg: str, level: str = "INFO") -> str:
    """The line `say` writes (newlines in `msg` folded so that one event is one line)."""
    text = " | ".join(part for part in msg.splitlines() if part.strip()) or msg.strip()
    return f"<{SYSLOG_PRIORITY.get(level, 6)}>{level} mqstore {component}: {text}"


def write_line(line: str) -> None:
    """Write `line` on stderr in one unbuffered write(2), so that the lines of several
    processes sharing the stream do not interleave. A failed write (a pipe whose reader
    exited, a full disk) drops the line: logging never kills a process, and nothing is
    left buffered to fail again at exit."""
    data = (line + "\n").encode("utf-8", "backslashreplace")
    try:
        os.write(sys.stderr.fileno(), data)
    except (AttributeError, ValueError, io.UnsupportedOperation):  # no fd (a test's capture)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
    except OSError:
        pass


def say(component: str, msg: str, level: str = "INFO") -> None:
    """Write one log line on stderr (the supervisor's and its workers' stderr is the log)."""
    write_line(log_line(component, msg, level))


class Condition:
    """A condition that repeats every tick (no space for a file) logged once when it
    starts, again when it changes (its `key`), and once when it ends, never every tick."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.key = ""

    def report(self, key: str, msg: str, level: str = "WARNING") -> None:
        if key != self.key:
            say(self.component, msg, level)
            self.key = key

    def clear(self, msg: str) -> None:
        if self.key:
            say(self.component, msg)
            self.key = ""


class LineFormatter(logging.Formatter):
    """`logging` records in `say`'s form (tracebacks folded into the same line)."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        level = record.levelname if record.levelname in SYSLOG_PRIORITY else "INFO"
        if record.levelno >= logging.CRITICAL:
            level = "ERROR"
        return log_line(self.component, super().format(record), level)


class LineHandler(logging.Handler):
    """`logging` records written as `say` writes its lines (`write_line`)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a bad format string in a record: logging's own reporting
            self.handleError(record)
            return
        write_line(line)


def setup_logging(component: str) -> None:
    """Route `logging` (WARNING and up) to stderr in `say`'s form."""
    handler = LineHandler()
    handler.setFormatter(LineFormatter(component))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)


WORKER_STARTING = 1  # worker row states (ipc.control.WORKER_STATE_NAMES)
WORKER_RUNNING = 2
WORKER_EXITED = 3
WORKER_HALTED = 4


class ExitCode(enum.IntEnum):
    OK = 0
    CRASH = 1
    CONFIG_ERROR = 3
    BOOT_ERROR = 4
    FLUSH_FAILED = 5
    IO_FAILED = 6


# The fd on which a worker that fails closed writes why, one JSON line
# (`service.read_only_reason`; its number is in this environment variable, and the
# supervisor reads the other end when the worker exits).
REASON_FD_ENV = "MQSTORE_REASON_FD"


def reload_settings(
    old: StoreSettings, store_dir: str, config: Path | None
) -> tuple[StoreSettings, list[str], list[str]]:
    """Re-read the settings (SIGHUP): `(settings, applied, ignored)`. Only the fields marked
    `reloadable` in `conf.settings` change; other changes are listed as ignored until a
    restart. Raises ConfigError (the caller keeps `old`)."""
    new = load_settings(Path(store_dir), config, os.environ).settings
    applied: dict[str, object] = {}
    ignored: list[str] = []
    for f in dataclasses.fields(StoreSettings):
        before, after = getattr(old, f.name), getattr(new, f.name)
        if before == after:
            continue
        if INFO[f.name].reloadable:
            applied[f.name] = after
        else:
            ignored.append(f.name)
    changes = [f"{k}={v}" for k, v in applied.items()]
    return dataclasses.replace(old, **applied), changes, ignored  # type: ignore[arg-type]


def say_reload(component: str, applied: list[str], ignored: list[str]) -> None:
    say(component, f"reloaded settings: {', '.join(applied) or 'nothing changed'}")
    if ignored:
        say(
            component,
            f"ignored until restart (not reloadable): {', '.join(ignored)}",
            "WARNING",
        )


class SignalFlags(Protocol):
    """What the signal handlers set (they only record; the loop acts)."""

    stopping: bool
    reload_requested: bool


def install_signal_flags(owner: SignalFlags) -> tuple[int, int, int]:
    """SIGTERM and SIGINT set `owner.stopping`, SIGHUP `owner.reload_requested`, and each
    wakes a select through a new non-blocking pipe (`signal.set_wakeup_fd`). Returns the
    pipe's read and write ends and the wakeup fd it replaced. Main thread only."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_wakeup = signal.set_wakeup_fd(wake_w)

    def on_stop(_sig: int, _frame: FrameType | None) -> None:
        owner.stopping = True

    def on_hup(_sig: int, _frame: FrameType | None) -> None:
        owner.reload_requested = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    return wake_r, wake_w, old_wakeup


@dataclass
class WorkerContext:
    name: str
    index: int
    store_dir: str
    settings: StoreSettings
    cb: ControlBlock
    stopping: bool = False
    _wake_r: int = -1
    _wake_w: int = -1
    extra_fds: list[int] = field(default_factory=list)
    parent_pid: int = field(default_factory=os.getppid)
    config: Path | None = None
    reload_requested: bool = False

    def install_signals(self) -> None:
        self._wake_r, self._wake_w, _old = install_signal_flags(self)

    def beat(self) -> None:
        """Heartbeat; a worker whose supervisor died (re-parented) stops and drains. A
        SIGHUP since the last beat re-loads the reloadable settings into `settings`."""
        self.cb.beat(self.index)
        if os.getppid() != self.parent_pid:
            self.stopping = True
        if self.reload_requested:
            self.reload_requested = False
            self.reload()

    def reload(self) -> None:
        try:
            self.settings, applied, ignored = reload_settings(
                self.settings, self.store_dir, self.config
            )
        except ConfigError as e:
            say(self.name, f"reload failed, settings kept: {e}", "ERROR")
            return
        say_reload(self.name, applied, ignored)

    def wake(self) -> None:
        """End a `wait` at once, from another thread of the worker (as a signal does)."""
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):  # full pipe: a wake-up is already pending
                os.write(self._wake_w, b"\0")

    def wait(self, timeout_s: float, fds: list[int] | None = None) -> list[int]:
        """Sleep up to `timeout_s`, waking early on a signal or a readable fd; returns the
        readable fds among `fds`."""
        watch = [self._wake_r, *(fds or [])] if self._wake_r >= 0 else list(fds or [])
        try:
            ready, _, _ = select.select(watch, [], [], max(timeout_s, 0.0))
        except InterruptedError:
            return []
        if self._wake_r in ready:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        return [fd for fd in ready if fd != self._wake_r]


def describe_exit(code: int) -> str:
    """How a worker ended, for the supervisor's log (gunicorn's arbiter names the signal):
    "exited with 1 (CRASH)", "was killed by SIGKILL"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    try:
        return f"exited with {code} ({ExitCode(code).name})"
    except ValueError:
        return f"exited with {code}"
