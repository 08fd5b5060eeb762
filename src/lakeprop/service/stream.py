"""The streaming query: the change log on Kafka, plus a tick on every trigger.

Spark does not call ``foreachBatch`` when a micro-batch has no new data, and a
quiet change log would then stall trigger selection. A ``rate-micro-batch``
source unioned with the Kafka source yields exactly one tick row per
micro-batch, so the query runs every trigger interval whatever the log does.
The sources of a query are fixed by its checkpoint, which is why the tick is
part of the query from the first run on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from lakeprop.changelog import LogRecord
from lakeprop.config import AppConfig, KafkaConfig
from lakeprop.kafka import spark_options
from lakeprop.tables.hadoop import Files

RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "is_tick")

BatchHandler = Callable[[DataFrame, int], None]


def changelog_source(spark: SparkSession, kafka: KafkaConfig) -> DataFrame:
    """The change log topic as a stream of Kafka records."""
    reader = (
        spark.readStream.format("kafka")
        .options(**spark_options(kafka))
        .option("subscribe", kafka.topic)
        .option("startingOffsets", kafka.starting_offsets)
        .option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    )
    for name, value in kafka.source_options.items():
        reader = reader.option(name, value)
    return reader.load().select(
        "key", "value", "topic", "partition", "offset", "timestamp", F.lit(False).alias("is_tick")
    )


def tick_source(spark: SparkSession) -> DataFrame:
    """One row per micro-batch, shaped like a Kafka record with ``is_tick`` set."""
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1)
        .load()
        .select(
            F.lit(None).cast("binary").alias("key"),
            F.lit(None).cast("binary").alias("value"),
            F.lit(None).cast("string").alias("topic"),
            F.lit(None).cast("int").alias("partition"),
            F.lit(None).cast("long").alias("offset"),
            F.col("timestamp"),
            F.lit(True).alias("is_tick"),
        )
    )


def start_query(
    spark: SparkSession,
    config: AppConfig,
    handler: BatchHandler,
    *,
    available_now: bool = False,
) -> StreamingQuery:
    """Start the query; ``available_now`` processes what is there and stops (tests, catch-up)."""
    writer = (
        changelog_source(spark, config.kafka)
        .unionByName(tick_source(spark))
        .writeStream.queryName(config.query_name)
        .option("checkpointLocation", config.state.checkpoint_location)
        .foreachBatch(handler)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.tick_interval} seconds")
    return writer.start()


def log_records(batch: DataFrame) -> list[LogRecord]:
    """The change log messages of a micro-batch (ticks left out), in log order."""
    rows = (
        batch.where(~F.col("is_tick"))
        .select("topic", "partition", "offset", "timestamp", "key", "value")
        .collect()
    )
    records = [
        LogRecord(
            topic=r["topic"],
            partition=r["partition"],
            offset=r["offset"],
            timestamp=r["timestamp"] or datetime.fromtimestamp(0),
            key=None if r["key"] is None else bytes(r["key"]),
            value=None if r["value"] is None else bytes(r["value"]),
        )
        for r in rows
    ]
    return sorted(records, key=lambda r: (r.topic, r.partition, r.offset))


class ChangelogOffsets:
    """Whether a micro-batch holds change log records, from the query's offset log.

    Spark writes ``<checkpoint>/offsets/<batch id>`` (each source's end offsets)
    before it runs the batch, which reads the change log from the previous
    batch's end offsets to its own. Equal change log offsets in the two files
    mean no record, and the batch is known empty without the Spark job that
    collecting it costs: most ticks of a quiet log. One small file read a tick
    (the previous batch's offsets are remembered). Anything unexpected (no file,
    a batch without a predecessor, offsets not of the change log topic) answers
    "not known empty", and the batch is collected.
    """

    def __init__(self, files: Files, checkpoint: str, topic: str) -> None:
        self.files = files
        self.directory = checkpoint.rstrip("/") + "/offsets"
        self.topic = topic
        self._seen: tuple[int, Any] | None = None

    def empty(self, batch_id: int) -> bool:
        if batch_id <= 0:
            return False
        before = self._seen[1] if self._seen and self._seen[0] == batch_id - 1 else None
        if before is None:
            before = self._offsets(batch_id - 1)
        now = self._offsets(batch_id)
        self._seen = (batch_id, now)
        return now is not None and now == before

    @property
    def latest(self) -> dict[int, int] | None:
        """The change log offsets (partition -> next offset) the latest batch read up to."""
        if self._seen is None or not isinstance(self._seen[1], dict):
            return None
        return {int(p): int(o) for p, o in self._seen[1].items()}

    def _offsets(self, batch_id: int) -> Any:
        """The change log topic's offsets in the batch's offset file, or None (also
        when the file cannot be read: the batch is collected then)."""
        try:
            lines = list(self.files.lines(f"{self.directory}/{batch_id}"))
        except Exception:  # storage trouble: not known empty
            return None
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                value = json.loads(line)
            except ValueError:
                return None
            if isinstance(value, dict) and list(value) == [self.topic]:
                offsets = value[self.topic]
                return offsets if isinstance(offsets, dict) and offsets else None
        return None
