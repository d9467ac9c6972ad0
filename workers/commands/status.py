"""`mqstore status DIR [--json] [--watch]`: what the running store is doing.

On a terminal `--watch` redraws the tables every second. Ctrl-C or SIGTERM ends it
(exit 0), whatever disposition the process inherited (`_signals`). Anywhere else (a pipe, a file,
a journal) it prints the one-line `status_line` (or, with `--json`, the document) only
when that line changed, so an idle store writes nothing; tables are never cut to 80
columns (`_console`).

While the supervisor recovers the store it does not answer yet: status then prints
`recovering: <phase> X of Y MiB, records, rate, ETA (supervisor pid N)` from the
progress the recovery keeps (`engine.recovery_progress`; JSON: `{"state":
"recovering", "recovering": {...}}`), or `starting: ...` before it has any, exit 0, and
with `--watch` goes on until the supervisor answers. Exit 1: no supervisor holds the
store.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

from mqstore.engine.recovery_progress import describe, read_progress
from mqstore.ipc import channel
from mqstore.ipc.locks import store_lock_holder
from mqstore.workers.commands._console import make_console
from mqstore.workers.commands._signals import stop_signals

# The exit code while a supervisor holds the store but does not serve yet (it starts or
# recovers): EX_TEMPFAIL, "try again later". 0 means it serves; 1, that none runs.
NOT_SERVING_YET = 75

NAME = "status"
HELP = "show positions, lags, pool, flags, workers, put rates and latency, fsyncs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store_dir", type=Path)
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--watch", action="store_true", help="refresh every second until Ctrl-C")


def status_line(doc: dict[str, Any]) -> str:
    """One line of the store's status: positions, lags, rates, latency, fsyncs."""
    pos, puts, lat, fs = doc["positions"], doc["puts"], doc["latency_us"], doc["fsync"]
    return (
        f"reserved {pos['reserved']:,} flushed {pos['flushed']:,} | "
        f"commit lag {doc['commit_lag_bytes']:,} B flush lag {doc['flush_lag_bytes']:,} B | "
        f"{puts['puts_per_s']:,.0f} puts/s {puts['bytes_per_s'] / 1e6:,.1f} MB/s | "
        f"p99 {lat['p99']:g} µs | {fs['per_s']:,.0f} fsyncs/s | "
        f"{puts['total']:,} puts, {puts['errors']:,} failed"
    ) + (
        f" | reservation lock {describe_holder(h)}" if (h := doc.get("reservation_holder")) else ""
    )


def describe_holder(holder: dict[str, Any]) -> str:
    return f"held by producer pid {holder['pid']} ({holder['state']})"


class _Rows(list[tuple[str, str]]):
    """The summary's (what, value) rows, in the order shown."""

    def add_row(self, what: str, value: str) -> None:
        self.append((what, value))


def render(doc: dict[str, Any], height: int | None = None, width: int = 80) -> Any:
    """The status as rich tables: the summary, then the workers. With `height` (a
    terminal's rows, `--watch`), the tables fit in it: without their titles and frames
    if need be, then with the summary's last rows left out (a row says how many and
    where to see them); the workers table is always whole."""
    from rich.console import Group

    rows = _summary_rows(doc)
    title = f"mqstore status (supervisor {doc['supervisor_pid']})"
    full = Group(_table(rows, title, ("what", "value")), _workers(doc, boxed=True))
    if height is None or _lines(full, width) <= height:
        return full
    workers = _workers(doc, boxed=False)
    for keep in range(len(rows), 0, -1):
        shown = rows[:keep]
        if keep < len(rows):
            shown = _Rows([*shown, (f"… {len(rows) - keep} more", "a taller terminal shows them")])
        out = Group(_table(shown, None, ("what", "value")), workers)
        if _lines(out, width) <= height:
            return out
    return workers


def _lines(renderable: Any, width: int) -> int:
    """How many lines `renderable` takes at `width` columns."""
    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None)
    return len(console.render_lines(renderable, console.options, pad=False))


