"""`mqstore bench`: REPORT.md links every benchmark's table and plot and draws the sync /
async / peers latency plot from put.json; a --quick smoke run (the
engine's append, seconds) writes it too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.runtime.harness import REPO


def _row(name: str, label: str, mode: str | None, p50: float) -> dict[str, object]:
    return {
        "name": name,
        "label": label,
        "mode": mode,
        "batch": 0,
        "producers": 4,
        "lat_p50_us": p50,
        "lat_p99_us": p50 * 10,
        "lat_max_us": p50 * 100,
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", "bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_report_only_indexes_the_results(tmp_path: Path) -> None:
    (tmp_path / "put.md").write_text("# mqstore put\n\n- commit: `abc`, now\n")
    (tmp_path / "put.png").write_bytes(b"\x89PNG")
    (tmp_path / "dispatch.md").write_text("# Dispatch lag\n")
    rows = [
        _row("sync_pool", "mqstore sync pool", "sync", 900.0),
        _row("async_pool", "mqstore async pool", "async", 7.0),
        _row("sqlite_full", "peer sqlite_full", None, 95.0),
    ]
    (tmp_path / "put.json").write_text(json.dumps({"rows": rows}))
    done = _cli("--report-only", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "REPORT.md").read_text()
    assert "[put.md](put.md)" in text and "![put](put.png)" in text
    assert "[dispatch.md](dispatch.md)" in text and "dispatch.png" not in text
    assert "commit: `abc`" in text
    assert "![latency distribution](latency_cdf.png)" in text
    assert (tmp_path / "latency_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_report_without_put_data_has_no_latency_plot(tmp_path: Path) -> None:
    (tmp_path / "peers.md").write_text("# Peers\n")
    done = _cli("--report-only", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "REPORT.md").read_text()
    assert "[peers.md](peers.md)" in text and "latency_cdf" not in text


def test_quick_run_writes_the_report(tmp_path: Path) -> None:
    done = _cli("append", "--quick", "--out", str(tmp_path), "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "REPORT.md").is_file()
