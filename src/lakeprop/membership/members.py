"""Who is in the membership group: ``lakeprop members``.

The group coordinator says who is a member now and which slots each holds;
the status topic says what each instance last published about itself (host,
owned tables, lag, the time of its last heartbeat). A member the coordinator no
longer lists is gone, whatever its last status says.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakeprop.config import ClusterConfig, KafkaConfig
from lakeprop.errors import BrokerError
from lakeprop.kafka import admin, settings
from lakeprop.membership.slots import owned_tables, tables_by_slot
from lakeprop.membership.topics import STATUS_SUFFIX, group_id


@dataclass(frozen=True)
class Member:
    """One instance in the group, as the coordinator and its last status show it."""

    instance: str
    member_id: str
    host: str
    slots: tuple[int, ...]
    tables: tuple[str, ...] = ()
    lag: int | None = None
    """Change log messages the instance has not read yet, as it last published."""
    heartbeat: float | None = None
    """Unix time of the instance's last published status."""
    status: Mapping[str, Any] = field(default_factory=dict)


def latest_statuses(
    kafka: KafkaConfig, topic: str, timeout: float = 10.0
) -> dict[str, dict[str, Any]]:
    """The last status each instance published on the status topic ``topic``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        settings(kafka, fixed={"group.id": "lakeprop-members-reader", "enable.auto.commit": False})
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
        latest: dict[str, dict[str, Any]] = {}
        if high <= low:
            return latest
        consumer.assign([TopicPartition(topic, 0, low)])
        position = low
        while position < high:
            message = consumer.poll(timeout)
            if message is None:
                break
            position = (message.offset() or 0) + 1
            value = message.value()
            if message.error() is None and value is not None:
                record = json.loads(value)
                latest[str(record.get("instance"))] = record
        return latest
    finally:
        consumer.close()


def members(
    kafka: KafkaConfig,
    cluster: ClusterConfig,
    tables: Iterable[tuple[str, str]] = (),
    timeout: float = 10.0,
) -> list[Member]:
    """The group's members now, with the tables of ``tables`` each owns."""
    from confluent_kafka import ConsumerGroupState, KafkaException

    topic = cluster.members_topic(kafka.topic)
    client = admin(kafka)
    group = group_id(topic)
    deadline = time.monotonic() + timeout
    while True:
        try:
            future = client.describe_consumer_groups([group], request_timeout=timeout)[group]
            description = future.result(timeout)
            break
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or time.monotonic() >= deadline:
                raise BrokerError(f"could not describe group {group}: {error}") from None
            time.sleep(0.2)  # the group's coordinator is moving or loading
    if description.state in (ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN):
        return []
    try:
        statuses = latest_statuses(kafka, topic + STATUS_SUFFIX, timeout)
    except KafkaException:
        statuses = {}
    by_slot = tables_by_slot(tables, cluster.slots)
    found = []
    for m in description.members:
        slots = tuple(
            sorted(
                tp.partition
                for tp in (m.assignment.topic_partitions if m.assignment else [])
                if tp.topic == topic
            )
        )
        status = statuses.get(m.client_id, {})
        found.append(
            Member(
                instance=m.client_id,
                member_id=m.member_id,
                host=str(status.get("host") or m.host),
                slots=slots,
                tables=tuple(f"{d}.{t}" for d, t in owned_tables(slots, by_slot)),
                lag=status.get("lag"),
                heartbeat=status.get("heartbeat"),
                status=status,
            )
        )
    return sorted(found, key=lambda m: m.instance)