def _table(rows: list[tuple[str, str]], title: str | None, header: tuple[str, str]) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.HEAVY_HEAD if title else box.SIMPLE_HEAD)
    t.add_column(header[0])
    t.add_column(header[1], justify="right")
    for what, value in rows:
        t.add_row(what, value)
    return t


def _summary_rows(doc: dict[str, Any]) -> _Rows:
    pos = doc["positions"]
    # the path goes in a row: a title is wrapped to the table's width
    t1 = _Rows()
    t1.add_row("store", doc["store_dir"])
    for k in ("reserved", "published", "committed", "flushed", "dispatched", "allocated_upto"):
        t1.add_row(f"{k} offset", f"{pos[k]:,}")
    t1.add_row("commit lag", f"{doc['commit_lag_bytes']:,} B")
    if doc.get("commit_drain_bytes"):
        t1.add_row("commit drain bound", f"{doc['commit_drain_bytes']:,} B")
    t1.add_row("flush lag", f"{doc['flush_lag_bytes']:,} B")
    t1.add_row(
        "dispatch lag",
        f"{doc['dispatch_lag_bytes']:,} B ({doc['dispatched_records']:,} records dispatched)",
    )
    # batches the dispatcher's C round declined (docs/metrics.md): a count that keeps
    # up with the records says the dispatcher is off its fast path
    t1.add_row("dispatch batches by the Python path", f"{doc['dispatch_python_batches']:,}")
    pool = doc["pool"]
    t1.add_row(
        "pool buffers free",
        f"{pool['free']} / {pool['buffers']}" if pool["enabled"] else "pool off",
    )
    t1.add_row("flags", ", ".join(doc["flags"]) or "-")
    if doc.get("read_only_reason"):
        t1.add_row("read-only because", doc["read_only_reason"])
    holder = doc.get("reservation_holder")
    if holder:
        t1.add_row("reservation lock", describe_holder(holder))
    t1.add_row("flush mode", doc["settings"]["flush_disk_type"])
    puts = doc["puts"]
    t1.add_row("puts", f"{puts['total']:,} ({puts['errors']:,} failed)")
    t1.add_row(
        "put rate", f"{puts['puts_per_s']:,.0f} msg/s, {puts['bytes_per_s'] / 1e6:,.1f} MB/s"
    )
    lat = doc["latency_us"]
    t1.add_row(
        "put latency p50 / p99 / max", f"{lat['p50']:g} / {lat['p99']:g} / {lat['max']:g} µs"
    )
    fs = doc["fsync"]
    t1.add_row("fsyncs", f"{fs['total']:,} ({fs['per_s']:,.0f}/s, mean {fs['mean_us']} µs)")
    t1.add_row("messages per fsync", f"{fs['msgs_per_fsync']}")
    t1.add_row("fillers / busy waits", f"{doc['fillers']} / {doc['busy_waits']}")
    t1.add_row(
        "puts refused: lock held too long / lock queue too long / no room",
        f"{doc['lock_timeouts']} / {doc['lock_queued']} / {doc['room_timeouts']}",
    )
    t1.add_row("clients attached", str(doc["clients"]))
    _cleaner_rows(t1, doc.get("cleaner") or {})
    return t1


def _workers(doc: dict[str, Any], *, boxed: bool) -> Any:
    """The workers table (framed and titled, or `boxed=False`: compact)."""
    from rich import box
    from rich.table import Table

    t2 = Table(title="workers" if boxed else None, box=box.HEAVY_HEAD if boxed else box.SIMPLE_HEAD)
    for col in ("name", "pid", "state", "restarts", "heartbeat age"):
        t2.add_column(col)
    for w in doc["workers"]:
        age = w["heartbeat_age_ms"]
        t2.add_row(
            w["name"], str(w["pid"] or "-"), w["state"], str(w["restarts"]),
            "-" if age is None else f"{age} ms",
        )  # fmt: skip
    return t2


