"""Producing raw change log messages (bypassing the client's validation), and
reading a whole topic back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def produce_raw(
    bootstrap_servers: str,
    topic: str,
    messages: list[tuple[bytes | None, bytes | None]],
    partition: int = 0,
    **config: Any,
) -> list[tuple[int, int]]:
    """Produce raw (key, value) messages in order, bypassing the client's validation.

    Returns (partition, offset) of each. One partition (``partition``) is forced so
    the offsets say which message is which. ``config`` adds producer properties
    (dots as in Kafka).
    """
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, **config}
    )
    coordinates: list[Any] = [None] * len(messages)

    def recorder(i: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            coordinates[i] = (msg.partition(), msg.offset())

        return on_delivery

    for i, (key, value) in enumerate(messages):
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=recorder(i))
    assert producer.flush(30) == 0
    return coordinates


def read_topic(bootstrap_servers: str, topic: str) -> list[tuple[int, bytes | None, bytes]]:
    """Every message in ``topic`` now: (partition, key, value), by partition then offset.

    Reads each partition up to its end offset when called, so it returns as soon
    as it has them all instead of waiting for the topic to stay quiet.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "lakeprop-tests-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        assert metadata.error is None, metadata.error
        ends: dict[int, int] = {}
        starts: list[TopicPartition] = []
        for partition in sorted(metadata.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 30)
            if high > low:
                ends[partition] = high
                starts.append(TopicPartition(topic, partition, low))
        consumer.assign(starts)
        messages: list[tuple[int, int, bytes | None, bytes]] = []
        position = {p: -1 for p in ends}
        deadline = time.monotonic() + 60
        while any(position[p] + 1 < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"{topic}: read up to {position}, ends {ends}"
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            position[partition] = offset
            messages.append((partition, offset, message.key(), message.value() or b""))
        return [(p, key, value) for p, _, key, value in sorted(messages, key=lambda m: m[:2])]
    finally:
        consumer.close()
