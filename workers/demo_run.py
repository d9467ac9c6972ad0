"""`make run`: start a demo store in the foreground, put a demo load through it, show it.

    python -m mqstore.workers.demo_run [DIR] [--seconds S] [--load-seconds L] [--engine]

1. Recreates DIR (default `data/demo`; refused while a supervisor holds it) with a
   `mqstore.toml` (SYNC_FLUSH, 16 MiB segments) and runs `mqstore start DIR --create` as a
   child process (its log: `DIR.log` beside the store).
2. Runs the `mqstore demo` load for L seconds (default 10): async producers
   (`wait_store=False`), sync producers (acknowledged once fsynced) and a consumer that
   reads everything back, with a live bar and the store's status (`mqstore status`).
3. Keeps the store running with a live status (positions, lags, rates) until Ctrl-C,
   or until S seconds in all have passed (`--seconds`, for tests and scripts).
4. Stops cleanly: SIGTERM to the supervisor, wait for it (it drains, flushes, writes
   the checkpoint, unlinks its shared memory), then `mqstore check DIR`.

Exit 0 when the load had no failed put, the consumer read every acknowledged message
once, the supervisor exited 0 and the check passed.

`--engine` (and the fallback when the supervisor does not start) is the single-process
demo: N messages (`--messages`) written with the engine into small segments, then
`mqstore dump DIR --limit 3` and `mqstore check DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mqstore.engine.checkpoint import StoreCheckpoint
from mqstore.engine.commitlog import CommitLog
from mqstore.engine.record import Message
from mqstore.ipc import channel
from mqstore.ipc.control import leftover_shm
from mqstore.ipc.locks import store_lock_holder
from mqstore.workers.cli import main as mqstore
from mqstore.workers.commands._signals import ignored_stop_signals, stop_signals
from mqstore.workers.commands.demo import DemoOptions, run_demo
from mqstore.workers.commands.status import status_line

DEMO_SEGMENT_BYTES = 64 * 1024  # small, so the engine demo rolls a few segments
DEMO_CONFIG = """[store]
flush_disk_type = "SYNC_FLUSH"
segment_size_bytes = 16777216
"""
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


def write_demo_store(root: Path, count: int) -> tuple[int, int]:
    """Append `count` messages; return (messages, bytes appended)."""
    log = CommitLog.open(root / "commitlog", DEMO_SEGMENT_BYTES)
    topics = ("orders", "payments", "audit")
    try:
        for i in range(count):
            topic = topics[i % len(topics)]
            body = f'{{"n": {i}, "topic": "{topic}", "note": "demo message"}}'.encode()
            msg = Message(
                topic,
                body,
                {"TAGS": f"tag{i % 4}", "KEYS": f"{topic}-{i}", "UNIQ_KEY": f"DEMO{i:08d}"},
                queue_id=i % 4,
                born_timestamp=int(time.time() * 1000),
                born_host="127.0.0.1:50000",
            )
            res = log.append(msg)
            if not res.ok:
                raise SystemExit(f"demo append {i} failed: {res.status.name} {res.reason}")
        log.flush(0)
        appended = log.max_offset() - log.min_offset()
        last = log.queue.last()
        store_ts = last.store_timestamp if last is not None else 0
    finally:
        log.close()
    cp = StoreCheckpoint.open_in(root)
    try:
        cp.physic_msg_timestamp = store_ts
        cp.flush()
    finally:
        cp.close()
    return count, appended


def engine_demo(store_dir: Path, messages: int) -> int:
    """The single-process demo: write with the engine, then dump and check."""
    shutil.rmtree(store_dir, ignore_errors=True)
    store_dir.mkdir(parents=True)
    n, size = write_demo_store(store_dir, messages)
    print(f"# wrote {n} messages ({size} bytes) into {store_dir}\n")
    print(f"$ mqstore dump {store_dir} --limit 3")
    sys.stdout.flush()
    mqstore(["dump", str(store_dir), "--limit", "3"])
    print(f"\n$ mqstore check {store_dir}")
    sys.stdout.flush()
    return mqstore(["check", str(store_dir)])


def _status(store: Path) -> dict[str, Any] | None:
    try:
        return channel.request(store, {"op": "status"}, timeout_s=2.0)
    except channel.SupervisorUnavailable:
        return None


def status_table(doc: dict[str, Any]) -> Any:
    """A compact live status (fits a small terminal beside the demo's bar)."""
    from rich.table import Table

    pos, puts, lat, fs = doc["positions"], doc["puts"], doc["latency_us"], doc["fsync"]
    t = Table(title=f"mqstore {doc['store_dir']}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row(
        "positions",
        f"reserved {pos['reserved']:,} · committed {pos['committed']:,} · "
        f"flushed {pos['flushed']:,}",
    )
    t.add_row("lags", f"commit {doc['commit_lag_bytes']:,} B · flush {doc['flush_lag_bytes']:,} B")
    t.add_row(
        "rate",
        f"{puts['puts_per_s']:,.0f} puts/s · {puts['bytes_per_s'] / 1e6:,.1f} MB/s · "
        f"{puts['total']:,} puts ({puts['errors']:,} failed)",
    )
    t.add_row("latency", f"p50 {lat['p50']:g} · p99 {lat['p99']:g} · max {lat['max']:g} µs")
    t.add_row(
        "fsync",
        f"{fs['total']:,} ({fs['per_s']:,.0f}/s, mean {fs['mean_us']} µs) · "
        f"{fs['msgs_per_fsync']} msgs per fsync",
    )
    pool = doc["pool"]
    t.add_row(
        "pool / flags",
        (f"{pool['free']} / {pool['buffers']} free" if pool["enabled"] else "pool off")
        + f" · {', '.join(doc['flags']) or '-'} · {doc['settings']['flush_disk_type']}",
    )
    t.add_row(
        "workers",
        " · ".join(f"{w['name']} {w['state']} ({w['restarts']} restarts)" for w in doc["workers"]),
    )
    return t


def _set_pdeathsig() -> None:
    """In the supervisor child: SIGTERM it (a clean stop) if `make run` itself dies."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class DemoStore:
    """The supervisor as a child process of `make run`, in its own process group (so
    that Ctrl-C reaches only us and we stop things in order)."""

    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir
        self.log_path = store_dir.with_name(store_dir.name + ".log")
        self.proc: subprocess.Popen[bytes] | None = None

    def setup(self) -> None:
        if store_lock_holder(str(self.path)) is not None:
            raise SystemExit(f"a supervisor already runs for {self.path}: `mqstore stop` it")
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)
        (self.path / "mqstore.toml").write_text(DEMO_CONFIG)

    def start(self) -> str:
        """Start and wait until it answers; "" or why it did not start."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mqstore", "start", str(self.path), "--create"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,
                preexec_fn=_set_pdeathsig,  # before any thread of ours exists
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"the supervisor exited with {self.proc.returncode}: {self.tail_log()}"
            if _status(self.path) is not None:
                return ""
            time.sleep(0.05)
        self.stop()
        return f"the supervisor did not answer within {START_TIMEOUT_S:.0f} s"

    def tail_log(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return " / ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> int | None:
        """SIGTERM, wait; SIGKILL only if it hangs. Its exit code (None: not started)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"supervisor {proc.pid} did not stop in {STOP_TIMEOUT_S:.0f} s: killing it")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        self.proc = None
        return code


def _keep_running(store: DemoStore, until: float | None, tty: bool) -> None:
    """Show the live status until Ctrl-C or `until` (monotonic)."""
    print(f"\nstore {store.path} is running (log: {store.log_path});", end=" ")
    print("Ctrl-C stops it." if until is None else "stopping when the time is up.")
    sys.stdout.flush()
    if tty:
        from rich.live import Live

        render = status_table
        doc = _status(store.path)
        if doc is None:
            return
        with Live(render(doc), refresh_per_second=2) as live:
            while until is None or time.monotonic() < until:
                time.sleep(0.5)
                doc = _status(store.path)
                if doc is None:
                    print("the supervisor is gone")
                    return
                live.update(render(doc))
        return
    last = 0.0
    shown = ""
    first = True  # one status at least, even when the load ran past `until`
    while first or until is None or time.monotonic() < until:
        first = False
        now = time.monotonic()
        if now - last >= 1.0:
            doc = _status(store.path)
            if doc is None:
                print("the supervisor is gone")
                return
            line = status_line(doc)
            if line != shown:  # a log, not a screen: only what changed
                print(f"status: {line}", flush=True)
                shown = line
            last = now
        time.sleep(0.05)


def store_demo(args: argparse.Namespace) -> int:
    store = DemoStore(args.store_dir)
    store.setup()
    print(f"$ mqstore start {store.path} --create   (SYNC_FLUSH, write pool on)", flush=True)
    why = store.start()
    if why:
        print(f"the runtime did not start ({why}); running the engine-only demo instead")
        store.stop()
        return engine_demo(args.store_dir, args.messages)
    t0 = time.monotonic()
    until = None if args.seconds is None else t0 + args.seconds
    tty = sys.stdout.isatty()
    good = False
    # a closed terminal (SIGHUP) or a `kill` (SIGTERM) stops the demo as Ctrl-C does,
    # also when it was started with SIGINT ignored (`_signals`)
    try:
        with stop_signals(signal.SIGHUP):
            load_s = args.load_seconds if until is None else min(args.load_seconds, args.seconds)
            opts = DemoOptions(
                producers=args.producers,
                sync_producers=args.sync_producers,
                seconds=load_s,
                body_bytes=256,
                consumer=True,
            )
            print(
                f"$ mqstore demo {store.path} --producers {opts.producers} "
                f"--sync-producers {opts.sync_producers} --seconds {load_s:g} --consumer",
                flush=True,
            )

            def live_status() -> Any:
                from rich.text import Text

                doc = _status(store.path)
                return Text("store: " + (status_line(doc) if doc else "(no answer)"))

            summary = run_demo(store.path, opts, show=tty, extra=live_status)
            print("\n".join(summary.lines()))
            if args.json:
                print(json.dumps({"demo": {**summary.__dict__, "good": summary.good}}))
            good = summary.good
            _keep_running(store, until, tty)
    except KeyboardInterrupt:
        pass
    finally:
        with ignored_stop_signals(signal.SIGHUP):  # a second Ctrl-C must not cut the stop
            print(f"\nstopping: SIGTERM to the supervisor (log: {store.log_path})", flush=True)
            code = store.stop()
    left = leftover_shm(args.store_dir)
    print(f"supervisor exited with {code}; shared memory left: {left or 'none'}")
    print(f"\n$ mqstore check {store.path}", flush=True)
    checked = mqstore(["check", str(store.path)])
    return 0 if good and code == 0 and checked == 0 and not left else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="demo_run", description=__doc__.split("\n\n")[0])
    ap.add_argument("store_dir", nargs="?", type=Path, default=Path("data/demo"))
    ap.add_argument("--seconds", type=float, default=None, help="stop after S s in all")
    ap.add_argument("--load-seconds", type=float, default=10.0, help="demo load (10 s)")
    ap.add_argument("--producers", type=int, default=2, help="async producers (2)")
    ap.add_argument("--sync-producers", type=int, default=2, help="sync producers (2)")
    ap.add_argument("--json", action="store_true", help="also print the load summary as JSON")
    ap.add_argument("--engine", action="store_true", help="the single-process engine demo")
    ap.add_argument("--messages", type=int, default=2000, help="messages of the engine demo")
    args = ap.parse_args(argv)
    if args.engine:
        return engine_demo(args.store_dir, args.messages)
    return store_demo(args)


if __name__ == "__main__":
    sys.exit(main())
