"""raftmq for Apache Spark: the ``raftmq`` PySpark data source and replay jobs (``docs/spark.md``).

Install with the ``spark`` extra (``pip install raftmq[spark]``: pyspark 4.3.0, pyarrow, pandas<3)::

    import raftmq.spark
    raftmq.spark.register(spark)
    spark.read.format("raftmq").option("brokers", "http://127.0.0.1:8081").option("topic", "t").load()
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``raftmq`` format with a SparkSession."""
    from .source import register as _register

    _register(spark)
