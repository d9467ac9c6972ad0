"""A SparkSession for the pipeline jobs that works on a fresh machine without setup.

What a first run would otherwise trip on, and what is done about it:

- Python workers run `python3` from PATH, not this interpreter: `PYSPARK_PYTHON` (and the
  driver's) default to `sys.executable`.
- Spark binds the machine's external address: `SPARK_LOCAL_IP` defaults to 127.0.0.1 when
  the master is local or on the loopback (a real cluster must reach the driver, so it is
  left alone then).
- Executors import `mqstore` as the driver does, from the environment `PYSPARK_PYTHON`
  names: its readers need the native extension (`mqstore._native`, the record scan), which
  no zip of modules can carry, so every machine of a cluster needs mqstore installed (the
  same version, with the `[spark]` extra). A zip of the `.py` files added with
  `addPyFile` used to be shipped; it came first on an executor's path and hid the installed
  package, so `from mqstore import _native` failed wherever mqstore was not found through
  an import hook (a wheel, or a plain path entry).
- A master set in code overrides `spark-submit --master`: under spark-submit (its
  gateway is already running) no master is set here unless one is given.
- Spark's own output (log4j's WARN lines, the JVM's warnings, the `[Stage 0:>` progress
  bar) shares the caller's stderr: `spark_log` sends what the JVM prints to a file
  instead, and the progress bar shows only on a terminal.
- Without Java, pyspark raises `JAVA_GATEWAY_EXITED` with no reason: `SparkStartError`
  says which java spark-submit looked for and how to get one.

Who may call: the CLI jobs and tests. Cost: starting a JVM (~5 s, ~640 MiB).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mqstore.pipeline.java import JAVA_VERSIONS, missing_java
from mqstore.pipeline.source import register

DEFAULT_MASTER = "local[*]"
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
}
PROGRESS_CONF = "spark.ui.showConsoleProgress"
# `format("mqstore")`'s JVM provider (pipeline/jvm, built by `make setup`): the Python
# source with column pruning. Without it the Python source alone serves the name.
PROVIDER_JAR = Path(__file__).resolve().parent / "jvm" / "mqstore-spark.jar"


class SparkStartError(RuntimeError):
    """Spark's JVM did not start; the message says why and what to do about it."""


class JavaNotFound(SparkStartError):
    """There is no java where Spark's scripts look (`pipeline.java`)."""


def _is_loopback(master: str | None) -> bool:
    if master is None or master.startswith("local"):
        return True
    return any(h in master for h in ("127.0.0.1", "localhost", "[::1]"))


def prepare_environment(master: str | None) -> None:
    """Set the variables a fresh machine lacks; values already set are kept."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if _is_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def launched_by_spark_submit() -> bool:
    """True when spark-submit started this process (its JVM gateway is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def owns_session() -> bool:
    """True when no SparkSession is active here, so one that `start_session` returns is
    the caller's to stop (a job run inside a notebook or a test leaves the host's alone)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is None


@contextmanager
def _output_to(log: Path | None) -> Iterator[None]:
    """Point this process's stdout and stderr (fds 1 and 2) at `log` while the block runs,
    so a JVM spawned inside it prints there for its whole life (pyspark spawns it with
    the inherited fds). Process-wide while it lasts: for a CLI, not a threaded host."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for each in (*saved, fd):
            os.close(each)


def start_session(
    app_name: str,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    spark_log: Path | None = None,
) -> Any:
    """Start (or join) a SparkSession ready for `format("mqstore")`.

    `master` None means `local[*]`, or whatever spark-submit was given when launched by it.
    A session already running in this process is joined (its master and static settings
    stay as they are); `owns_session()` tells a caller whether to stop it afterwards.
    `spark_log`: the file a JVM started here prints to (appended) instead of this
    process's stdout and stderr. Raises SparkStartError when the JVM does not start.
    """
    prepare_environment(master)
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not launched_by_spark_submit():
        builder = builder.master(DEFAULT_MASTER)
    progress = spark_log is None and sys.stderr.isatty()  # `\r` bars garble a file
    settings = {**BASE_CONF, PROGRESS_CONF: str(progress).lower(), **(conf or {})}
    if PROVIDER_JAR.is_file():
        jars = [j for j in settings.get("spark.jars", "").split(",") if j]
        settings["spark.jars"] = ",".join([*jars, str(PROVIDER_JAR)])
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with _output_to(spark_log):
            spark = builder.getOrCreate()
    except PySparkRuntimeError as e:
        if e.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        missing = missing_java()
        if missing is not None:
            raise JavaNotFound(missing) from None
        where = "its log" if spark_log is not None else "its output above"
        raise SparkStartError(
            f"Spark's JVM exited before it started (Spark 4 runs on Java {JAVA_VERSIONS}); "
            f"see {where}"
        ) from None
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
