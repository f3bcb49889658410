"""A Structured Streaming driver (run as its own process, so a test can kill it mid-batch):
raftmq topic -> Parquet sink with a checkpoint.

    python -m tests.spark.stream_driver BROKERS TOPIC OUT CHECKPOINT MODE MAX_PER_TRIGGER [DUMP]

MODE is ``continuous`` (runs until killed) or ``available-now`` (drains and stops; then, with DUMP,
writes what ``spark.read.parquet(OUT)`` sees as JSON lines, so the test needs no JVM of its own).
"""

from __future__ import annotations

import json
import sys

from tests.spark.conftest import spark_session


def main() -> None:
    brokers, topic, out, checkpoint, mode, max_per_trigger = sys.argv[1:7]
    spark = spark_session("stream-driver")
    df = (
        spark.readStream.format("raftmq")
        .option("brokers", brokers)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_per_trigger)
        .load()
    )
    writer = df.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
    if mode == "available-now":
        writer.trigger(availableNow=True).start().awaitTermination()
        if len(sys.argv) > 7:
            with open(sys.argv[7], "w") as f:
                for r in spark.read.parquet(out).select("partition", "offset", "value").collect():
                    f.write(json.dumps([r.partition, r.offset, r.value.decode()]) + "\n")
    else:
        writer.trigger(processingTime="100 milliseconds").start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
