"""The `put` benchmark's report: its table columns, its goals (mqstore against the peers
of the same run, and its memory), its plot and the `Report` that `bench.report` writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.peers import (
    best,
    peer_rows,
)
from bench.procs import RunResult
from bench.report import (
    FSYNC_COLUMNS,
    LOAD_COLUMN,
    RATE_COLUMNS,
    Column,
    Goal,
    Report,
    latency_columns,
)
from bench.store_run import BATCH

GOAL_PEERS = ("sqlite_full", "fdatasync_append", "lmdb_writemap")


PUT_COLUMNS = [
    Column("label", "run", "{}"),
    Column("producers", "producers", "{}"),
    *RATE_COLUMNS,
    *latency_columns(),
    *FSYNC_COLUMNS,
    Column("errors", "errors", "{}"),
    Column("messages", "messages"),
    LOAD_COLUMN,
]


def _row(r: RunResult) -> dict[str, Any]:
    d = r.to_dict()
    d.update(r.extra)
    mode = "batch" if r.extra.get("batch") else str(r.extra.get("mode"))
    d["label"] = f"mqstore {mode} {'pool' if r.extra.get('pool') else 'no pool'}"
    if r.extra.get("batch"):
        d["label"] += f" ({r.extra['batch']}/call)"
    d["errors"] = sum(r.extra.get("errors", {}).values()) or ""
    d["color"] = {"sync": "tab:red", "async": "tab:blue", "batch": "tab:purple"}[mode]
    return d


def _find(rs: Sequence[RunResult], mode: str, pool: bool, n: int) -> RunResult | None:
    for r in rs:
        same = r.extra.get("mode") == mode and r.extra.get("pool") == pool
        if same and r.producers == n and not r.extra.get("batch"):
            return r
    return None


def goals(
    runs: Sequence[RunResult], peer_results: Sequence[RunResult], mem: Mapping[str, Any] | None
) -> list[Goal]:
    """Issue 12's goals. Async against LMDB writemap (sync off, one txn per put): its
    figure at 1 producer, and its best; sync against per-message write+fdatasync appends
    by as many processes as mqstore's producers."""
    out: list[Goal] = []
    lw_best = best(peer_results, "lmdb_writemap")

    def peer_at(name: str, n: int) -> RunResult | None:
        return next((p for p in peer_results if p.name == name and p.producers == n), None)

    def basis(p: RunResult | None, what: str = "") -> str:
        if p is None:
            return "peer not measured"
        return f"{p.name} x{p.producers} = {p.msgs_per_s:,.0f} msgs/s{what}"

    def rate(r: RunResult | None) -> float | None:
        return None if r is None else r.msgs_per_s

    def times(p: RunResult | None, k: float) -> float | None:
        return None if p is None else k * p.msgs_per_s

    for pool in (True, False):
        tag = "pool on" if pool else "pool off"
        lw1 = peer_at("lmdb_writemap", 1)
        out.append(
            Goal(
                f"async 1 ({tag}) >= 1.5x LMDB writemap",
                rate(_find(runs, "async", pool, 1)),
                times(lw1, 1.5),
                "msgs/s",
                basis=basis(lw1),
            )
        )
        for n in (2, 4):
            out.append(
                Goal(
                    f"async {n} ({tag}) >= 2x LMDB's best",
                    rate(_find(runs, "async", pool, n)),
                    times(lw_best, 2),
                    "msgs/s",
                    basis=basis(lw_best, " (its best)"),
                )
            )
        for n, k in ((1, 0.9), (16, 2.5), (64, 5.0)):
            fd = peer_at("fdatasync_append", n)
            out.append(
                Goal(
                    f"sync {n} ({tag}) >= {k:g}x write+fdatasync x{n}",
                    rate(_find(runs, "sync", pool, n)),
                    times(fd, k),
                    "msgs/s",
                    basis=basis(fd),
                )
            )
        s16 = _find(runs, "sync", pool, 16)
        out.append(
            Goal(
                f"sync 16 ({tag}) p99 <= 2 ms",
                None if s16 is None else s16.lat_p99_us,
                2000.0,
                "µs",
                higher_is_better=False,
            )
        )
    for r in runs:
        if r.extra.get("batch"):
            tag = "pool on" if r.extra.get("pool") else "pool off"
            out.append(
                Goal(
                    f"batch of {BATCH}, 1 producer ({tag}) >= 1M msgs/s",
                    r.msgs_per_s,
                    1e6,
                    "msgs/s",
                )
            )
    if mem is not None:
        mib = 1024 * 1024
        c = mem["client"]
        if "cpu_per_put_us" in c:
            out.append(
                Goal(
                    "client CPU per async put <= 2 µs",
                    c["cpu_per_put_us"],
                    2.0,
                    "µs",
                    higher_is_better=False,
                    basis=f"thread CPU over {c['cpu_puts']:,} puts with wait_store=False, "
                    "1 KiB body, tag, unique key",
                )
            )
        out.append(
            Goal(
                "client RSS above bare import <= 15 MiB",
                c["rss_above_bare"] / mib,
                15.0,
                "MiB",
                higher_is_better=False,
                basis=f"after attach + {c['puts']} puts; USS above bare "
                f"{c['uss_above_bare'] / mib:.1f} MiB",
            )
        )
        marks = mem["marks"]
        if len(marks) >= 2:
            lo, hi = marks[0], marks[-1]
            at = (
                f"at {hi['appended_bytes_at_least'] / 2**30:.2f} GiB vs 1.1x at "
                f"{lo['appended_bytes_at_least'] / 2**30:.2f} GiB appended"
            )
            for kind, what in (
                ("rss", "RSS"),
                ("rss_other", "RSS outside the pool's shm and the store's mapped files"),
            ):
                out.append(
                    Goal(
                        f"supervisor+workers {what} does not grow with data",
                        hi[kind] / mib,
                        1.1 * lo[kind] / mib,
                        "MiB",
                        higher_is_better=False,
                        basis=f"{at} (10% allowed for noise); shm "
                        f"{lo['rss_shm'] / mib:.0f} -> {hi['rss_shm'] / mib:.0f} MiB, mapped "
                        f"store files {lo['rss_store_files'] / mib:.0f} -> "
                        f"{hi['rss_store_files'] / mib:.0f} MiB",
                    )
                )
        shm = mem["shm"]
        out.append(
            Goal(
                "/dev/shm in use <= pool + control block",
                shm["total_bytes"] / mib,
                (shm["pool_bytes"] + shm["control_block_bytes"]) / mib,
                "MiB",
                higher_is_better=False,
                basis=f"pool {shm['pool_bytes'] / mib:.0f} MiB + control block "
                f"{shm['control_block_bytes'] / mib:.2f} MiB; other files "
                f"{shm['other_bytes']} B",
            )
        )
    return out


