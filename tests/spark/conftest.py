"""Spark local-mode fixtures: one SparkSession per test module (Java 17 and the ``spark`` extra)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def require_spark() -> None:
    """Skip the calling test module without Java or pyspark (CI has both: scripts/test)."""
    if shutil.which("java") is None:  # pragma: no cover
        pytest.skip("Spark tests need Java 17 (`java -version`)", allow_module_level=True)
    pytest.importorskip("pyspark", reason="Spark tests need the spark extra: ./scripts/setup test,spark")


# Spark's Python workers must run this interpreter (it has raftmq installed).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only


def spark_session(app: str) -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    import raftmq.spark

    raftmq.spark.register(spark)
    return spark


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    session = spark_session(request.module.__name__)
    yield session
    session.stop()
