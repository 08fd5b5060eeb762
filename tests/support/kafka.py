"""Producing raw change log messages (bypassing the client's validation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def produce_raw(
    bootstrap_servers: str,
    topic: str,
    messages: list[tuple[bytes | None, bytes | None]],
    **config: Any,
) -> list[tuple[int, int]]:
    """Produce raw (key, value) messages in order, bypassing the client's validation.

    Returns (partition, offset) of each. One partition is forced so the offsets say
    which message is which. ``config`` adds producer properties (dots as in Kafka).
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
        producer.produce(topic, key=key, value=value, partition=0, on_delivery=recorder(i))
    assert producer.flush(30) == 0
    return coordinates
