"""What the cProfile runs (`bench.profile_put`, `bench.profile_pull`) share: their common
arguments, the store they profile against, the timed run then the profiled one, and the
text: cProfile's functions by own time under a head with the command, commit, machine
and the rate measured without the profiler; printed, and with `--save` written to
bench/results/."""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.report import RESULTS, command_line, run_meta, text_head
from bench.store_run import client_api, running_store


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


def add_profile_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments every profiler takes: the write pool, the functions shown, where the
    store goes and whether the text is saved."""
    ap.add_argument("--pool", choices=("on", "off"), default="on")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--save", action="store_true")


@contextlib.contextmanager
def profiled_client(args: argparse.Namespace, *, sync: bool) -> Iterator[Any]:
    """A client attached to a fresh store (SYNC_FLUSH or not, the pool per `--pool`) in a
    temporary directory under `--dir`, which is removed at the end."""
    store_client, _ = client_api()
    root = Path(tempfile.mkdtemp(prefix="mqstore-profile-", dir=args.dir))
    try:
        with (
            running_store(root, "profile", sync=sync, pool=args.pool == "on") as store,
            store_client.attach(store.store_dir) as client,
        ):
            yield client
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report_profile(
    module: str,
    argv: list[str] | None,
    args: argparse.Namespace,
    prof: cProfile.Profile,
    rate: float,
    setting: str,
    save_as: str,
) -> int:
    """Print the profile (the `--top` functions by own time), headed by the command,
    commit, machine, `setting` and the rate without the profiler; with `--save`, also
    write it to bench/results/`save_as` (paths shown relative to the checkout). Returns
    the exit code, 0."""
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    head = [
        *text_head(run_meta(command_line(module, argv))),
        f"# {setting}: {rate:,.0f} msgs/s without the profiler ({1e6 / rate:.1f} µs per message)",
        "",
    ]
    text = "\n".join(head) + out.getvalue()
    print(text)
    if args.save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / save_as
        path.write_text(text.replace(str(Path.cwd()) + "/", ""))
        print(f"wrote {path}")
    return 0
