"""One local Spark session for the whole pipeline suite (starting one costs ~5 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark import SparkContext

    from mqstore.pipeline import session

    s = session.start_session("mqstore-tests", "local[2]", SPARK_TEST_CONF)
    try:
        yield s
    finally:
        s.stop()
        # stop() leaves the JVM gateway running until the interpreter exits: end it now,
        # so the suite leaves no Java process behind even inside a longer pytest run
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if gateway is not None:
            gateway.shutdown()
        if proc is not None:
            proc.stdin.close()
            proc.wait(timeout=60)
        SparkContext._gateway = None
        SparkContext._jvm = None
