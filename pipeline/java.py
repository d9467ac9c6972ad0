"""Where Spark's scripts look for Java, and what to tell a user who has none.

`spark-class` (which `spark-submit`, pyspark's gateway and the standalone daemons all
go through) runs `$JAVA_HOME/bin/java` when JAVA_HOME is set, else `java` from PATH.
Without one, pyspark only says `JAVA_GATEWAY_EXITED` and a daemon only `JAVA_HOME is
not set`; `missing_java()` says which of the two places was empty and how to fill it.

Imports nothing of Spark's, so it answers before pyspark is imported. Cost: one stat or
one PATH search.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

JAVA_VERSIONS = "17 or 21"  # what Spark 4 runs on


def java_problem() -> str | None:
    """Why `spark-class` would find no java, looking where it looks; None when it would."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home, "bin", "java")
        return None if os.access(java, os.X_OK) else f"JAVA_HOME is {home}, which has no bin/java"
    return None if shutil.which("java") else "no java on PATH and JAVA_HOME is not set"


def missing_java() -> str | None:
    """One line for a user without Java, with the fix; None when there is one to run."""
    problem = java_problem()
    if problem is None:
        return None
    return (
        f"Spark needs Java {JAVA_VERSIONS}: {problem}; install a JDK (Debian/Ubuntu: "
        "apt-get install openjdk-17-jre-headless) or set JAVA_HOME to one"
    )
