"""The membership topic: one partition per slot, claims and releases as records, and
a compacted status topic beside it.

A claim record's offset is its writer's epoch on the slot; :func:`unreleased_writers`
reads back the claims that no release ended, the writers a new owner fences.

Offsets start again in a new membership topic (a new ``cluster.topic`` to change
the slot count, or the topic deleted and created again), so an epoch is stamped
on what an owner writes together with the topic's *era*: a number the shared
catalog keeps with the identity of the topic it counts for (its name and Kafka
topic id), one higher for each topic after the first
(:meth:`~lakeprop.state.catalog.JobCatalog.era`). A later topic's stamps are
therefore above every earlier topic's, and a write is never skipped as older
than rows a previous topic's owners wrote.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lakeprop.config import ClusterConfig, KafkaConfig
from lakeprop.errors import BrokerError
from lakeprop.kafka import admin, create_topic, settings

log = logging.getLogger(__name__)

STATUS_SUFFIX = ".status"
"""The status topic is the membership topic's name plus this."""


def group_id(topic: str) -> str:
    """The consumer group of the instances sharing the membership topic ``topic``."""
    return f"lakeprop.{topic}"


ERA_SPAN = 10**12
"""Stamps of one era lie below the next era's: ``era * ERA_SPAN + offset``."""


@dataclass(frozen=True)
class Claim:
    """A slot held: the epoch is the offset of the claim record in its partition, in
    the membership topic of ``era``."""

    slot: int
    epoch: int
    era: int = 0

    @property
    def stamp(self) -> int:
        """The epoch as owners' writes carry it, comparable across membership topics."""
        return self.era * ERA_SPAN + self.epoch


def topic_identity(kafka: KafkaConfig, topic: str, timeout: float = 30.0) -> str:
    """``<topic>#<Kafka topic id>``: a topic deleted and created again under the same
    name is another topic."""
    from confluent_kafka import KafkaException, TopicCollection

    client = admin(kafka)
    try:
        described = client.describe_topics(TopicCollection([topic]), request_timeout=timeout)
        found = described[topic].result(timeout)
    except KafkaException as exc:
        raise BrokerError(f"could not describe topic {topic}: {exc.args[0].str()}") from None
    return f"{topic}#{found.topic_id}"


def ensure_topics(kafka: KafkaConfig, cluster: ClusterConfig, timeout: float = 30.0) -> None:
    """Create the membership topic (one partition per slot) and its status topic."""
    topic = cluster.members_topic(kafka.topic)
    create_topic(kafka, topic, cluster.slots, {"retention.ms": str(7 * 86_400_000)}, timeout)
    create_topic(
        kafka,
        topic + STATUS_SUFFIX,
        1,
        {"cleanup.policy": "compact", "retention.ms": str(7 * 86_400_000)},
        timeout,
    )
    _check_partitions(kafka, topic, cluster.slots, timeout)


def _check_partitions(kafka: KafkaConfig, topic: str, slots: int, timeout: float) -> None:
    found = admin(kafka).list_topics(topic, timeout=timeout).topics.get(topic)
    count = len(found.partitions) if found is not None and found.error is None else 0
    if count != slots:
        raise BrokerError(
            f"membership topic {topic} has {count} partition(s) but cluster.slots is {slots}; "
            "every instance must use the same slots, and the topic must have one partition per "
            "slot (give a new cluster.topic to change the number of slots)"
        )


def append_to_slots(
    producer: Any,
    topic: str,
    key: str,
    slots: Iterable[int],
    record: dict[str, Any],
    timeout: float,
) -> dict[int, int]:
    """Append ``record`` to the partition of each slot and wait for them: the offset
    each got (a slot whose record the broker did not confirm is missing)."""
    offsets: dict[int, int] = {}

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            offsets[message.partition()] = message.offset()
        else:
            log.warning("record of slot %s not written: %s", message.partition(), error)

    payload = json.dumps(record).encode()
    sent = False
    for slot in slots:
        producer.produce(topic, payload, key=key.encode(), partition=slot, on_delivery=delivered)
        sent = True
    if sent:
        producer.flush(timeout)
    return offsets


def unreleased_writers(
    kafka: KafkaConfig,
    topic: str,
    claims: Iterable[Claim],
    timeout: float = 10.0,
    window: int = 64,
) -> list[str]:
    """Writers of the claims on each claimed slot after its last release and before
    the claim (within the ``window`` records before it), read in one pass."""
    from confluent_kafka import Consumer, TopicPartition

    wanted = {c.slot: c.epoch for c in claims if c.epoch > 0}
    if not wanted:
        return []
    consumer = Consumer(
        settings(
            kafka, fixed={"group.id": "lakeprop-membership-reader", "enable.auto.commit": False}
        )
    )
    records: dict[int, list[dict[str, Any]]] = {slot: [] for slot in wanted}
    try:
        starts = {}
        for slot, epoch in wanted.items():
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, slot), timeout=timeout)
            starts[slot] = max(low, epoch - window)
        consumer.assign([TopicPartition(topic, slot, start) for slot, start in starts.items()])
        position = dict(starts)
        deadline = time.monotonic() + timeout
        while any(position[s] < wanted[s] for s in wanted):
            message = consumer.poll(max(0.0, deadline - time.monotonic()))
            if message is None:
                raise BrokerError(f"could not read the claims of slots {sorted(wanted)} of {topic}")
            if message.error() is not None:
                continue
            partition, offset, value = message.partition(), message.offset() or 0, message.value()
            if partition is None or partition not in wanted:
                continue
            slot = partition
            position[slot] = offset + 1
            if offset < wanted[slot] and value:
                records[slot].append(json.loads(value))
    finally:
        consumer.close()
    return _unreleased(records.values())


def _unreleased(per_slot: Iterable[list[dict[str, Any]]]) -> list[str]:
    """The claims' writers after each slot's last release by an owner that had fenced
    its own predecessors. A release by one that had not (it gave the slot up before
    taking it over) ends only its own writer's claim: the claims before it may
    still be live."""
    writers: set[str] = set()
    for slot_records in per_slot:
        done: set[str] = set()
        for record in reversed(slot_records):
            writer = str(record.get("writer") or "")
            if record.get("kind") == "release":
                if record.get("adopted", True):
                    break
                done.add(writer)
            elif record.get("kind") == "claim" and writer and writer not in done:
                writers.add(writer)
    return sorted(writers)