def _cleaner_rows(t: Any, cl: dict[str, Any]) -> None:
    disk = cl.get("disk")
    if disk:
        state = "DISK_FULL (puts refused)" if disk["disk_full"] else "ok"
        if disk["clean_immediately"]:
            state += ", cleaning immediately"
        t.add_row("disk used", f"{disk['ratio'] * 100:.1f} % ({state})")
    st = cl.get("status_file") or {}
    last = st.get("last_clean")
    if last:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["finished_ms"] / 1000))
        t.add_row(
            "last clean",
            f"{when}: {last['files_deleted']} files, {last['bytes_deleted']:,} B deleted",
        )
    totals = st.get("totals")
    if totals:
        unconsumed = totals.get("unconsumed_bytes_deleted") or 0
        t.add_row(
            "deleted since start",
            f"{totals['files_deleted']} files, {totals['bytes_deleted']:,} B "
            f"({unconsumed:,} B no consumer had read)",
        )


def run(args: argparse.Namespace) -> int:
    store = str(args.store_dir)
    shown = ""
    while True:  # a supervisor that recovers does not answer yet: say how far it is
        try:
            doc = channel.request(store, {"op": "status"})
            break
        except channel.SupervisorUnavailable as e:
            pid = store_lock_holder(store)
            if pid is None:
                print(f"mqstore status: {e}", file=sys.stderr)
                return 1
            line, starting = starting_line(store, pid)
            if line != shown:
                print(json.dumps(starting) if args.json else line, flush=True)
                shown = line
            if not args.watch:
                return NOT_SERVING_YET
            time.sleep(1.0)
    if args.json and not args.watch:
        print(json.dumps(doc, indent=2))
        return 0
    console = make_console()
    if not args.watch:
        console.print(render(doc))
        return 0
    with stop_signals():
        if not sys.stdout.isatty():
            return _watch_piped(store, doc, args.json)
        return _watch_screen(store, doc, args.json, console)


def _watch_screen(store: str, doc: dict[str, Any], as_json: bool, console: Any) -> int:
    """`--watch` on a terminal: the tables redrawn every second until Ctrl-C."""
    from rich.live import Live

    try:
        with Live(_fitted(doc, console), console=console, refresh_per_second=2) as live:
            while True:
                time.sleep(1.0)
                try:
                    doc = channel.request(store, {"op": "status"})
                except channel.SupervisorUnavailable as e:
                    console.print(f"supervisor gone: {e}")
                    return 1
                if as_json:
                    console.print_json(json.dumps(doc))
                else:
                    live.update(_fitted(doc, console))
    except KeyboardInterrupt:
        return 0


def starting_line(store: str, pid: int) -> tuple[str, dict[str, Any]]:
    """What a supervisor that holds the store but does not answer yet is doing: the
    line and the document (`recovering` set while its recovery reports progress)."""
    prog = read_progress(store)
    if prog is not None and prog["pid"] == pid:
        line = f"recovering: {describe(prog)} (supervisor pid {pid})"
        return line, {"state": "recovering", "supervisor_pid": pid, "recovering": prog}
    line = f"starting: supervisor pid {pid} holds the store and does not answer yet"
    return line, {"state": "starting", "supervisor_pid": pid}


def _fitted(doc: dict[str, Any], console: Any) -> Any:
    """The tables fitted to the terminal as it is now (it may have been resized); one
    row is left for the cursor."""
    return render(doc, height=max(console.size.height - 1, 1), width=console.size.width)


def _watch_piped(store: str, doc: dict[str, Any], as_json: bool) -> int:
    """`--watch` into a pipe or file: a line (or a JSON document) per change."""
    shown = ""
    try:
        while True:
            line = status_line(doc)
            if line != shown:
                print(json.dumps(doc) if as_json else line, flush=True)
                shown = line
            time.sleep(1.0)
            try:
                doc = channel.request(store, {"op": "status"})
            except channel.SupervisorUnavailable as e:
                print(f"mqstore status: supervisor gone: {e}", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        return 0
