"""`mqstore_build_info{version, commit}`: which mqstore a store runs, for dashboards that
must tell two deployments apart (Prometheus' `*_build_info` convention: value 1, the
facts in labels).

The version is the installed distribution's; the commit is the checkout's HEAD (short,
"-dirty" with local edits to tracked files) when the package runs from a git checkout
(an editable install, `make run`), else "unknown": a wheel records no commit. Both are
read once per process.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import mqstore


@functools.cache
def commit() -> str:
    """The short git commit of the code this process runs, or "unknown"."""
    where = os.path.dirname(os.path.realpath(__file__))  # in a checkout: <repo>/workers
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, cwd=where, timeout=5,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, cwd=where, timeout=5,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "") if head else "unknown"


class BuildInfoCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "mqstore_build_info",
            "always 1; the mqstore version and git commit the supervisor runs",
            labels=["version", "commit"],
        )
        g.add_metric([mqstore.__version__, commit()], 1.0)
        yield g
