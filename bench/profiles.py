"""The text of a profile run (`bench.profile_put`, `bench.profile_pull`): cProfile's
functions by own time under a head with the command, commit, machine and the rate
measured without the profiler; printed, and with `save` written to bench/results/."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from pathlib import Path

from bench.report import RESULTS, git_commit, machine


def report_profile(
    command: str, prof: cProfile.Profile, *, top: int, summary: str, save_as: str | None
) -> None:
    """Print the profile; with `save_as`, also write it to bench/results/`save_as`
    (paths shown relative to the checkout)."""
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    m = machine(None)
    head = [
        f"# {command}",
        f"# commit {git_commit()}, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"# {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, "
        f"load {m['load_avg_1_5_15']}",
        f"# {summary}",
        "",
    ]
    text = "\n".join(head) + out.getvalue()
    print(text)
    if save_as is not None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / save_as
        path.write_text(text.replace(str(Path.cwd()) + "/", ""))
        print(f"wrote {path}")
