"""Write one benchmark's results: `<name>.json`, `<name>.md` (table, goals, method) and
`<name>.png` (matplotlib, Agg backend), with the command, the git commit and the machine.

A benchmark hands over a `Report`: its rows (`RunResult.to_dict()` or any flat dicts),
the columns to show, and its goals. A `Goal` names the measured figure, the required
figure and whether higher is better; `ratio` is measured / required for "higher is
better" and required / measured otherwise, so a ratio >= 1 always means the goal is met.

The pieces every result shares live here too, for benchmarks that write their own
documents: `run_meta` (command, commit, machine, time), `head_lines` (the markdown head
that `bench.summary` reads), `table_lines` (a markdown table) and the common `Column`s.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
CODE_DIRS = ("engine", "ipc", "workers", "conf", "mqstore", "bench")


@dataclass
class Goal:
    """One goal of the issue, measured against a figure of the same run."""

    name: str
    measured: float | None
    required: float | None
    unit: str
    higher_is_better: bool = True
    basis: str = ""

    @property
    def ratio(self) -> float | None:
        if self.measured is None or self.required is None:
            return None
        if self.higher_is_better:
            return self.measured / self.required if self.required else None
        return self.required / self.measured if self.measured else float("inf")

    @property
    def met(self) -> bool | None:
        r = self.ratio
        return None if r is None else r >= 1.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        d["met"] = self.met
        return d


@dataclass
class Column:
    key: str
    title: str
    fmt: str = "{:,.0f}"


@dataclass
class Report:
    name: str
    title: str
    method: list[str]
    columns: list[Column]
    rows: list[dict[str, Any]]
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    plot_key: str = "msgs_per_s"
    plot_label: str = "messages per second"
    plotter: Callable[[Report, Path], None] | None = None  # default: `plot`


def latency_columns(per: str = "") -> list[Column]:
    """The p50, p99 and max latency columns (µs), their titles ending in `per`."""
    return [
        Column("lat_p50_us", f"p50 µs{per}", "{:,.1f}"),
        Column("lat_p99_us", f"p99 µs{per}", "{:,.1f}"),
        Column("lat_max_us", f"max µs{per}", "{:,.0f}"),
    ]


RATE_COLUMNS = [Column("msgs_per_s", "msgs/s"), Column("mb_per_s", "MB/s", "{:,.1f}")]
FSYNC_COLUMNS = [
    Column("msgs_per_fsync", "msgs/fsync", "{:,.1f}"),
    Column("fsyncs_per_s", "fsyncs/s", "{:,.0f}"),
]
LOAD_COLUMN = Column("load_1m", "load 1m", "{:.1f}")


def machine(bench_dir: Path | None = None) -> dict[str, Any]:
    """CPU model, cores, RAM, kernel, Python, and the filesystem under `bench_dir`."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = "unknown"
    if bench_dir is not None:
        fs = filesystem_of(bench_dir)
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "kernel": platform.release(),
        "filesystem": fs,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def machine_line(m: Mapping[str, Any] | None = None) -> str:
    """`machine()` (or `m`, one it returned) in one line: CPU, cores, RAM, kernel, Python."""
    m = machine() if m is None else m
    return (
        f"{m['cpu_model']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, "
        f"kernel {m['kernel']}, Python {m['python']}"
    )


def filesystem_of(path: Path) -> str:
    """The type and device of the mount that holds `path` (longest mount-point prefix)."""
    real = str(path.resolve())
    best_mount, best = "", "unknown"
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        inside = real == mp or real.startswith(mp.rstrip("/") + "/")
        if inside and len(mp) >= len(best_mount):
            best_mount, best = mp, f"{part.fstype} ({part.device} on {mp})"
    return best