def _producer_axes(ax: Any, counts: Sequence[int], ylabel: str, title: str) -> None:
    """Log-log axes over the producer counts."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("producer processes")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)


def plot_put(report: Report, path: Path) -> None:
    """Left: msgs/s against producers per mode, with the peers' best rates as lines and
    batch as points. Right: p99 latency against producers, with the 2 ms goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if str(r.get("label", "")).startswith("mqstore")]
    series: dict[str, list[tuple[int, float, float]]] = {}
    for r in rows:
        if r.get("batch"):
            continue
        series.setdefault(str(r["label"]), []).append(
            (int(r["producers"]), float(r["msgs_per_s"]), float(r["lat_p99_us"]))
        )
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    styles = {
        "mqstore sync pool": ("tab:red", "-"),
        "mqstore sync no pool": ("tab:red", "--"),
        "mqstore async pool": ("tab:blue", "-"),
        "mqstore async no pool": ("tab:blue", "--"),
    }
    for label, pts in series.items():
        pts.sort()
        color, ls = styles.get(label, ("black", ":"))
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], marker="o", color=color, ls=ls, label=label)
        ax2.plot(xs, [p[2] / 1000 for p in pts], marker="o", color=color, ls=ls, label=label)
    batches = [r for r in rows if r.get("batch")]
    for i, r in enumerate(batches):
        y = float(r["msgs_per_s"])
        ax.scatter([1], [y], marker="*", s=120, color="tab:purple", zorder=5)
        ax.annotate(
            f"{r['label'][8:]} {y:,.0f}",
            (1, y),
            xytext=(8, 10 - 12 * i),
            textcoords="offset points",
            fontsize=7,
            color="tab:purple",
        )
    counts = sorted({p[0] for pts in series.values() for p in pts})
    peer_colors = {"sqlite_full": "tab:orange", "fdatasync_append": "tab:gray"}
    peer_colors["lmdb_writemap"] = "tab:green"
    best_peer: dict[str, dict[str, Any]] = {}
    for r in report.rows:
        name = str(r.get("name", ""))
        if name in peer_colors and (
            name not in best_peer or r["msgs_per_s"] > best_peer[name]["msgs_per_s"]
        ):
            best_peer[name] = r
    for name, r in best_peer.items():
        ax.axhline(r["msgs_per_s"], color=peer_colors[name], ls=":", lw=1.2)
        ax.annotate(
            f"{name} (best, x{r['producers']}) {r['msgs_per_s']:,.0f}",
            (1, r["msgs_per_s"]),
            fontsize=7,
            color=peer_colors[name],
            va="bottom",
        )
    ax.axhline(1e6, color="tab:purple", ls=":", lw=1)
    _producer_axes(ax, counts, "messages per second (PUT_OK)", "put throughput, 1 KiB bodies")
    ax.legend(fontsize=7, loc="lower right")
    ax2.axhline(2.0, color="black", ls=":", lw=1)
    ax2.annotate("goal: sync 16 p99 <= 2 ms", (1, 2.0), fontsize=7, va="bottom")
    _producer_axes(ax2, counts, "p99 latency per put (ms)", "put latency p99")
    met = sum(1 for g in report.goals if g.met)
    fig.suptitle(f"{report.title} — goals met: {met}/{len(report.goals)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _memory_notes(mem: Mapping[str, Any], mem_rows: Sequence[Mapping[str, Any]]) -> list[str]:
    mib = 1024 * 1024
    return [
        *(
            f"{m['label']} ({m['processes']} processes): RSS {m['rss']} MiB = shm "
            f"{m['rss_shm']} + mapped store files {m['rss_store_files']} + other "
            f"{m['rss_other']}; USS {m['uss']} MiB"
            for m in mem_rows
        ),
        f"client: RSS above a bare interpreter that imported mqstore "
        f"{mem['client']['rss_above_bare'] / mib:.1f} MiB after attach and "
        f"{mem['client']['puts']} puts ({mem['client']['attach_rss_above_bare'] / mib:.1f}"
        f" MiB after attach alone; USS {mem['client']['uss_above_bare'] / mib:.1f} MiB).",
        f"shm: {json.dumps(mem['shm']['files'])}",
    ]


def build_report(
    runs: Sequence[RunResult],
    peer_results: Sequence[RunResult],
    mem: Mapping[str, Any] | None,
    duration: float,
    counts: Sequence[int],
    unique_keys: bool,
) -> Report:
    """The `put` report of one run: mqstore's runs, the goal peers' rows, the memory
    (None: not measured, `--sync-only`)."""
    mib = 1024 * 1024
    goal_list = goals(runs, peer_results, mem)
    rows = [_row(r) for r in runs]
    for pr in peer_rows([p for p in peer_results if p.name in GOAL_PEERS]):
        pr["label"] = f"peer {pr['name']}"
        rows.append(pr)
    mem_rows = [
        {
            "label": f"server after >= {m['appended_bytes_at_least'] / 2**30:.2f} GiB",
            **{k: round(m[k] / mib, 1) for k in m if k.startswith(("rss", "uss"))},
            "processes": m["processes"],
        }
        for m in (mem or {}).get("marks", [])
    ]
    return Report(
        name="put",
        title="mqstore put through the public client (1 KiB bodies)",
        method=[
            f"{duration:g} s per configuration, a fresh store each (mqstore start, SIGTERM).",
            "Producers are processes (fork), each attached with StoreClient.attach; every put "
            "encodes from topic, body (1 KiB), tags and keys "
            f"({'a key unique to each message' if unique_keys else 'one key per producer'}"
            "); only PUT_OK counts.",
            "sync = SYNC_FLUSH with wait_store=True; async = ASYNC_FLUSH; pool = "
            "transient_store_pool_enable; batch = put_batch of "
            f"{BATCH} messages per call, latency per call.",
            "msgs/fsync and fsyncs/s: the flusher's counters (mqstore status --json) "
            "before and after the run.",
            "Goals take each peer's best rate over its producer counts in this run "
            "(the strictest reading).",
            "Memory: RSS/USS via psutil; server = supervisor + all its descendants.",
        ],
        columns=PUT_COLUMNS,
        rows=rows,
        goals=goal_list,
        plotter=plot_put,
        notes=["Peers in full: peers.md.", *(_memory_notes(mem, mem_rows) if mem else [])],
        extra={
            "duration_s": duration,
            "producers": list(counts),
            "batch": BATCH,
            "memory": mem,
            "peers": [p.to_dict() for p in peer_results],
        },
    )
