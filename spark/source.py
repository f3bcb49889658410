"""The ``raftmq`` PySpark data source (batch and Structured Streaming), mirroring Spark's Kafka source.

Usage (``docs/spark.md``)::

    import raftmq.spark
    raftmq.spark.register(spark)
    df = (spark.read.format("raftmq")
          .option("brokers", "http://127.0.0.1:8081,http://127.0.0.1:8082")
          .option("topic", "orders")
          .load())

Rows have Kafka's schema; ``partition`` is the raftmq queue. Batch reads plan from the committed
high offsets and the segment manifest, read sealed segments directly (their Arrow IPC files,
memory-mapped when visible, else over HTTP) and the unsealed committed tail through the Arrow
fetch. Streaming reads checkpoint ``{"<topic>": {"<queue>": offset}}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ._client import (
    BrokerClient,
    Brokers,
    Split,
    check_start,
    manifest,
    offset_for_timestamp,
    plan_queue,
    rate_limit,
    read_split,
    split_further,
)

__all__ = ["RaftmqDataSource", "register"]

SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = ", headers array<struct<key: string, value: binary>>"
EARLIEST = -2
LATEST = -1
SEGMENT_ROWS_PER_SPLIT = 1_048_576
TAIL_ROWS_PER_SPLIT = 1_000_000


def register(spark: Any) -> None:
    """Register the ``raftmq`` format with ``spark`` (a SparkSession)."""
    spark.dataSource.register(RaftmqDataSource)


def _bool(options: Any, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name!r} must be true or false, got {raw!r}")
    return value == "true"


def _int(options: Any, name: str, minimum: int = 0) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"option {name!r} must be at least {minimum}, got {value}")
    return value


class _Options:
    """The parsed options (keys are case-insensitive, as Spark hands them over)."""

    def __init__(self, options: Any, streaming: bool) -> None:
        self.brokers = Brokers.from_options(options)
        raw_topics = options.get("topic") or options.get("subscribe")
        if not raw_topics:
            raise ValueError("option 'topic' (or 'subscribe') is required")
        self.topics = [t.strip() for t in str(raw_topics).split(",") if t.strip()]
        unsupported = [k for k in ("subscribePattern", "assign") if options.get(k) is not None]
        if unsupported:
            raise ValueError(f"options {unsupported} are not supported; use 'topic'/'subscribe'")
        self.starting = str(options.get("startingOffsets") or ("latest" if streaming else "earliest"))
        self.ending = str(options.get("endingOffsets") or "latest")
        if streaming and options.get("endingOffsets") is not None:
            raise ValueError("option 'endingOffsets' is for batch queries only")
        self.starting_timestamp = _int(options, "startingTimestamp")
        self.min_partitions = _int(options, "minPartitions", 1) or 1
        self.max_offsets_per_trigger = _int(options, "maxOffsetsPerTrigger", 1)
        self.fail_on_data_loss = _bool(options, "failOnDataLoss", True)
        self.include_headers = _bool(options, "includeHeaders", False)
        self.verify = _bool(options, "verifyChecksums", True)
        self.rows_per_split = _int(options, "segmentRowsPerPartition", 1) or SEGMENT_ROWS_PER_SPLIT
        self.tail_rows_per_split = _int(options, "tailRowsPerPartition", 1) or TAIL_ROWS_PER_SPLIT
        _parse_offsets(self.starting, self.topics, "startingOffsets")
        ending = _parse_offsets(self.ending, self.topics, "endingOffsets")
        if ending == "earliest" or (
            isinstance(ending, dict) and any(v == EARLIEST for qs in ending.values() for v in qs.values())
        ):
            raise ValueError("endingOffsets cannot be 'earliest' (-2)")


def _parse_offsets(raw: str, topics: list[str], name: str) -> str | dict[str, dict[int, int]]:
    """'earliest', 'latest', or ``{"topic": {"<queue>": offset}}`` (-2 earliest, -1 latest)."""
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        obj = json.loads(text)
    except ValueError:
        raise ValueError(f"option {name!r} must be earliest, latest or JSON, got {raw!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"option {name!r}: expected a JSON object of topic -> {{queue: offset}}")
    out: dict[str, dict[int, int]] = {}
    for topic, queues in obj.items():
        if topic not in topics:
            raise ValueError(f"option {name!r} names topic {topic!r}, which is not read")
        if not isinstance(queues, dict):
            raise ValueError(f"option {name!r}: topic {topic!r} needs an object of queue -> offset")
        parsed: dict[int, int] = {}
        for q, off in queues.items():
            if not (str(q).isascii() and str(q).isdigit()) or type(off) is not int or off < -2:
                raise ValueError(f"option {name!r}: bad entry {q!r}: {off!r} for topic {topic!r}")
            parsed[int(q)] = off
        out[topic] = parsed
    return out


class RaftmqPartition(InputPartition):
    """One Spark task: a :class:`Split` (consecutive pieces of one queue)."""

    def __init__(self, split: Split) -> None:
        super().__init__(split)
        self.split = split


class _Base:
    def __init__(self, options: _Options, schema: StructType) -> None:
        self.options = options
        self.with_headers = options.include_headers

    def _manifests(self) -> dict[str, dict[str, Any]]:
        client = BrokerClient(self.options.brokers)
        try:
            return {t: manifest(client, t) for t in self.options.topics}
        finally:
            client.close()

    def _resolve(
        self, spec: str | dict[str, dict[int, int]], manifests: dict[str, dict[str, Any]], default: int
    ) -> dict[str, dict[str, int]]:
        """Concrete offsets per topic and queue for 'earliest'/'latest'/JSON."""
        out: dict[str, dict[str, int]] = {}
        for topic, m in manifests.items():
            given = spec.get(topic, {}) if isinstance(spec, dict) else {}
            word = spec if isinstance(spec, str) else None
            per: dict[str, int] = {}
            for info in m["queues"]:
                q = info["queue"]
                value = (
                    given.get(q, default) if word is None else (EARLIEST if word == "earliest" else LATEST)
                )
                if value == EARLIEST:
                    value = info["low_offset"]
                elif value == LATEST:
                    value = info["high_offset"]
                per[str(q)] = value
            out[topic] = per
        return out

    def _starting(self, manifests: dict[str, dict[str, Any]], default: int) -> dict[str, dict[str, int]]:
        o = self.options
        if o.starting_timestamp is not None:
            client = BrokerClient(o.brokers)
            try:
                return {
                    t: {
                        str(info["queue"]): offset_for_timestamp(
                            client, t, info, o.starting_timestamp, o.verify
                        )
                        for info in m["queues"]
                    }
                    for t, m in manifests.items()
                }
            finally:
                client.close()
        return self._resolve(_parse_offsets(o.starting, o.topics, "startingOffsets"), manifests, default)

    def _plan(
        self,
        start: dict[str, dict[str, int]],
        end: dict[str, dict[str, int]],
        manifests: dict[str, dict[str, Any]],
    ) -> list[RaftmqPartition]:
        o = self.options
        splits: list[Split] = []
        for topic, m in manifests.items():
            for info in m["queues"]:
                q = str(info["queue"])
                if q not in end.get(topic, {}):
                    continue
                stop = min(end[topic][q], info["high_offset"])
                first = start.get(topic, {}).get(q, info["low_offset"])
                if first >= stop:
                    continue
                first = check_start(
                    topic, info["queue"], first, info["low_offset"], stop, o.fail_on_data_loss
                )
                if first >= stop:
                    continue
                splits += plan_queue(topic, info, first, stop, o.rows_per_split, o.tail_rows_per_split)
        splits = split_further(splits, o.min_partitions)
        return [RaftmqPartition(s) for s in splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RaftmqPartition)
        split = partition.split
        o = self.options
        batches = read_split(split, o.brokers, o.fail_on_data_loss, o.verify)
        if self.with_headers:
            yield from batches
            return
        for batch in batches:
            yield batch.drop_columns(["headers"])


class RaftmqBatchReader(_Base, DataSourceReader):
    def partitions(self) -> Sequence[InputPartition]:
        manifests = self._manifests()
        start = self._starting(manifests, EARLIEST)
        end = self._resolve(
            _parse_offsets(self.options.ending, self.options.topics, "endingOffsets"), manifests, LATEST
        )
        return self._plan(start, end, manifests)


class RaftmqStreamReader(_Base, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"<topic>": {"<queue>": next offset}}``; each micro-batch reads
    ``[start, end)`` per queue, so a replayed batch reads exactly the same rows."""

    def __init__(self, options: _Options, schema: StructType) -> None:
        super().__init__(options, schema)
        self._initial: dict[str, dict[str, int]] | None = None
        self._target: dict[str, dict[str, int]] | None = None
        self._latest: dict[str, dict[str, int]] | None = None

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:  # Spark calls this twice for a new query: answer the same
            self._initial = self._starting(self._manifests(), LATEST)
        return self._initial

    def _highs(self) -> dict[str, dict[str, int]]:
        highs = {
            t: {str(i["queue"]): i["high_offset"] for i in m["queues"]} for t, m in self._manifests().items()
        }
        if self._target is not None:
            highs = {
                t: {q: min(v, self._target.get(t, {}).get(q, v)) for q, v in qs.items()}
                for t, qs in highs.items()
            }
        self._latest = highs
        return highs

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._highs()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        highs = self._highs()
        end = {t: {q: max(h, start.get(t, {}).get(q, h)) for q, h in qs.items()} for t, qs in highs.items()}
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(start, end, int(limit.max_rows))
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if start == end:
            return []
        return self._plan(start, end, self._manifests())

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the brokers keep the data; progress lives in Spark's checkpoint."""


class RaftmqDataSource(DataSource):
    """``spark.read.format("raftmq")`` / ``spark.readStream.format("raftmq")``."""

    @classmethod
    def name(cls) -> str:
        return "raftmq"

    def schema(self) -> str:
        return SCHEMA_DDL + (HEADERS_DDL if _bool(self.options, "includeHeaders", False) else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftmqBatchReader(_Options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RaftmqStreamReader(_Options(self.options, streaming=True), schema)