def git_commit() -> str:
    """The short HEAD commit, with "-dirty" if bench/ or the store's code has local edits."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_DIRS],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """How a benchmark was run: `python -m <module>` and its arguments (`argv`, or this
    process's when None)."""
    return " ".join(["python -m", module, *(sys.argv[1:] if argv is None else argv)])


def run_meta(command: str, bench_dir: Path | None = None) -> dict[str, Any]:
    """What every result records about its run: the command, the commit, the machine
    (with the filesystem under `bench_dir`) and the time (UTC)."""
    return {
        "command": command,
        "git_commit": git_commit(),
        "machine": machine(bench_dir),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def head_lines(title: str, meta: Mapping[str, Any], *bullets: str) -> list[str]:
    """A result's markdown head: the title, the command, commit and machine of `meta`
    (`run_meta`), then one bullet per `bullets`, then a blank line."""
    m = meta["machine"]
    return [
        f"# {title}",
        "",
        f"- command: `{meta['command']}`",
        f"- commit: `{meta['git_commit']}`, {meta['when_utc']}",
        f"- machine: {machine_line(m)}",
        f"- bench directory filesystem: {m['filesystem']}",
        f"- load average when written (1/5/15 min): {m['load_avg_1_5_15']} "
        "(other work on the machine makes the figures noisy)",
        *(f"- {b}" for b in bullets),
        "",
    ]


def text_head(meta: Mapping[str, Any]) -> list[str]:
    """The same head for a plain text result (a profile): `# ` lines with the command,
    the commit and time, the machine and its load."""
    m = meta["machine"]
    return [
        f"# {meta['command']}",
        f"# commit {meta['git_commit']}, {meta['when_utc']}",
        f"# {machine_line(m)}, load {m['load_avg_1_5_15']}",
    ]


def save_text(result: Path, module: str, argv: Sequence[str] | None, text: str) -> None:
    """Append a plain text result to `result` under its `text_head` (the profiles'
    files keep every run, newest last)."""
    meta = run_meta(command_line(module, argv))
    with result.open("a") as f:
        f.write("\n".join([*text_head(meta), text, "", ""]))


_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def table_lines(titles: Sequence[str], rows: Iterable[Sequence[object]], align: str) -> list[str]:
    """A markdown table: the titles, the alignment row (`align`: a letter per column,
    l = left, r = right, c = centre), then a line per row of cells."""
    if len(align) != len(titles):
        raise ValueError(f"{len(titles)} titles but alignment {align!r}")
    return [
        "| " + " | ".join(titles) + " |",
        "| " + " | ".join(_ALIGN[a] for a in align) + " |",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def _fmt(value: Any, fmt: str) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, int | float):
        try:
            return fmt.format(value)
        except (ValueError, TypeError):
            return str(value)
    return str(value)


def markdown(report: Report, meta: dict[str, Any]) -> str:
    lines = head_lines(report.title, meta)
    if report.goals:
        lines += ["## Goals", ""]
        lines += table_lines(
            ["goal", "measured", "required", "ratio", "met", "basis"],
            (
                [
                    g.name,
                    f"{_fmt(g.measured, '{:,.1f}')} {g.unit}",
                    f"{_fmt(g.required, '{:,.1f}')} {g.unit}",
                    "" if g.ratio is None else f"{g.ratio:.2f}",
                    {True: "yes", False: "**no**", None: "n/a"}[g.met],
                    g.basis,
                ]
                for g in report.goals
            ),
            "lrrrcl",
        )
        lines.append("")
    lines += ["## Results", ""]
    lines += table_lines(
        [c.title for c in report.columns],
        ([_fmt(row.get(c.key), c.fmt) for c in report.columns] for row in report.rows),
        "l" + "r" * (len(report.columns) - 1),
    )
    lines.append("")
    if report.method:
        lines += ["## Method", ""] + [f"- {s}" for s in report.method] + [""]
    if report.notes:
        lines += ["## Notes", ""] + [f"- {s}" for s in report.notes] + [""]
    return "\n".join(lines)


def plot(report: Report, path: Path) -> None:
    """A horizontal bar chart of `plot_key` per row (log scale), goals marked in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        r
        for r in report.rows
        if isinstance(r.get(report.plot_key), int | float) and r.get("plot", True)
    ]
    labels = [str(r.get("label", r.get("name", "?"))) for r in rows]
    values = [float(r[report.plot_key]) for r in rows]
    height = max(3.0, 0.28 * len(rows) + 1.5)
    fig, ax = plt.subplots(figsize=(10, height))
    colors = [str(r.get("color", "tab:blue")) for r in rows]
    ax.barh(range(len(rows)), values, color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    if values and min(v for v in values if v > 0) * 100 < max(values):
        ax.set_xscale("log")
    ax.set_xlabel(report.plot_label)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=7)
    met = sum(1 for g in report.goals if g.met)
    title = report.title
    if report.goals:
        title += f" — goals met: {met}/{len(report.goals)}"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(
    report: Report,
    *,
    command: str,
    bench_dir: Path | None,
    out_dir: Path = RESULTS,
) -> dict[str, Path]:
    """Write `<name>.json`, `<name>.md` and `<name>.png` into `out_dir`; return the paths."""
    meta = run_meta(command, bench_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": report.name,
        "title": report.title,
        **meta,
        "goals": [g.to_dict() for g in report.goals],
        "rows": report.rows,
        "method": report.method,
        "notes": report.notes,
        **report.extra,
    }
    paths = {
        "json": out_dir / f"{report.name}.json",
        "md": out_dir / f"{report.name}.md",
        "png": out_dir / f"{report.name}.png",
    }
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["md"].write_text(markdown(report, meta))
    (report.plotter or plot)(report, paths["png"])
    return paths


def goal_table(goals: Sequence[Goal]) -> str:
    """The goals as plain text lines, for the console."""
    out = []
    for g in goals:
        ratio = "n/a" if g.ratio is None else f"{g.ratio:.2f}x"
        met = {True: "MET", False: "NOT MET", None: "n/a"}[g.met]
        out.append(
            f"  {g.name}: {_fmt(g.measured, '{:,.1f}')} vs {_fmt(g.required, '{:,.1f}')} "
            f"{g.unit} -> {ratio} {met}"
        )
    return "\n".join(out)
