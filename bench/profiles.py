"""The text of a profile run (`bench.profile_put`, `bench.profile_pull`): cProfile's
functions by own time under a head with the command, commit, machine and the rate
measured without the profiler; printed, and with `save` written to bench/results/."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable
from pathlib import Path

from bench.report import RESULTS, run_meta, text_head


def profile_run(run: Callable[[int], int]) -> tuple[float, cProfile.Profile]:
    """Call `run(1)` timed, for the rate without the profiler (`run` returns the
    messages it handled), then `run(2)` under cProfile; the rate and the profile."""
    t0 = time.perf_counter()
    n = run(1)
    rate = n / (time.perf_counter() - t0)
    prof = cProfile.Profile()
    prof.enable()
    run(2)
    prof.disable()
    return rate, prof


def report_profile(
    command: str,
    prof: cProfile.Profile,
    *,
    top: int,
    setting: str,
    rate: float,
    save_as: str | None,
) -> None:
    """Print the profile, headed by the command, commit, machine, `setting` and the rate
    without the profiler; with `save_as`, also write it to bench/results/`save_as`
    (paths shown relative to the checkout)."""
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    head = [
        *text_head(run_meta(command)),
        f"# {setting}: {rate:,.0f} msgs/s without the profiler ({1e6 / rate:.1f} µs per message)",
        "",
    ]
    text = "\n".join(head) + out.getvalue()
    print(text)
    if save_as is not None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / save_as
        path.write_text(text.replace(str(Path.cwd()) + "/", ""))
        print(f"wrote {path}")
