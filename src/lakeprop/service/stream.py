"""The streaming query: the change log on Kafka, plus the service's wake topic.

Spark runs a micro-batch only when a source has new data, so a query over the
change log alone would never run while nobody registers a job, and trigger
selection would stall. The query reads a second topic, the wake topic, to which
the service writes when it has work (:mod:`lakeprop.service.wake`): a commit
notice, a finished iteration, a due tick. Spark asks the broker for both topics'
end offsets every poll (an offset request, no micro-batch), so a service with
nothing due runs no micro-batch at all. The sources of a query are fixed by its
checkpoint; a checkpoint of the earlier tick source is carried over
(:mod:`lakeprop.service.carry_over`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from lakeprop.changelog import LogRecord
from lakeprop.config import AppConfig, KafkaConfig
from lakeprop.kafka import spark_options
from lakeprop.tables.hadoop import Files

RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "is_wake")

BatchHandler = Callable[[DataFrame, int], None]

Offsets = Mapping[int, int]
"""A topic's offsets by partition: the next offset to read in each."""


def changelog_source(
    spark: SparkSession, kafka: KafkaConfig, starting: Offsets | None = None
) -> DataFrame:
    """The change log topic as a stream of Kafka records; ``starting`` (every
    partition's next offset) replaces ``kafka.starting_offsets`` for a new checkpoint."""
    start = kafka.starting_offsets
    if starting is not None:
        start = json.dumps({kafka.topic: {str(p): o for p, o in sorted(starting.items())}})
    reader = (
        spark.readStream.format("kafka")
        .options(**spark_options(kafka))
        .option("subscribe", kafka.topic)
        .option("startingOffsets", start)
        .option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    )
    for name, value in kafka.source_options.items():
        reader = reader.option(name, value)
    return reader.load().select(*RECORD_COLUMNS[:-1], F.lit(False).alias("is_wake"))


def wake_source(spark: SparkSession, kafka: KafkaConfig, topic: str) -> DataFrame:
    """The wake topic's one partition as a stream shaped like the change log, with
    ``is_wake`` set. Wake records carry nothing and expire: none is ever missed
    (the first run reads the topic from its start), and one expired while the
    service was down is no loss, which ``failOnDataLoss`` is told."""
    reader = spark.readStream.format("kafka").options(**spark_options(kafka))
    for name, value in kafka.source_options.items():
        reader = reader.option(name, value)
    return (
        reader.option("assign", json.dumps({topic: [0]}))
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "false")
        .load()
        .select(*RECORD_COLUMNS[:-1], F.lit(True).alias("is_wake"))
    )


def start_query(
    spark: SparkSession,
    config: AppConfig,
    handler: BatchHandler,
    wake_topic: str,
    *,
    available_now: bool = False,
    starting: Offsets | None = None,
) -> StreamingQuery:
    """Start the query; ``available_now`` processes what is there and stops (tests,
    catch-up). The trigger polls every :attr:`~lakeprop.config.AppConfig.poll`."""
    writer = (
        changelog_source(spark, config.kafka, starting)
        .unionByName(wake_source(spark, config.kafka, wake_topic))
        .writeStream.queryName(config.query_name)
        .option("checkpointLocation", config.state.checkpoint_location)
        .foreachBatch(handler)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(config.poll * 1000)} milliseconds")
    return writer.start()


def log_records(batch: DataFrame) -> list[LogRecord]:
    """The change log messages of a micro-batch (wake records left out), in log order."""
    rows = (
        batch.where(~F.col("is_wake"))
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
    collecting it costs: every micro-batch a wake-up started. One small file read a tick
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
