"""``kafka_changefeed``: publish the changes to a Kafka topic as JSON.

Options::

    {"topic": "orders.changes",               # required
     "bootstrap_servers": "broker:9092",      # required
     "primary_key": ["order_id"]}             # required

Each change is one message. Key: the primary key as a JSON object
(``{"order_id": 7}``). Value::

    {"op": "insert" | "update" | "delete" | "snapshot",
     "version": 12,                 # Delta commit version of the change
     "commit_timestamp": "...",     # null for snapshot rows
     "row": {...}}                  # the row after the change (before it, for a delete)

Messages of one key are published in commit-version order: rows are
partitioned by key and sorted by version before Spark's Kafka sink (with an
idempotent producer) writes them, and Kafka keeps the order of one key within
its partition.

A small tail runs in the driver (``engine.small_iterations = "auto"``): the same
messages (:mod:`lakeprop.consumers.feed_messages`), in the same order per key,
sent by an idempotent librdkafka producer that picks a key's partition as Java's
producer does (murmur2), so a key's messages stay in one partition whichever path
published them. It needs the ``confluent-kafka`` package (``lakeprop[client]``);
a column type whose JSON only Spark's writer writes keeps the job on Spark.

**Delivery is at least once.** After a crash or a retry a range may be
published again, so readers de-duplicate on ``(version, key, op)``; the
sequence of distinct changes of each key is exact and in order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from lakeprop.consumers import feed_messages
from lakeprop.consumers.base import Consumer
from lakeprop.consumers.options import identifier_list, reject_unknown_options
from lakeprop.errors import DeliveryError, InvalidConsumerOptionsError, InvalidIdentifierError

if TYPE_CHECKING:
    import pyarrow as pa

_ALLOWED = {"topic", "bootstrap_servers", "primary_key"}
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


class KafkaChangefeedConsumer(Consumer):
    """Every change as a JSON message on a Kafka topic, in version order per key."""

    table_target = False  # a topic, not a table
    native = True

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        reject_unknown_options("kafka_changefeed", options, _ALLOWED)
        topic = options.get("topic")
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
            raise InvalidConsumerOptionsError(
                f"kafka_changefeed option topic must be a Kafka topic name, got {topic!r}"
            )
        servers = options.get("bootstrap_servers")
        if not isinstance(servers, str) or not servers.strip():
            raise InvalidConsumerOptionsError(
                "kafka_changefeed option bootstrap_servers is required"
            )
        try:
            key = identifier_list(options.get("primary_key"), "kafka_changefeed", "primary_key")
        except InvalidIdentifierError as exc:
            raise InvalidConsumerOptionsError(f"kafka_changefeed: {exc}") from None
        return {"topic": topic, "bootstrap_servers": servers, "primary_key": key}

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return list(options["primary_key"])

    def _publish(self, data: DataFrame, op: Column, version: Column, ts: Column) -> int:
        options = self.context.options
        key_cols = list(options["primary_key"])
        row_cols = [c for c in data.columns if not c.startswith("_")]
        rank = F.when(op == "delete", 0).otherwise(1)  # in one commit: delete before re-insert
        messages = data.select(
            F.to_json(F.struct(*[F.col(k) for k in key_cols])).alias("key"),
            F.to_json(
                F.struct(
                    op.alias("op"),
                    version.alias("version"),
                    ts.cast("string").alias("commit_timestamp"),
                    F.struct(*[F.col(c) for c in row_cols]).alias("row"),
                )
            ).alias("value"),
            version.alias("_version"),
            rank.alias("_rank"),
        )
        ordered = messages.repartition("key").sortWithinPartitions("key", "_version", "_rank")
        (
            ordered.select("key", "value")
            .write.format("kafka")
            .option("kafka.bootstrap.servers", options["bootstrap_servers"])
            .option("kafka.enable.idempotence", "true")
            .option("kafka.acks", "all")
            .option("topic", options["topic"])
            .save()
        )
        return int(data.count())

    def snapshot(self, rows: DataFrame, version: int) -> int:
        return self._publish(
            rows, F.lit("snapshot"), F.lit(version).cast("long"), F.lit(None).cast("timestamp")
        )

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        """Per commit and key: an insert, a delete, or an update when both of an
        update's images carry the key. An update that changed a key column is a
        delete of the old key (its pre-image) and an insert of the new one."""
        kind = F.col("_change_type")
        commit = Window.partitionBy(*self.context.options["primary_key"], "_commit_version")
        pre = F.max((kind == "update_preimage").cast("int")).over(commit) == 1
        post = F.max((kind == "update_postimage").cast("int")).over(commit) == 1
        op = (
            F.when(kind.isin("insert", "delete"), kind)
            .when((kind == "update_postimage") & pre, F.lit("update"))
            .when(kind == "update_postimage", F.lit("insert"))
            .when((kind == "update_preimage") & ~post, F.lit("delete"))
        )
        data = changes.withColumn("_op", op).where(F.col("_op").isNotNull())
        return self._publish(
            data, F.col("_op"), F.col("_commit_version"), F.col("_commit_timestamp")
        )

    commit_timestamps = True  # each message carries its commit's
    native_snapshot = True

    def why_not_native(self, fields: Sequence[tuple[str, Any]]) -> str | None:
        """Why the source's (name, delta-rs type) columns, or the session's settings,
        keep this job on Spark."""
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            return "kafka_changefeed publishes natively with confluent-kafka (lakeprop[client])"
        spark = self.context.spark
        if getattr(spark, "_jvm", None) is None:  # Spark Connect: no JVM to write numbers
            return "kafka_changefeed writes numbers natively with the driver's JVM"
        return feed_messages.unsupported(
            fields, list(self.context.options["primary_key"])
        ) or feed_messages.unsupported_settings(
            self._time_zone(), lambda name, default: str(spark.conf.get(name, default))
        )

    def _time_zone(self) -> str:
        # no default given: Spark's own (the JVM's zone) when the session sets none
        return str(self.context.spark.conf.get("spark.sql.session.timeZone") or "UTC")

    def _numbers(self, kind: str, values: list[float]) -> list[str]:
        """The driver JVM's ``Double.toString`` (``Float.toString``) of each value,
        which Spark's JSON writer calls: a few py4j calls for all of them."""
        import struct

        jvm = self.context.spark._jvm
        gateway = self.context.spark.sparkContext._gateway
        assert jvm is not None and gateway is not None
        double = kind == "double"
        packed = struct.pack(f">{len(values)}{'d' if double else 'f'}", *values)
        buffer = jvm.java.nio.ByteBuffer.wrap(bytearray(packed))
        array = gateway.new_array(jvm.double if double else jvm.float, len(values))
        (buffer.asDoubleBuffer() if double else buffer.asFloatBuffer()).get(array)
        text = str(jvm.java.util.Arrays.toString(array))
        return text[1:-1].split(", ")

    def apply_changes_native(self, changes: pa.Table, from_version: int, to_version: int) -> int:
        """The same messages, built in the driver and sent by an idempotent producer
        that partitions by key as Java's does; every one confirmed before it returns."""
        if changes.num_rows == 0:
            return 0
        options = self.context.options
        kinds = feed_messages.kinds_of_arrow(changes.schema)
        encoder = feed_messages.Encoder(kinds, self._time_zone(), self._numbers)
        return self._send(
            feed_messages.messages(changes.to_pylist(), list(options["primary_key"]), encoder)
        )

    def snapshot_native(self, rows: pa.Table, version: int) -> int:
        """The snapshot's messages, built and sent as a tail's are."""
        if rows.num_rows == 0:
            return 0
        options = self.context.options
        encoder = feed_messages.Encoder(
            feed_messages.kinds_of_arrow(rows.schema), self._time_zone(), self._numbers
        )
        return self._send(
            feed_messages.snapshot_messages(
                rows.to_pylist(), list(options["primary_key"]), version, encoder
            )
        )

    def _send(self, built: list[tuple[str, str]]) -> int:
        """Send the messages, every one confirmed (or a :class:`DeliveryError`)."""
        from confluent_kafka import Producer

        options = self.context.options
        producer = Producer(
            {
                "bootstrap.servers": options["bootstrap_servers"],
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",  # Java's: a key's partition on both paths
                "linger.ms": 5,
                # every message has its outcome by the time the flush below gives up
                "message.timeout.ms": int(DELIVERY_TIMEOUT * 1000) - 5000,
            }
        )
        failed: list[str] = []

        def report(error: Any, _message: Any) -> None:
            if error is not None:
                failed.append(str(error))

        try:
            for key, value in built:
                while True:
                    try:
                        producer.produce(
                            options["topic"], value.encode(), key.encode(), on_delivery=report
                        )
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.5)
        except Exception as exc:  # a message the client refuses (too large, say)
            producer.purge()  # what is still queued goes nowhere
            raise DeliveryError(f"kafka_changefeed: {options['topic']}: {exc}") from exc
        unsent = producer.flush(DELIVERY_TIMEOUT)
        if unsent or failed:
            producer.purge()  # what is still queued goes nowhere
            raise DeliveryError(
                f"kafka_changefeed: {unsent} message(s) to {options['topic']} unconfirmed "
                f"after {DELIVERY_TIMEOUT:.0f}s, {len(failed)} failed"
                + (f" ({failed[0]})" if failed else "")
                + "; the range is published again (delivery is at least once)"
            )
        return len(built)


DELIVERY_TIMEOUT = 60.0
"""Seconds the native path waits for the broker to confirm a range's messages."""
