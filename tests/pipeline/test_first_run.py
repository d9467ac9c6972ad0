"""What a first run of `mqstore pipeline` trips on, through the real command in a fresh
process: no Java, no `[spark]` extra, an export path that exists, and Spark's own output.

Each gets one line on stderr that says what to do, and exit 2. What Spark's JVM prints
goes to a temporary file (TMPDIR is the test's, so what is left there is seen), removed
after success and kept and named after a failure; `--verbose` shows it on stderr.

The missing extra is made by a meta-path finder in the child's `-c` wrapper that refuses
the extra's modules as the import system refuses a module that is not installed (the
same ModuleNotFoundError, with its name). That is a fault seam in the interpreter's
import system, which mqstore does not own: mqstore's code runs unchanged, as it would
in an environment installed without the extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline import storegen

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

WITHOUT_MODULES = """
import runpy, sys
from importlib.abc import MetaPathFinder

REFUSED = set(sys.argv[1].split(","))

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["mqstore", *sys.argv[2:]]
runpy.run_module("mqstore", run_name="__main__", alter_sys=True)
"""


def _env(tmp_path: Path, **overrides: str | None) -> dict[str, str]:
    """A fresh shell's environment (no Spark variables), with TMPDIR the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    env["PYTHONPATH"] = str(REPO)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp_path / "tmp")
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _run(
    tmp_path: Path, args: list[str], env: dict[str, str], prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, *(prefix or ["-m", "mqstore"]), *args]
    return subprocess.run(
        cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def _spark_logs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "tmp").glob("mqstore-pipeline-*.log"))


def _errors(stderr: str) -> list[str]:
    """The lines after the job's header line (`mqstore pipeline JOB: N segment(s)...`)."""
    return [line for line in stderr.splitlines() if "segment(s)" not in line]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    storegen.write_store(root, storegen.mixed_messages(40), segment_bytes=16384)
    return root


def _path_without_java(tmp_path: Path) -> str:
    """A PATH with every program of this one but `java` (spark-class needs bash & co.)."""
    bin_dir = tmp_path / "bin-without-java"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            link = bin_dir / entry.name
            if entry.name != "java" and not link.exists():
                link.symlink_to(entry.path)
    return str(bin_dir)


@pytest.mark.parametrize("where", ["PATH", "JAVA_HOME"])
def test_without_java_one_line_says_install_a_jdk(tmp_path: Path, store: Path, where: str) -> None:
    if where == "PATH":
        env = _env(tmp_path, PATH=_path_without_java(tmp_path), JAVA_HOME=None)
        reason = "no java on PATH and JAVA_HOME is not set"
    else:
        empty = tmp_path / "not-a-jdk"
        empty.mkdir()
        env = _env(tmp_path, JAVA_HOME=str(empty))
        reason = f"JAVA_HOME is {empty}, which has no bin/java"
    res = _run(tmp_path, ["pipeline", "stats", str(store)], env)
    assert res.returncode == 2, res.stderr
    assert _errors(res.stderr) == [
        f"mqstore pipeline: Spark needs Java 17 or 21: {reason}; install a JDK "
        "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME to one"
    ]
    assert res.stdout == ""
    assert _spark_logs(tmp_path) == []  # its one line said all; nothing left behind


def test_a_jvm_that_does_not_start_leaves_its_output_in_the_kept_log(
    tmp_path: Path, store: Path
) -> None:
    jdk = tmp_path / "broken-jdk"
    (jdk / "bin").mkdir(parents=True)
    java = jdk / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'Error: could not create the Java Virtual Machine.' >&2\n")
    java.chmod(0o755)
    res = _run(tmp_path, ["pipeline", "stats", str(store)], _env(tmp_path, JAVA_HOME=str(jdk)))
    assert res.returncode == 1, res.stderr
    (log,) = _spark_logs(tmp_path)
    assert _errors(res.stderr) == [
        "mqstore pipeline: Spark's JVM exited before it started (Spark 4 runs on Java 17 "
        "or 21); see its log",
        f"mqstore pipeline: Spark's log: {log}",
    ]
    assert "could not create the Java Virtual Machine" in log.read_text()


@pytest.mark.parametrize(
    ("refused", "args", "named"),
    [
        ("pyarrow,pyspark", ["stats", "STORE"], "pyarrow"),
        ("pyspark", ["query", "STORE", "--topic", "orders"], "pyspark"),
        ("pyspark", ["cluster", "--print"], "pyspark"),
    ],
)
def test_without_the_spark_extra_one_line_says_install_it(
    tmp_path: Path, store: Path, refused: str, args: list[str], named: str
) -> None:
    argv = ["pipeline", *(str(store) if a == "STORE" else a for a in args)]
    res = _run(tmp_path, [refused, *argv], _env(tmp_path), prefix=["-c", WITHOUT_MODULES])
    assert res.returncode == 2, res.stderr
    assert _errors(res.stderr) == [
        f"mqstore pipeline: no module '{named}': the pipeline needs the [spark] extra: "
        "pip install 'mqstore[spark]'"
    ]
    assert res.stdout == ""


def test_export_to_an_existing_path_says_mode_overwrite_and_spark_stays_quiet(
    tmp_path: Path, store: Path
) -> None:
    out = tmp_path / "exported"
    out.mkdir()
    (out / "kept.txt").write_text("mine")
    env = _env(tmp_path)
    # Refused before Spark starts (a minute on a busy machine): also where pyspark could
    # not even be imported, the one line is about the path.
    res = _run(
        tmp_path, ["pyspark,py4j", "pipeline", "export", str(store), "--to", str(out)], env,
        prefix=["-c", WITHOUT_MODULES],
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert _errors(res.stderr) == [
        f"mqstore pipeline export: {out} exists, nothing written: --mode overwrite "
        "replaces it, --mode append adds to it"
    ]
    assert [p.name for p in out.iterdir()] == ["kept.txt"]
    assert _spark_logs(tmp_path) == []

    # the fix it names works, and a job that succeeds prints nothing of Spark's
    args = ["pipeline", "export", str(store), "--to", str(out), "--mode", "overwrite"]
    res = _run(tmp_path, args, env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"exported 40 records to {out} ")
    assert _errors(res.stderr) == []
    assert not (out / "kept.txt").exists() and (out / "topic=orders").is_dir()
    assert _spark_logs(tmp_path) == []


def test_verbose_shows_sparks_log_on_stderr_without_a_progress_bar_in_a_file(
    tmp_path: Path, store: Path
) -> None:
    res = _run(tmp_path, ["pipeline", "stats", str(store), "--json", "--verbose"], _env(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "log4j" in res.stderr  # Spark's own startup lines, which are quiet without -v
    assert "[Stage" not in res.stderr  # stderr is a pipe here, not a terminal
    assert _spark_logs(tmp_path) == []
