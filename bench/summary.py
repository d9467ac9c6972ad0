"""`python -m bench.summary [--out DIR]`: bench/results/REPORT.md, the index of the
benchmark results (`mqstore bench` writes it after `python -m bench`).

One section per benchmark whose `<name>.md` is there: its title, a link to the table and
its plot. From `put.json`, the latency CDFs of sync and async puts against the peers of
the same run, at one producer count: each run keeps its latency at `CDF_QUANTILES`
(results written before runs kept them have p50, p99 and max only: those three points).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.procs import CDF_QUANTILES
from bench.report import RESULTS

ORDER = ("put", "peers", "append", "dispatch", "recovery", "clean", "pipeline")
CDF_PNG = "latency_cdf.png"


def _title(md: Path) -> str:
    first = md.read_text(encoding="utf-8").splitlines()[:1]
    return first[0].lstrip("# ").strip() if first else md.stem


def _meta(md: Path) -> str:
    for line in md.read_text(encoding="utf-8").splitlines()[1:8]:
        if line.startswith("- commit:"):
            return line[2:]
    return ""


def plot_latency_cdf(put_json: Path, out: Path, producers: int = 4) -> bool:
    """Sync and async puts (pool on and off) and the peers at `producers`; False if the
    data is not there."""
    doc: dict[str, Any] = json.loads(put_json.read_text(encoding="utf-8"))
    rows = [
        r
        for r in doc.get("rows", [])
        if r.get("producers") == producers
        and not r.get("batch")
        and r.get("lat_p50_us") is not None
        and r.get("lat_p99_us") is not None
        and r.get("lat_max_us") is not None
    ]
    if not any(r.get("mode") for r in rows):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    full = all(len(r.get("lat_cdf_us") or ()) == len(CDF_QUANTILES) for r in rows)
    for r in rows:
        if full:
            xs, ys = list(r["lat_cdf_us"]), list(CDF_QUANTILES)
        else:
            xs, ys = [r["lat_p50_us"], r["lat_p99_us"], r["lat_max_us"]], [0.5, 0.99, 1.0]
        style = "-" if r.get("mode") == "sync" else "--" if r.get("mode") == "async" else ":"
        ax.plot(xs, ys, style, marker="." if full else "o", label=r.get("label", r["name"]))
    ax.set_xscale("log")
    ax.set_xlabel("put latency (µs, log)")
    ax.set_ylabel("fraction of puts at or below")
    what = "CDF" if full else "p50, p99, max"
    ax.set_title(f"Put latency ({what}) at {producers} producers: mqstore vs peers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def write_report(out_dir: Path = RESULTS) -> Path:
    mds = {p.stem: p for p in out_dir.glob("*.md") if p.name != "REPORT.md"}
    names = [n for n in ORDER if n in mds] + sorted(n for n in mds if n not in ORDER)
    lines = [
        "# mqstore benchmark report",
        "",
        "Written by `mqstore bench` (`python -m bench`, then `python -m bench.summary`).",
        "Each section links the benchmark's table (method, figures, goals, machine) and plot.",
        "",
    ]
    put_json = out_dir / "put.json"
    if put_json.is_file() and plot_latency_cdf(put_json, out_dir / CDF_PNG):
        lines += [
            "## Put latency: sync and async against the peers",
            "",
            "Latency distribution of each run at 4 producers (CDF points from p1 to max;",
            "results from before runs kept them show p50, p99 and max only). Solid:",
            "SYNC_FLUSH; dashed: ASYNC_FLUSH; dotted: peers.",
            "",
            f"![latency distribution]({CDF_PNG})",
            "",
        ]
    for name in names:
        md = mds[name]
        lines += [f"## {_title(md)}", "", f"- table: [{md.name}]({md.name})"]
        meta = _meta(md)
        if meta:
            lines.append(f"- {meta}")
        png = out_dir / f"{name}.png"
        if png.is_file():
            lines += ["", f"![{name}]({png.name})"]
        lines.append("")
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.summary", description=__doc__)
    ap.add_argument("--out", default=str(RESULTS), help="the results directory")
    args = ap.parse_args(argv)
    print(write_report(Path(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
