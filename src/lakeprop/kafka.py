"""The service's Kafka clients: one place for how they reach the change log's broker.

Every client (the change log's producer, the notices and membership consumers,
the admin client that creates topics, the Spark source) gets
``bootstrap.servers`` and the user's ``kafka.options`` (security, SASL) from
:func:`settings`, so a setting given once reaches them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeprop.config import KafkaConfig
from lakeprop.errors import BrokerError


def settings(
    kafka: KafkaConfig,
    defaults: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A client's settings: ``defaults``, then the brokers and ``kafka.options`` (the
    user's, which may override a default), then ``fixed`` (what the client needs)."""
    return {
        **(defaults or {}),
        "bootstrap.servers": kafka.bootstrap_servers,
        **kafka.options,
        **(fixed or {}),
    }


def spark_options(kafka: KafkaConfig) -> dict[str, str]:
    """The same settings as options of Spark's Kafka source (``kafka.``-prefixed)."""
    return {f"kafka.{name}": str(value) for name, value in settings(kafka).items()}


def admin(kafka: KafkaConfig) -> Any:
    """An admin client of the change log's broker."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(settings(kafka))


def create_topic(
    kafka: KafkaConfig, name: str, partitions: int, config: Mapping[str, str], timeout: float
) -> None:
    """Create topic ``name`` on the change log's broker unless it exists."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.cimpl import NewTopic

    topic = NewTopic(name, num_partitions=partitions, replication_factor=-1, config=dict(config))
    client = admin(kafka)  # held while the future resolves: a dropped client cancels it
    try:
        client.create_topics([topic], request_timeout=timeout)[name].result(timeout)
    except KafkaException as exc:
        error = exc.args[0]
        if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise BrokerError(f"could not create topic {name}: {error.str()}") from None


def partitions(kafka: KafkaConfig, topic: str, timeout: float = 30.0) -> list[int]:
    """The partitions of ``topic`` on the change log's broker."""
    from confluent_kafka import KafkaException

    try:
        metadata = admin(kafka).list_topics(topic, timeout=timeout).topics[topic]
    except KafkaException as exc:
        raise BrokerError(f"could not read topic {topic}: {exc.args[0].str()}") from None
    if metadata.error is not None:
        raise BrokerError(f"could not read topic {topic}: {metadata.error.str()}")
    return sorted(metadata.partitions)
